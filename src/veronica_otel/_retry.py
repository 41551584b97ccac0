"""RetryContainer: bounded retries with exponential backoff and jitter.

Each retry draws on the active chain's ``max_retries_total`` before it runs,
so nested containers share one budget: three layers of three retries cannot
make 64 calls when the chain allows five retries. A
:class:`BudgetExceededError` is never retried.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from ._errors import BudgetExceededError
from ._policy import PolicyContext, PolicyDecision
from ._propagation import current_context
from ._units import check_count

if TYPE_CHECKING:
    from ._context import ExecutionContext

__all__ = ["RetryContainer"]

P = ParamSpec("P")
T = TypeVar("T")

_ALLOW = PolicyDecision(True, "retry")


def _check_seconds(name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


class RetryContainer:
    """Retries a callable on ordinary exceptions, within the chain's retry budget.

    Args:
        max_retries: Retries this container allows per ``execute``.
        backoff_base: First delay in seconds; doubles per retry.
        backoff_max: Largest delay in seconds.
        jitter: Relative spread of each delay (0.25 means +-25%).
        context: The chain to draw retries from; defaults to the active one.
        sleep: Injectable sleep (``time.sleep``).
        async_sleep: Injectable coroutine sleep (``asyncio.sleep``).
    """

    policy_type = "retry"

    def __init__(
        self,
        max_retries: int = 3,
        backoff_base: float = 0.1,
        backoff_max: float = 10.0,
        jitter: float = 0.25,
        *,
        context: ExecutionContext | None = None,
        sleep: Callable[[float], object] = time.sleep,
        async_sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.max_retries = check_count("max_retries", max_retries)
        self.backoff_base = _check_seconds("backoff_base", backoff_base)
        self.backoff_max = _check_seconds("backoff_max", backoff_max)
        self.jitter = _check_seconds("jitter", jitter)
        if self.jitter > 1:
            raise ValueError(f"jitter must be <= 1, got {jitter!r}")
        self._context = context
        self._sleep = sleep
        self._async_sleep = async_sleep
        self._lock = threading.Lock()
        self.retries_made = 0

    def execute(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Call ``fn`` and retry it on failure; re-raise the last error."""
        if asyncio.iscoroutinefunction(fn):
            raise TypeError("execute() got a coroutine function; use aexecute()")
        attempt = 0
        while True:
            try:
                return fn(*args, **kwargs)
            except BudgetExceededError:
                raise
            except Exception as exc:
                if attempt >= self.max_retries:
                    raise
                attempt += 1
                self._draw_retry(exc)
                self._sleep(self._delay(attempt))

    async def aexecute(self, fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """Coroutine version of :meth:`execute`."""
        attempt = 0
        while True:
            try:
                return await fn(*args, **kwargs)
            except BudgetExceededError:
                raise
            except Exception as exc:
                if attempt >= self.max_retries:
                    raise
                attempt += 1
                self._draw_retry(exc)
                await self._async_sleep(self._delay(attempt))

    def check(self, context: PolicyContext) -> PolicyDecision:
        """Retries are drawn in :meth:`execute`; as a policy it always allows."""
        return _ALLOW

    def reset(self) -> None:
        with self._lock:
            self.retries_made = 0

    def _draw_retry(self, error: Exception) -> None:
        ctx = self._context if self._context is not None else current_context()
        if ctx is not None:
            try:
                ctx.consume_retry()
            except BudgetExceededError as denied:
                raise denied from error
        with self._lock:
            self.retries_made += 1

    def _delay(self, attempt: int) -> float:
        delay = self.backoff_base * (2 ** min(attempt - 1, 64))
        spread = self.jitter * (2 * random.random() - 1)
        # Jitter first, cap last: backoff_max is the largest delay, full stop.
        return float(min(self.backoff_max, max(0.0, delay * (1.0 + spread))))
