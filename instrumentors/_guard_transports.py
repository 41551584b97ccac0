"""The vendor guard on each transport: reading its requests, holding its replies' bodies.

One :class:`~._adapter.ProviderAdapter` per transport family, whose "SDK
method" is the transport's send (:mod:`._vendor_guard` for what it admits):

- ``httpx`` and ``httpx2`` (``HTTPTransport.handle_request``,
  ``AsyncHTTPTransport.handle_async_request``): the body is
  ``request.content`` (a streaming body is never read: it cannot be priced);
  the reply's byte stream is replaced by one that reads it as it passes;
- ``urllib3`` (``HTTPConnectionPool.urlopen``: ``requests``, ``botocore``):
  the ``body`` argument (bytes or str; a generator or a file cannot be
  priced); a preloaded reply is read at once, else its ``read``,
  ``read_chunked`` and ``read1`` are wrapped on the response object;
- ``aiohttp`` (``ClientSession._request``): ``json=`` or ``data=``; the
  reply's ``content`` is replaced by a proxy that reads what is read from it.

A reply is settled when its body ends or is closed (or the response is
collected unread: the reservation); a status of 300 or more costs nothing
(the step counts); the chain's trip cuts the body at the next chunk.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar
from urllib.parse import urlsplit

import wrapt

from veronica_otel._errors import BudgetExceededError
from veronica_otel._gc_safe import defer

from ._adapter import ProviderAdapter, Request, wrapper
from ._common import ContainedCall
from ._vendor_guard import VendorGuard
from ._wire import UNREADABLE
from ._wire_reply import ReplyReader

__all__ = ["TRANSPORTS", "GuardTransport", "install_guard", "remove_guard"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


class HTTPStatusReply(Exception):
    """A vendor answered with an HTTP status that bills nothing (for the span and breaker)."""

    def __init__(self, status_code: int) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code


class GuardTransport(ProviderAdapter):
    """The guard on one transport family; subclasses read its requests and replies."""

    provider: ClassVar[str] = "unknown"  # each request names its own (Request.provider)
    family: ClassVar[str] = ""

    def __init__(self) -> None:
        self.guard: VendorGuard | None = None  # None: the guard is off on this transport
        self.send = wrapper(self, "send", False)
        self.asend = wrapper(self, "send", True)

    # -- what a subclass reads ---------------------------------------------------

    def target(
        self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str, str, str, int | None, str]:
        """``(method, scheme, host, port, path)`` of the request (no query string)."""
        raise NotImplementedError

    def raw_body(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
        """The request body: bytes, str, a parsed JSON dict, None, or :data:`UNREADABLE`."""
        raise NotImplementedError

    def hold(self, call: ContainedCall, reply: Any, is_async: bool) -> None:
        """Read the reply's body as it passes, and settle the call when it ends."""
        raise NotImplementedError

    def status(self, reply: Any) -> int:
        raise NotImplementedError

    # -- the adapter ------------------------------------------------------------

    def screen(
        self, guard: VendorGuard, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> bool:
        """The cheap test: could this request be a vendor's API call?"""
        try:
            method, scheme, host, port, path = self.target(instance, args, kwargs)
        except Exception:
            return False  # not a request we can read: the transport will say why
        return guard.screen(method, scheme, host, port, path)

    def read_request(
        self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], method: str
    ) -> Request | None:
        guard = self.guard
        if guard is None:
            return None
        _, scheme, host, port, path = self.target(instance, args, kwargs)
        return guard.describe(scheme, host, port, path, self.raw_body(instance, args, kwargs))

    def is_stream(self, reply: Any, request: Request) -> bool:
        return True  # every body is held: usage comes with its end

    def wrap_stream(self, call: ContainedCall, reply: Any, is_async: bool) -> Any:
        status = self.status(reply)
        if status >= 300:
            call.finish(HTTPStatusReply(status), billed=False)
            return reply
        self.hold(call, reply, is_async)
        return reply


def _reader(call: ContainedCall, headers: Any, encoding: bool = True) -> ReplyReader:
    request = call.request
    reader = ReplyReader(
        call,
        headers.get("content-type") or "",
        bool(request is not None and request.stream),
        (headers.get("content-encoding") or "") if encoding else "",
    )
    reader.headers(headers.get)
    return reader


def _settle(call: ContainedCall, reader: ReplyReader, error: BaseException | None = None) -> None:
    if call.done:
        return
    reader.end()
    call.finish(error)


async def _asettle(
    call: ContainedCall, reader: ReplyReader, error: BaseException | None = None
) -> None:
    if call.done:
        return
    reader.end()
    await call.afinish(error)


def _collected(call: ContainedCall, reader: ReplyReader) -> None:
    """The response was collected unsettled: settle it where locks are safe."""
    if not call.done:
        defer(_settle, call, reader)


# -- httpx and httpx2 -----------------------------------------------------------------


class _HeldSync:
    """A response byte stream read as it passes (mixed into the library's SyncByteStream)."""

    def __init__(self, inner: Any, call: ContainedCall, reader: ReplyReader) -> None:
        self._inner = inner
        self._call = call
        self._reader = reader

    def __iter__(self) -> Iterator[bytes]:
        call, reader = self._call, self._reader
        try:
            streaming = reader.streaming
            for chunk in self._inner:
                if streaming:
                    call.check_alive()  # a trip cuts the stream here
                reader.feed_raw(chunk)
                yield chunk
        except BudgetExceededError as exc:
            _settle(call, reader, exc)
            self._inner.close()
            raise
        except GeneratorExit:
            raise  # the reader stopped early: settled on close
        except BaseException as exc:
            _settle(call, reader, exc)
            raise
        _settle(call, reader)

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            _settle(self._call, self._reader)


class _HeldAsync:
    """The async twin of :class:`_HeldSync`."""

    def __init__(self, inner: Any, call: ContainedCall, reader: ReplyReader) -> None:
        self._inner = inner
        self._call = call
        self._reader = reader

    async def __aiter__(self) -> AsyncIterator[bytes]:
        call, reader = self._call, self._reader
        try:
            streaming = reader.streaming
            async for chunk in self._inner:
                if streaming:
                    await call.ctx.aensure_active()
                reader.feed_raw(chunk)
                yield chunk
        except BudgetExceededError as exc:
            await _asettle(call, reader, exc)
            await self._inner.aclose()
            raise
        except GeneratorExit:
            raise
        except BaseException as exc:
            await _asettle(call, reader, exc)
            raise
        await _asettle(call, reader)

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            await _asettle(self._call, self._reader)


_STREAM_TYPES: dict[tuple[type, bool], type] = {}


def _stream_type(base: type, is_async: bool) -> type:
    """Our holder as a subclass of the library's byte stream (the response checks it)."""
    key = (base, is_async)
    found = _STREAM_TYPES.get(key)
    if found is None:
        mixin = _HeldAsync if is_async else _HeldSync
        found = type(f"Held{base.__name__}", (mixin, base), {})
        _STREAM_TYPES[key] = found
    return found


class HTTPXGuard(GuardTransport):
    family = "httpx"

    def target(
        self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str, str, str, int | None, str]:
        request = args[0] if args else kwargs["request"]
        url = request.url
        scheme, port = url.scheme, url.port
        if port is None:
            port = _DEFAULT_PORTS.get(scheme)
        return request.method, scheme, url.host, port, url.path

    def raw_body(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
        request = args[0] if args else kwargs["request"]
        try:
            return request.content  # RequestNotRead for a streaming body: never consumed
        except Exception:
            return UNREADABLE

    def screen(
        self, guard: VendorGuard, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> bool:
        # Every request comes here: the method first, then the URL's parsed
        # parts as stored (its public properties normalise, at ~1 us each).
        request: Any = args[0] if args else kwargs.get("request")
        try:
            if request.method != "POST":
                return False
            ref = request.url._uri_reference
            return guard.screen("POST", ref.scheme, ref.host, ref.port, ref.path)
        except Exception:
            return super().screen(guard, instance, args, kwargs)

    def status(self, reply: Any) -> int:
        return int(reply.status_code)

    def hold(self, call: ContainedCall, reply: Any, is_async: bool) -> None:
        library = sys.modules[type(reply).__module__.partition(".")[0]]
        base = library.AsyncByteStream if is_async else library.SyncByteStream
        reader = _reader(call, reply.headers)
        reply.stream = _stream_type(base, is_async)(reply.stream, call, reader)
        weakref.finalize(reply, _collected, call, reader)


# -- urllib3 (requests, botocore) -------------------------------------------------------


class URLLib3Guard(GuardTransport):
    family = "urllib3"

    def target(
        self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str, str, str, int | None, str]:
        method = args[0] if args else kwargs["method"]
        url = args[1] if len(args) > 1 else kwargs["url"]
        if url.startswith(("http://", "https://")):  # through a proxy: the whole URL
            parts = urlsplit(url)
            scheme, host, port, path = parts.scheme, parts.hostname or "", parts.port, parts.path
        else:
            scheme, host, port = instance.scheme, instance.host, instance.port
            path = url.partition("?")[0]
        if port is None:
            port = _DEFAULT_PORTS.get(scheme)
        return method, scheme, host, port, path

    def raw_body(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
        body = args[2] if len(args) > 2 else kwargs.get("body")
        if body is None or isinstance(body, (bytes, bytearray, str)):
            return body
        return UNREADABLE  # a generator or a file: reading it would consume it

    def status(self, reply: Any) -> int:
        return int(reply.status)

    def hold(self, call: ContainedCall, reply: Any, is_async: bool) -> None:
        reader = _reader(call, reply.headers)
        body = getattr(reply, "_body", None)
        if body is not None:  # preloaded (urlopen's default): already decoded
            reader.feed(body)
            _settle(call, reader)
            return
        _URLLib3Reads(reply, call, reader)
        weakref.finalize(reply, _collected, call, reader)


class _URLLib3Reads:
    """Reads what is read from an urllib3 response (decoded or not, as asked).

    Its ``read``, ``read1``, ``read_chunked``, ``release_conn`` and ``close``
    are replaced on the response object. urllib3 releases the connection from
    inside the read that reaches the end (before that read returns its
    bytes): a release during a read settles the call once they are fed.
    """

    def __init__(self, reply: Any, call: ContainedCall, reader: ReplyReader) -> None:
        self.reply, self.call, self.reader = reply, call, reader
        self._read, self._read1, self._chunked = reply.read, reply.read1, reply.read_chunked
        self._release, self._close = reply.release_conn, reply.close
        self.reading = 0
        self.ended = False
        reply.read, reply.read1, reply.read_chunked = self.read, self.read1, self.read_chunked
        reply.release_conn, reply.close = self.release_conn, self.close

    def _feed(self, data: bytes, decode_content: bool | None) -> None:
        if decode_content is None:
            decode_content = self.reply.decode_content
        if decode_content:
            self.reader.feed(data)
        else:
            self.reader.feed_raw(data)
        if self.ended and not self.reading:
            _settle(self.call, self.reader)

    def _failed(self, error: BaseException) -> None:
        self.reading = 0
        _settle(self.call, self.reader, error)
        if isinstance(error, BudgetExceededError):
            self._close()

    def _take(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self.reader.streaming:
            self.call.check_alive()  # a trip cuts the stream here
        self.reading += 1
        try:
            return fn(*args, **kwargs)
        finally:
            self.reading -= 1

    def read(self, amt: int | None = None, decode_content: bool | None = None, **kw: Any) -> bytes:
        try:
            data: bytes = self._take(self._read, amt, decode_content, **kw)
        except BaseException as exc:
            self._failed(exc)
            raise
        self._feed(data, decode_content)
        return data

    def read1(self, amt: int | None = None, decode_content: bool | None = None) -> bytes:
        try:
            data: bytes = self._take(self._read1, amt, decode_content)
        except BaseException as exc:
            self._failed(exc)
            raise
        self._feed(data, decode_content)
        return data

    def read_chunked(
        self, amt: int | None = None, decode_content: bool | None = None
    ) -> Iterator[bytes]:
        chunks = self._chunked(amt, decode_content)
        try:
            while True:
                try:
                    chunk: bytes = self._take(next, chunks)
                except StopIteration:
                    break
                self._feed(chunk, decode_content)
                yield chunk
        except GeneratorExit:
            chunks.close()
            raise
        except BaseException as exc:
            self._failed(exc)
            raise
        if self.ended:
            _settle(self.call, self.reader)

    def _done(self) -> None:
        if self.reading:
            self.ended = True  # settled when the read in progress has fed its bytes
        else:
            _settle(self.call, self.reader)

    def release_conn(self) -> None:
        try:
            self._release()
        finally:
            self._done()

    def close(self) -> None:
        try:
            self._close()
        finally:
            self._done()


# -- aiohttp ----------------------------------------------------------------------------


class AioHTTPGuard(GuardTransport):
    family = "aiohttp"

    def target(
        self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str, str, str, int | None, str]:
        method = args[0] if args else kwargs["method"]
        url = instance._build_url(args[1] if len(args) > 1 else kwargs["str_or_url"])
        scheme = url.scheme
        port = url.explicit_port
        if port is None:
            port = _DEFAULT_PORTS.get(scheme)
        return method.upper(), scheme, url.host or "", port, url.path

    def raw_body(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
        if kwargs.get("json") is not None:
            value = kwargs["json"]
            return value if isinstance(value, dict) else UNREADABLE
        data = kwargs.get("data")
        if data is None or isinstance(data, (bytes, bytearray, str)):
            return data
        return UNREADABLE  # a form, a generator, a file, a payload object

    def status(self, reply: Any) -> int:
        return int(reply.status)

    def hold(self, call: ContainedCall, reply: Any, is_async: bool) -> None:
        # aiohttp decompresses what it hands on (a session may turn that off).
        reader = _reader(call, reply.headers, encoding=False)
        reply.content = _HeldContent(reply.content, call, reader)
        release, close = reply.release, reply.close

        def _release() -> Any:
            try:
                return release()
            finally:
                _settle(call, reader)

        def _close() -> None:
            try:
                close()
            finally:
                _settle(call, reader)

        reply.release, reply.close = _release, _close
        weakref.finalize(reply, _collected, call, reader)


class _HeldContent(wrapt.ObjectProxy[Any]):
    """aiohttp's ``StreamReader``, read as it is read from; a trip cuts it."""

    def __init__(self, inner: Any, call: ContainedCall, reader: ReplyReader) -> None:
        super().__init__(inner)
        self._self_call = call
        self._self_reader = reader

    async def _self_take(self, pending: Any) -> Any:
        call, reader = self._self_call, self._self_reader
        try:
            if reader.streaming:
                await call.ctx.aensure_active()
            data = await pending
        except BaseException as exc:
            if hasattr(pending, "close"):
                pending.close()  # the read never started: no "never awaited" warning
            await _asettle(call, reader, exc)
            raise
        reader.feed(data[0] if isinstance(data, tuple) else data)
        if self.__wrapped__.at_eof():
            await _asettle(call, reader)
        return data

    async def read(self, n: int = -1) -> bytes:
        return await self._self_take(self.__wrapped__.read(n))  # type: ignore[no-any-return]

    async def readany(self) -> bytes:
        return await self._self_take(self.__wrapped__.readany())  # type: ignore[no-any-return]

    async def readline(self) -> bytes:
        return await self._self_take(self.__wrapped__.readline())  # type: ignore[no-any-return]

    async def readuntil(self, separator: bytes = b"\n") -> bytes:
        pending = self.__wrapped__.readuntil(separator)
        return await self._self_take(pending)  # type: ignore[no-any-return]

    async def readexactly(self, n: int) -> bytes:
        return await self._self_take(self.__wrapped__.readexactly(n))  # type: ignore[no-any-return]

    async def readchunk(self) -> tuple[bytes, bool]:
        return await self._self_take(self.__wrapped__.readchunk())  # type: ignore[no-any-return]

    def read_nowait(self, n: int = -1) -> bytes:
        data: bytes = self.__wrapped__.read_nowait(n)
        self._self_reader.feed(data)
        return data

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._self_lines()

    async def _self_lines(self) -> AsyncIterator[bytes]:
        while True:
            line = await self.readline()
            if not line:
                return
            yield line

    async def iter_chunked(self, n: int) -> AsyncIterator[bytes]:
        while True:
            chunk = await self.read(n)
            if not chunk:
                return
            yield chunk

    async def iter_any(self) -> AsyncIterator[bytes]:
        while True:
            chunk = await self.readany()
            if not chunk:
                return
            yield chunk

    async def iter_chunks(self) -> AsyncIterator[tuple[bytes, bool]]:
        while True:
            chunk = await self.readchunk()
            if chunk == (b"", False):
                return
            yield chunk


TRANSPORTS: dict[str, GuardTransport] = {
    "httpx": HTTPXGuard(),
    "urllib3": URLLib3Guard(),
    "aiohttp": AioHTTPGuard(),
}
_owners: dict[str, dict[str, VendorGuard]] = {family: {} for family in TRANSPORTS}


def install_guard(family: str, owner: str, guard: VendorGuard | None) -> None:
    """Turn the guard on (``guard``) or off (None) on ``family`` for ``owner``.

    Several instrumentors may want it on one family (``requests`` and
    ``urllib3`` both ride on urllib3): it stays on while one of them does,
    with the configuration of the last one to turn it on.
    """
    owners = _owners[family]
    owners.pop(owner, None)
    if guard is not None:
        owners[owner] = guard
    TRANSPORTS[family].guard = next(reversed(owners.values()), None) if owners else None


def remove_guard(family: str, owner: str) -> None:
    """``owner`` no longer wants the guard on ``family``."""
    install_guard(family, owner, None)
