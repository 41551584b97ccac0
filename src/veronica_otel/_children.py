"""Sub-agent helpers: carving a child's limits out of what its parent has left."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Protocol

from ._config import ExecutionConfig
from ._ledger import LedgerState
from ._timer import CancellationToken
from ._units import nano_to_usd, usd_to_nano

__all__ = ["carve", "min_limit", "weak_cancel", "weak_deadline"]


def min_limit(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def carve(child: ExecutionConfig, parent: ExecutionConfig, state: LedgerState) -> ExecutionConfig:
    def left(limit: int | None, used: int) -> int | None:
        return None if limit is None else max(0, limit - used)

    cost_left: float | None = None
    if parent.max_cost_usd is not None:
        cost_left = nano_to_usd(
            max(0, usd_to_nano(parent.max_cost_usd) - state.cost_nano - state.reserved_nano)
        )
    cost = (
        cost_left
        if child.max_cost_usd is None
        else (child.max_cost_usd if cost_left is None else min(child.max_cost_usd, cost_left))
    )
    return ExecutionConfig(
        max_cost_usd=cost,
        max_steps=min_limit(child.max_steps, left(parent.max_steps, state.steps)),
        max_retries_total=min_limit(
            child.max_retries_total, left(parent.max_retries_total, state.retries)
        ),
        timeout_ms=child.timeout_ms,
        max_tokens=min_limit(
            child.max_tokens, left(parent.max_tokens, state.tokens + state.reserved_tokens)
        ),
        max_repeats=min_limit(child.max_repeats, parent.max_repeats),
        max_handoffs=min_limit(child.max_handoffs, parent.max_handoffs),
        reservation_wait_s=child.reservation_wait_s,
    )


class _Timed(Protocol):
    """What a chain's timers reach (so this module does not import the context)."""

    token: CancellationToken

    def on_deadline(self) -> None: ...


def weak_deadline(ctx: _Timed) -> Callable[[], None]:
    ref = weakref.ref(ctx)

    def fire() -> None:
        target = ref()
        if target is not None:
            target.on_deadline()

    return fire


def weak_cancel(ctx: _Timed) -> Callable[[], None]:
    ref = weakref.ref(ctx)

    def fire() -> None:
        target = ref()
        if target is not None:
            target.token.cancel()

    return fire
