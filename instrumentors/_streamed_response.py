"""A streamed HTTP response held for an adapter that hooks below the SDK's parser.

Adapters that hook an SDK's HTTP layer (``mistralai``'s ``do_request``,
``cohere``'s ``HttpClient.stream``) get the ``httpx``/``httpx2`` response of
a streamed call before the SDK parses it. :class:`StreamedResponse` is a
``wrapt`` proxy of it: the bytes the SDK's event parser reads
(``iter_bytes`` / ``aiter_bytes``, and the lines read from them) pass through an
:class:`~._adapter.AdapterStream` one event at a time, so each event's usage
is read (``read_event(call, payload)`` for each ``data:`` line or bare JSON
line) and a trip cuts the stream at the next event even when many events came
in one read; closing the response settles the call.

:class:`StreamContext` holds an SDK's ``with client.stream(...)`` context
manager: the request is sent when it is entered, with the call marked
admitted so the transport hooks count the attempt; an HTTP error status is a
reply billed nothing; the response it yields is a :class:`StreamedResponse`.
"""

from __future__ import annotations

import codecs
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import wrapt

from veronica_otel._gc_safe import defer

from ._adapter import (
    ADMITTED,
    AdapterAsyncStream,
    AdapterStream,
    HTTPErrorReply,
    _fail,
    denial_in,
)
from ._common import ContainedCall

__all__ = ["EventReader", "StreamContext", "StreamedResponse"]

EventReader = Callable[[ContainedCall, bytes], None]


class _Lines:
    """The event payloads in a stream's bytes, read as they pass.

    ``data:`` lines of server-sent events and bare JSON lines (newline-
    delimited JSON streams); a chunk may end mid-line, the rest waits for the
    next one.
    """

    __slots__ = ("read", "rest")

    def __init__(self, read: EventReader) -> None:
        self.read = read
        self.rest = b""

    def feed(self, call: ContainedCall, chunk: Any) -> None:
        if type(chunk) is not bytes:
            return
        lines = (self.rest + chunk if self.rest else chunk).split(b"\n")
        self.rest = lines.pop()
        for line in lines:
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload and payload != b"[DONE]":
                    self.read(call, payload)
            elif line.startswith(b"{"):
                self.read(call, line)


def _split(chunk: bytes) -> list[bytes]:
    """``chunk`` cut after each event's end (a blank line, or a line of JSON)."""
    mark = b"\n\n" if b"\n\n" in chunk else b"\n"
    if chunk.count(mark) < 2:
        return [chunk]  # one event or part of one: the common case
    pieces = chunk.split(mark)
    last = pieces.pop()
    out = [piece + mark for piece in pieces]
    if last:
        out.append(last)
    return out


def _per_event(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The bytes one event at a time: the SDK's parser asks for each, so a
    trip cuts the stream at the next event even when many came in one read."""
    for chunk in chunks:
        yield from _split(chunk)


async def _aper_event(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        for piece in _split(chunk):
            yield piece


class StreamedResponse(wrapt.BaseObjectProxy[Any]):
    """A contained call's streamed response, as the SDK's event parser reads it:
    its bytes pass through the call, closing it settles the call."""

    def __init__(self, response: Any, call: ContainedCall, read_event: EventReader) -> None:
        super().__init__(response)
        self._self_call = call
        self._self_lines = _Lines(read_event)

    def iter_bytes(self, chunk_size: int | None = None) -> Any:
        pieces = _per_event(self.__wrapped__.iter_bytes(chunk_size))
        return AdapterStream(pieces, self._self_call, self._self_lines.feed)

    def aiter_bytes(self, chunk_size: int | None = None) -> Any:
        pieces = _aper_event(self.__wrapped__.aiter_bytes(chunk_size))
        return AdapterAsyncStream(pieces, self._self_call, self._self_lines.feed)

    def iter_lines(self) -> Iterator[str]:
        """Lines of the bytes above (newline-delimited JSON streams read lines)."""
        decode = codecs.getincrementaldecoder("utf-8")().decode
        rest = ""
        for chunk in self.iter_bytes():
            *lines, rest = (rest + decode(chunk)).split("\n")
            for line in lines:
                yield line.rstrip("\r")
        rest += decode(b"", final=True)
        if rest:
            yield rest

    async def aiter_lines(self) -> AsyncIterator[str]:
        decode = codecs.getincrementaldecoder("utf-8")().decode
        rest = ""
        async for chunk in self.aiter_bytes():
            *lines, rest = (rest + decode(chunk)).split("\n")
            for line in lines:
                yield line.rstrip("\r")
        rest += decode(b"", final=True)
        if rest:
            yield rest

    def close(self) -> None:
        try:
            self._self_call.finish()
        finally:
            self.__wrapped__.close()

    async def aclose(self) -> None:
        try:
            await self._self_call.afinish()
        finally:
            await self.__wrapped__.aclose()

    def __del__(self) -> None:
        call = self._self_call
        if not call.done:
            defer(call.finish)  # a finaliser must not take the ledger's lock


class StreamContext(wrapt.BaseObjectProxy[Any]):
    """An SDK's streaming context manager for a contained call (see the module docs)."""

    def __init__(self, manager: Any, call: ContainedCall, read_event: EventReader) -> None:
        super().__init__(manager)
        self._self_call = call
        self._self_read = read_event

    def _self_held(self, response: Any) -> Any:
        call = self._self_call
        status = response.status_code
        if status >= 400:  # the SDK reads the error body and raises its own error
            call.finish(HTTPErrorReply(status), billed=False)
            return response
        return StreamedResponse(response, call, self._self_read)

    def _self_failed(self, exc: BaseException) -> BaseException | None:
        _fail(self._self_call.adapter, self._self_call, exc)
        denial = denial_in(exc)
        return None if denial is None or denial is exc else denial

    def __enter__(self) -> Any:
        mark = ADMITTED.set(self._self_call)
        try:
            response = self.__wrapped__.__enter__()
        except BaseException as exc:
            denial = self._self_failed(exc)
            if denial is None:
                raise
            raise denial from exc
        finally:
            ADMITTED.reset(mark)
        return self._self_held(response)

    def __exit__(self, *exc_info: Any) -> Any:
        try:
            self._self_call.finish()  # not read to its end: the reservation
        finally:
            result = self.__wrapped__.__exit__(*exc_info)
        return result

    async def __aenter__(self) -> Any:
        call = self._self_call
        mark = ADMITTED.set(call)
        try:
            response = await self.__wrapped__.__aenter__()
        except BaseException as exc:
            call.defer_settlement()
            try:
                denial = self._self_failed(exc)
            finally:
                await call.settle_deferred()
            if denial is None:
                raise
            raise denial from exc
        finally:
            ADMITTED.reset(mark)
        call.defer_settlement()
        try:
            return self._self_held(response)
        finally:
            await call.settle_deferred()

    async def __aexit__(self, *exc_info: Any) -> Any:
        try:
            await self._self_call.afinish()
        finally:
            result = await self.__wrapped__.__aexit__(*exc_info)
        return result

    def __del__(self) -> None:
        call = self._self_call
        if not call.done and not call.sends:
            defer(_release, call)  # never entered: nothing was sent


def _release(call: ContainedCall) -> None:
    call.finish(sent=False)
