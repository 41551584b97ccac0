"""One circuit breaker per endpoint (provider + model), shared by all chains.

A failing endpoint is a property of the endpoint, not of one agent run, so
the breakers live here, keyed by ``(provider, model)``, and every instrumented
call is checked against its endpoint's breaker before it is sent and feeds
its outcome back. Only provider failures count: 5xx, 429, timeouts and
connection errors. A caller's own mistakes (4xx) and our denials do not.

Defaults: 5 consecutive failures open a breaker for 60 s. Change them (or
use Redis-backed breakers shared across processes) with
:func:`configure_endpoint_breakers`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from veronica_otel._breaker import CircuitBreaker
from veronica_otel._errors import BudgetExceededError

__all__ = [
    "EndpointBreaker",
    "classify_outcome",
    "configure_endpoint_breakers",
    "endpoint_breaker",
    "never_connected",
    "raised_within",
    "reset_endpoint_breakers",
]

# Anything with the CircuitBreaker interface (the Redis-backed one too).
EndpointBreaker = CircuitBreaker
BreakerFactory = Callable[[str, str], CircuitBreaker]

_lock = threading.Lock()
_breakers: dict[tuple[str, str], CircuitBreaker] = {}
_MAX_ENDPOINTS = 4096


def _default_factory(provider: str, model: str) -> CircuitBreaker:
    return CircuitBreaker(failure_threshold=5, recovery_timeout=60.0)


_factory: BreakerFactory = _default_factory


def configure_endpoint_breakers(factory: BreakerFactory | None = None) -> None:
    """Set how endpoint breakers are made (``factory(provider, model)``); forget old ones."""
    global _factory
    with _lock:
        _factory = factory if factory is not None else _default_factory
        _breakers.clear()


def reset_endpoint_breakers() -> None:
    """Forget every endpoint breaker (tests, or after an incident)."""
    with _lock:
        _breakers.clear()


def endpoint_breaker(provider: str, model: str) -> CircuitBreaker:
    """The breaker for ``(provider, model)``, made on first use."""
    key = (provider, model)
    breaker = _breakers.get(key)
    if breaker is None:
        with _lock:
            breaker = _breakers.get(key)
            if breaker is None:
                if len(_breakers) >= _MAX_ENDPOINTS:
                    _breakers.clear()  # bounded: model names can be arbitrary strings
                breaker = _breakers[key] = _factory(provider, model)
    return breaker


def _after_fork_in_child() -> None:
    # A thread of the parent may have held these at the fork; it is gone in the child.
    global _lock
    _lock = threading.Lock()
    for breaker in _breakers.values():
        if isinstance(getattr(breaker, "_lock", None), type(_lock)):
            breaker._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def classify_outcome(error: BaseException | None) -> str:
    """``"success"``, ``"failure"`` (the provider failed) or ``"neutral"``.

    Cancellation, KeyboardInterrupt and the like (not ``Exception``) are the
    caller stopping the call, never the endpoint failing.
    """
    if error is None:
        return "success"
    if isinstance(error, BudgetExceededError) or not isinstance(error, Exception):
        return "neutral"
    status = getattr(error, "status_code", None)
    if isinstance(status, int):
        return "failure" if status >= 500 or status == 429 else "neutral"
    name = type(error).__name__
    if "Timeout" in name or "Connection" in name:
        return "failure"
    return "neutral"


# Transport errors raised before a single byte of the request left: no
# connection (refused, DNS, TLS handshake timed out), no pooled connection
# free, or a URL the client cannot speak to. Names, so that both httpx2 (the
# SDKs' default) and a legacy ``httpx`` client are recognised without importing either.
_UNSENT_ERRORS = frozenset(("ConnectError", "ConnectTimeout", "PoolTimeout", "UnsupportedProtocol"))
_TRANSPORTS = frozenset(("httpx2", "httpx", "httpcore"))


def never_connected(error: BaseException | None) -> bool:
    """True when ``error`` (or an error it was raised from) says nothing was sent."""
    seen = 0
    while error is not None and seen < 8:  # a bounded walk: cause chains can loop
        kind = type(error)
        if kind.__name__ in _UNSENT_ERRORS and kind.__module__.split(".", 1)[0] in _TRANSPORTS:
            return True
        error = error.__cause__
        seen += 1
    return False


def raised_within(error: BaseException, functions: frozenset[str]) -> bool:
    """True when ``error`` was raised inside a call of one of ``functions`` (by
    name) or inside the HTTP transport (httpx2, httpx, httpcore).

    Walks the traceback from the frame that caught it down to where it was
    raised: an interrupt or cancellation inside the SDK's send means the
    request may have left, one before it means it did not. The transport's
    own frames keep that true if the SDK renames its functions.
    """
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name in functions:
            return True
        module = frame.f_globals.get("__name__")
        if type(module) is str and module.split(".", 1)[0] in _TRANSPORTS:
            return True
        tb = tb.tb_next
    return False
