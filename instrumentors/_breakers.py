"""One circuit breaker per endpoint (provider + model), shared by all chains.

A failing endpoint is a property of the endpoint, not of one agent run, so
the breakers live here, keyed by ``(provider, model)``, and every instrumented
call is checked against its endpoint's breaker before it is sent and feeds
its outcome back. Only provider failures count: 5xx, 429, timeouts and
connection errors. A caller's own mistakes (4xx) and our denials do not.

Defaults: 5 consecutive failures open a breaker for 60 s. Change them (or
use Redis-backed breakers shared across processes) with
:func:`configure_endpoint_breakers`.

The table is bounded (model names are whatever the caller writes) without
ever forgetting a failing endpoint: a call denied at admission (an unknown
model under a cost ceiling, a spent budget) leaves no breaker behind that
still has nothing to remember, and when the table is full, breakers that
remember nothing (closed, no failures; or kept in a shared store) go first,
then closed ones counting failures, oldest first, then half-open ones with
no probe out. An OPEN breaker stays until its recovery window has passed;
if nothing else can go, the new endpoint gets a breaker of its own that is
not kept (a warning says so).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from veronica_otel._breaker import CircuitBreaker, CircuitState
from veronica_otel._errors import BudgetExceededError

__all__ = [
    "EndpointBreaker",
    "classify_outcome",
    "configure_endpoint_breakers",
    "endpoint_breaker",
    "forget_unused",
    "never_connected",
    "raised_within",
    "reset_endpoint_breakers",
]

# Anything with the CircuitBreaker interface (the Redis-backed one too).
EndpointBreaker = CircuitBreaker
BreakerFactory = Callable[[str, str], CircuitBreaker]

_logger = logging.getLogger("veronica_otel")
_lock = threading.Lock()
_breakers: dict[tuple[str, str], CircuitBreaker] = {}
_MAX_ENDPOINTS = 4096
# A full table is swept down to this, so sweeps are rare (amortised O(1) per new endpoint).
_SWEEP_TO = _MAX_ENDPOINTS * 3 // 4


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
                breaker = _factory(provider, model)
                if len(_breakers) < _MAX_ENDPOINTS or _sweep():
                    _breakers[key] = breaker
                else:
                    _logger.warning(
                        "veronica-otel: %d endpoint breakers are open; the breaker of %s/%s "
                        "is not kept",
                        len(_breakers),
                        provider,
                        model,
                    )
    return breaker


def forget_unused(provider: str, model: str, breaker: CircuitBreaker) -> None:
    """A call to ``(provider, model)`` was denied before it was sent: drop its
    breaker if it has nothing to remember (so denials of made-up models fill
    nothing)."""
    key = (provider, model)
    if _breakers.get(key) is breaker and _rank(breaker) == 0:
        with _lock:
            if _breakers.get(key) is breaker and _rank(breaker) == 0:
                del _breakers[key]


def _rank(breaker: CircuitBreaker) -> int | None:
    """Which breakers go first from a full table: 0 remembers nothing, 1 counts
    failures, 2 is half-open with no probe out; None (OPEN in its recovery
    window, or a probe out) is kept."""
    if not isinstance(breaker, CircuitBreaker):
        return 0  # store-backed: its state lives in the store
    if breaker._state is CircuitState.CLOSED:
        return 1 if breaker._failures else 0
    state = breaker.state  # OPEN reads HALF_OPEN once its recovery window has passed
    if state is CircuitState.HALF_OPEN and breaker._probe_owner is None:
        return 2
    return None


def _sweep() -> bool:
    """Make room in the full table (under ``_lock``); False when all are kept."""
    ranked = [(rank, key) for key, b in _breakers.items() if (rank := _rank(b)) is not None]
    ranked.sort(key=lambda item: item[0])  # stable: oldest first within a rank
    excess = len(_breakers) - _SWEEP_TO
    for rank, key in ranked:
        if rank and excess <= 0:
            break  # those that remember nothing always go; the rest only as needed
        del _breakers[key]
        excess -= 1
    return len(_breakers) < _MAX_ENDPOINTS


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
