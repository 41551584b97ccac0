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
    """``"success"``, ``"failure"`` (the provider failed) or ``"neutral"``."""
    if error is None:
        return "success"
    if isinstance(error, BudgetExceededError):
        return "neutral"
    status = getattr(error, "status_code", None)
    if isinstance(status, int):
        return "failure" if status >= 500 or status == 429 else "neutral"
    name = type(error).__name__
    if "Timeout" in name or "Connection" in name:
        return "failure"
    return "neutral"


def is_timeout(error: BaseException | None) -> bool:
    """A timed-out request may still have been generated, and billed, in full."""
    return error is not None and "Timeout" in type(error).__name__
