"""Each HTTP attempt of an adapter's call, as the transport sees it.

SDKs retry in as many ways as there are SDKs (a loop around the send, a
recursive ``request()``, tenacity, botocore's handler, urllib3's own
``Retry``), but every attempt goes through one of a few transports. While a
call an adapter admitted runs (:data:`~._adapter.ADMITTED`, with
``call.http_attempts``), these hooks report each attempt to it:

- before it is sent, :meth:`~._common.ContainedCall.note_send`: every attempt
  after the first is one of the SDK's own retries, drawn from
  ``max_retries_total`` and re-checked against trips and the deadline; a
  refusal raises :class:`BudgetExceededError` there, and nothing is sent;
- when a status line arrives, ``note_reply`` with its status (an error status
  is a reply the provider does not bill; a 2xx one generated a reply, billed
  even when a middleware that sent twice drops it; an attempt with no reply
  may have been billed);
- when the connection was never made, ``note_unsent`` (nothing left).

Hooked, each when the application imports it (nothing is imported here):
``httpx2`` and ``httpx`` (``HTTPTransport.handle_request``,
``AsyncHTTPTransport.handle_async_request``), ``urllib3``
(``HTTPConnectionPool.urlopen``: ``requests`` and ``botocore`` send through
it) and ``aiohttp`` (``ClientSession._request``: one attempt, returning once
the status line is in; whoever sends it: ``session.request``/``get``/``post``,
aiobotocore, google-genai's async client, and litellm's aiohttp transport
under its ``httpx`` client).

The same hook is the vendor guard's (:mod:`._vendor_guard`), one wrapper per
transport: a request no adapter admitted passes through after one context
variable read while the guard is off, and after one cheap test
(:meth:`~._guard_transports.GuardTransport.screen`) when it is on and the
request is not a vendor's; a vendor's is admitted by the guard, and its send
comes back through the hook, marked, to be reported as an attempt.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from types import FunctionType
from typing import Any

import wrapt

from ._adapter import ADMITTED
from ._guard_transports import TRANSPORTS, GuardTransport
from ._unwrap import is_ours

__all__ = ["ensure_attempt_hooks", "never_sent"]

_admitted = ADMITTED.get  # bound once: one C call per attempt

# Transport errors that say the attempt's connection was never made, by
# module root: nothing of the request left the process.
_UNSENT = {
    "httpx2": frozenset(("ConnectError", "ConnectTimeout", "PoolTimeout", "UnsupportedProtocol")),
    "httpx": frozenset(("ConnectError", "ConnectTimeout", "PoolTimeout", "UnsupportedProtocol")),
    "httpcore": frozenset(("ConnectError", "ConnectTimeout", "PoolTimeout", "UnsupportedProtocol")),
    "urllib3": frozenset(
        ("NewConnectionError", "NameResolutionError", "ConnectTimeoutError", "EmptyPoolError")
    ),
    "aiohttp": frozenset(
        ("ClientConnectorError", "ClientConnectorDNSError", "ClientConnectorCertificateError")
    ),
}


def never_sent(error: BaseException) -> bool:
    """True when ``error`` says the attempt's connection was never made.

    Follows urllib3's ``MaxRetryError.reason`` and ``__cause__`` a few steps.
    """
    seen = 0
    current: BaseException | None = error
    while current is not None and seen < 6:
        kind = type(current)
        names = _UNSENT.get(kind.__module__.split(".", 1)[0])
        if names is not None and kind.__name__ in names:
            return True
        reason = getattr(current, "reason", None)
        current = reason if isinstance(reason, BaseException) else current.__cause__
        seen += 1
    return False


def _status(response: Any) -> object:
    """The status of an ``httpx``/``httpx2`` (``status_code``), ``urllib3`` or
    ``aiohttp`` (``status``) response."""
    status = getattr(response, "status_code", None)
    return getattr(response, "status", None) if status is None else status


async def _areport(call: Any, wrapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    await call.anote_send()
    try:
        response = await wrapped(*args, **kwargs)
    except BaseException as exc:
        if never_sent(exc):
            call.note_unsent()
        raise
    call.note_reply(_status(response))
    return response


def _reported(wrapped: Any, hooked: Callable[..., Any], transport: Any) -> Callable[..., Any]:
    """The send the guard runs on ``transport`` (an instance): reported as an
    attempt of the call it admitted, by the hook itself (``hooked``), if any."""

    def send(*args: Any, **kwargs: Any) -> Any:
        if ADMITTED.get() is None:  # the guard let it pass
            return wrapped(*args, **kwargs)
        return hooked(transport, *args, **kwargs)

    return send


def _areported(wrapped: Any) -> Callable[..., Any]:
    async def asend(*args: Any, **kwargs: Any) -> Any:
        call = ADMITTED.get()
        if call is None:
            return await wrapped(*args, **kwargs)
        return await _areport(call, wrapped, args, kwargs)

    return asend


def _sync_hook(transport: GuardTransport, original: Any) -> Callable[..., Any]:
    """The sync transport method ``original`` with the attempt hook: a plain
    function, not a ``wrapt`` proxy, because every attempt of every call passes
    here and a ``FunctionWrapper`` builds a bound wrapper on each attribute read
    (thousands of instructions a call). It keeps ``wrapt``'s shape where it
    matters: ``__wrapped__`` is what it calls (read per call, so a wrapper under
    it can be spliced out, :mod:`._unwrap`) and it marks itself ours."""

    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = _admitted()
        method = hooked.__wrapped__  # type: ignore[attr-defined]
        if call is None or not call.http_attempts:
            wrapped = method.__get__(self, type(self))
            if call is not None:  # admitted by a layer that counts its own attempts
                return wrapped(*args, **kwargs)
            guard = transport.guard
            if guard is None or not transport.screen(guard, self, args, kwargs):
                return wrapped(*args, **kwargs)
            # Maybe a vendor request no adapter admitted: the guard admits it
            # (or lets it pass), and its send is reported as an attempt.
            return transport.send(_reported(wrapped, hooked, self), self, args, kwargs)
        # An attempt of an admitted call (the guard's too, sent back through
        # here): counted inline, with no bound method on its usual single attempt.
        if call.sends:
            call.note_send()  # a retry over the chain's limits raises here, before the send
        else:  # the first attempt: nothing to draw or re-check
            call.attempts += 1
            call.sends = 1
        try:
            if type(method) is FunctionType:  # the transport's own method: no binding
                response = method(self, *args, **kwargs)
            else:  # another wrapper under ours (wrapt): bound, as it expects
                response = method.__get__(self, type(self))(*args, **kwargs)
        except BaseException as exc:
            if never_sent(exc):
                call.note_unsent()
            raise
        call.replies += 1
        try:  # the transport's own status attribute, read directly
            status = response.status_code if by_code else response.status
        except AttributeError:  # a reply of another shape: _status reads either
            status = _status(response)
        if type(status) is int and 200 <= status < 300:
            call.billed_replies += 1
        return response

    by_code = transport.family == "httpx"  # httpx: status_code; urllib3: status
    functools.update_wrapper(hooked, original, updated=())  # __wrapped__, name, docs
    hooked.veronica_hook = transport  # type: ignore[attr-defined]  # is_ours reads it
    return hooked


def _async_hook(transport: GuardTransport, original: Any) -> Callable[..., Any]:
    """The async transport method ``original`` with the attempt hook: a plain
    coroutine function, for :func:`_sync_hook`'s reasons (no ``FunctionWrapper``
    bound on every attribute read; ``__wrapped__`` read per call, so a wrapper
    under it can be spliced out; marked ours with ``veronica_hook``)."""

    async def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = _admitted()
        method = hooked.__wrapped__  # type: ignore[attr-defined]
        # The transport's own method, or another wrapper under ours, bound as it expects.
        wrapped = method.__get__(self, type(self))
        if call is None:
            guard = transport.guard
            if guard is None or not transport.screen(guard, self, args, kwargs):
                return await wrapped(*args, **kwargs)
            return await transport.asend(_areported(wrapped), self, args, kwargs)
        if not call.http_attempts:  # admitted by a layer that counts its own attempts
            return await wrapped(*args, **kwargs)
        return await _areport(call, wrapped, args, kwargs)

    functools.update_wrapper(hooked, original, updated=())  # __wrapped__, name, docs
    hooked.veronica_hook = transport  # type: ignore[attr-defined]  # is_ours reads it
    return hooked


# (module, class, method, transport, async): one hook per transport method,
# attempts and guard, each a plain function over the method (_sync_hook,
# _async_hook) marked with its GuardTransport.
_HOOKS: tuple[tuple[str, str, str, GuardTransport, bool], ...] = (
    ("httpx2", "HTTPTransport", "handle_request", TRANSPORTS["httpx"], False),
    ("httpx2", "AsyncHTTPTransport", "handle_async_request", TRANSPORTS["httpx"], True),
    ("httpx", "HTTPTransport", "handle_request", TRANSPORTS["httpx"], False),
    ("httpx", "AsyncHTTPTransport", "handle_async_request", TRANSPORTS["httpx"], True),
    ("urllib3.connectionpool", "HTTPConnectionPool", "urlopen", TRANSPORTS["urllib3"], False),
    ("aiohttp.client", "ClientSession", "_request", TRANSPORTS["aiohttp"], True),
)
_lock = threading.Lock()
_registered = False


def _hook_module(module_name: str) -> Any:
    def install(module: Any) -> None:
        for name, owner_name, method, transport, is_async in _HOOKS:
            if name != module_name:
                continue
            owner = getattr(module, owner_name, None)
            if not isinstance(owner, type) or is_ours(owner, method, transport):
                continue
            original = inspect.getattr_static(owner, method)
            hook = _async_hook if is_async else _sync_hook
            setattr(owner, method, hook(transport, original))

    return install


def ensure_attempt_hooks() -> None:
    """Hook the transports (now if imported, else when they are); idempotent.

    Adapter instrumentors call this when instrumented; the hooks stay (they
    act only on calls an adapter admitted).
    """
    global _registered
    with _lock:
        if _registered:
            return
        _registered = True
        for module_name in dict.fromkeys(name for name, *_ in _HOOKS):
            wrapt.register_post_import_hook(_hook_module(module_name), module_name)
