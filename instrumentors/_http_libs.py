"""The HTTP libraries a Stainless-generated SDK sends through, whichever is installed.

``openai`` 3.x and ``anthropic`` 1.x and later send through ``httpx2``;
``openai`` 2.x, ``anthropic`` below 1 and ``groq`` through ``httpx``; each
accepts a client of the other library too (``http_client=``). So nothing here
imports either: the types are read from the libraries already imported (a
response of one that is not cannot exist), and their types are matched together.

- :func:`is_response`: an HTTP response of either library.
- :func:`http_errors`: the libraries' ``HTTPError`` bases (an error that ended
  a stream came from the transport, not from the user's code).
- :func:`settle_on_close`: swap a response's body for one that settles the call
  when the response is closed, whoever closes it.
- :func:`bind` and :func:`bound_call`: the call a response read after the
  SDK's ``request()`` returned (a stream, a raw response) belongs to, for the
  SDK's payload hook. The body class derives from
  the ``SyncByteStream`` / ``AsyncByteStream`` of every installed library, so
  each library's own ``isinstance`` checks on ``response.stream`` still pass.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any, NamedTuple

from veronica_otel._errors import BudgetExceededError

from ._common import ContainedCall

__all__ = ["bind", "bound_call", "http_errors", "is_response", "settle_on_close", "stream_error"]

_CALL_KEY = "veronica.call"


def bind(call: ContainedCall, response: Any) -> None:
    """Let the payload hook find ``call`` when ``response`` is read later."""
    try:
        request = response.request
    except (AttributeError, RuntimeError):  # no response, or one built without a request
        return
    request.extensions = {**request.extensions, _CALL_KEY: call}


def bound_call(response: Any) -> ContainedCall | None:
    """The call :func:`bind` bound to ``response``, if any."""
    try:
        call = response.request.extensions.get(_CALL_KEY)
    except (AttributeError, RuntimeError):
        return None
    # Any call an adapter admitted, a BoundedCall (admitted at a configured
    # bound) too; nothing else is stored under our key.
    return call if isinstance(call, ContainedCall) else None


_LIBRARIES = ("httpx2", "httpx")


class _Types(NamedTuple):
    names: tuple[str, ...]  # the libraries these are from
    responses: tuple[type, ...]
    errors: tuple[type[BaseException], ...]
    sync_streams: tuple[type, ...]
    async_streams: tuple[type, ...]
    sync_body: type
    async_body: type


_TYPES: _Types | None = None


class _SettleOnClose:
    """A response body that settles its call when the response is closed."""

    def __init__(self, inner: Any, call: ContainedCall) -> None:
        self._inner = inner
        self._call = call

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._inner)

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            # Closed from a generator's ``finally`` or an ``except`` block: the
            # exception in flight is why the stream ended.
            self._call.finish(stream_error(sys.exc_info()[1]))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)


class _ASettleOnClose:
    """The async twin of :class:`_SettleOnClose`."""

    def __init__(self, inner: Any, call: ContainedCall) -> None:
        self._inner = inner
        self._call = call

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._inner.__aiter__()  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            await self._call.afinish(stream_error(sys.exc_info()[1]))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)


def _types() -> _Types:
    """The types of the libraries imported so far (a response of one that is not
    imported cannot exist), resolved again when another one is imported."""
    global _TYPES
    modules = sys.modules
    names = tuple(name for name in _LIBRARIES if name in modules)
    if _TYPES is None or _TYPES.names != names:
        libraries = [modules[name] for name in names]
        sync_streams = tuple(lib.SyncByteStream for lib in libraries)
        async_streams = tuple(lib.AsyncByteStream for lib in libraries)
        _TYPES = _Types(
            names,
            tuple(lib.Response for lib in libraries),
            tuple(lib.HTTPError for lib in libraries),
            sync_streams,
            async_streams,
            type("_SettleOnClose", (_SettleOnClose, *sync_streams), {}),
            type("_ASettleOnClose", (_ASettleOnClose, *async_streams), {}),
        )
    return _TYPES


def is_response(value: object) -> bool:
    """Whether ``value`` is an ``httpx`` or ``httpx2`` response."""
    return isinstance(value, _types().responses)


def http_errors() -> tuple[type[BaseException], ...]:
    return _types().errors


def stream_error(exc: BaseException | None) -> BaseException | None:
    """The error a response closed under, if it ended the call (not a user's own)."""
    if isinstance(exc, (BudgetExceededError, *http_errors())):
        return exc
    if exc is None:
        return None
    # The SDK's own errors (openai.OpenAIError, groq.GroqError, ...): by module.
    root = type(exc).__module__.split(".", 1)[0]
    return exc if root in _SDK_MODULES else None


_SDK_MODULES = frozenset(("openai", "groq", "anthropic"))


def settle_on_close(call: ContainedCall, response: Any) -> None:
    """Make closing ``response`` (an open one of either library) settle ``call``."""
    types = _types()
    if not isinstance(response, types.responses):
        return
    opened: Any = response
    if opened.is_closed:
        return
    body = opened.stream
    if isinstance(body, types.sync_streams):
        opened.stream = types.sync_body(body, call)
    elif isinstance(body, types.async_streams):
        opened.stream = types.async_body(body, call)
