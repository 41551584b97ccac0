"""One budget pool's counters in the in-process ledger (see ``LocalLedger``).

A pool counts what its chains committed (within its rolling window, or for
its lifetime) and what their calls in flight reserved. The ledger checks and
charges it under its one lock, in the same step as the chain's own levels.
The limits are not kept here: every call brings its pool's current
:class:`PoolLevel`, so new limits (a hot reload) apply from the next call,
and a changed window re-buckets the spend it already holds.
"""

from __future__ import annotations

import math

from ._errors import TripEvent, TripReason
from ._limits import PoolLevel
from ._units import nano_to_usd
from ._window import Clock, LifetimeCounter, RollingWindow

__all__ = ["PoolAccount", "pool_denial"]

Counter = RollingWindow | LifetimeCounter


class PoolAccount:
    """Spent (windowed or lifetime) and reserved amounts of one pool."""

    __slots__ = (
        "_clock",
        "bucket_s",
        "cost",
        "forked",
        "reserved_nano",
        "reserved_steps",
        "reserved_tokens",
        "steps",
        "tokens",
        "window_s",
    )

    def __init__(self, level: PoolLevel, clock: Clock) -> None:
        self._clock = clock
        self.window_s = level.window_s
        self.bucket_s = level.bucket_s
        self.cost: Counter = self._counter()
        self.steps: Counter = self._counter()
        self.tokens: Counter = self._counter()
        self.reserved_nano = 0
        self.reserved_steps = 0
        self.reserved_tokens = 0
        self.forked: int | None = None  # the pid that inherited it across os.fork

    def _counter(self) -> Counter:
        if self.window_s is None:
            return LifetimeCounter()
        return RollingWindow(self.window_s, self.bucket_s, clock=self._clock)

    def configure(self, level: PoolLevel) -> None:
        """Follow ``level``'s window if it changed, keeping the spend held."""
        if level.window_s == self.window_s and level.bucket_s == self.bucket_s:
            return
        self.window_s, self.bucket_s = level.window_s, level.bucket_s
        self.cost, self.steps, self.tokens = (
            self._convert(c) for c in (self.cost, self.steps, self.tokens)
        )

    def _convert(self, counter: Counter) -> Counter:
        """The spend in the new window; nothing is dropped (see ``_window``)."""
        if self.window_s is None:  # all that is held, in or kept beyond the window
            return LifetimeCounter(
                counter.everything() if isinstance(counter, RollingWindow) else counter.total()
            )
        if isinstance(counter, RollingWindow):
            return counter.rebucket(self.window_s, self.bucket_s)
        # Lifetime spend has no time: it counts from now, and is kept for good.
        window = RollingWindow(self.window_s, self.bucket_s, clock=self._clock)
        window.keep_s = math.inf
        window.add(counter.total())
        return window

    def check(
        self, level: PoolLevel, chain_id: str, cost_nano: int, tokens: int, steps: int
    ) -> TripEvent | None:
        """The denial if this call does not fit the pool now, else None."""
        limits = level.limits
        now = self._clock()
        if self.forked is None and (
            (
                limits.steps is None
                or self.steps.total(now) + self.reserved_steps + steps <= limits.steps
            )
            and (
                limits.tokens is None
                or self.tokens.total(now) + self.reserved_tokens + tokens <= limits.tokens
            )
            and (
                limits.cost_nano is None
                or self.cost.total(now) + self.reserved_nano + cost_nano <= limits.cost_nano
            )
        ):
            return None
        return self._denial(level, chain_id, cost_nano, tokens, steps)

    def _denial(
        self, level: PoolLevel, chain_id: str, cost_nano: int, tokens: int, steps: int
    ) -> TripEvent | None:
        if self.forked is not None:
            return _forked(level, chain_id, self.forked)
        limits = level.limits
        denied: tuple[TripReason, int, int] | None = None  # reason, limit, observed
        sticky = False
        retry: float | None = 0.0  # when every measure that denies has room again
        for reason, limit, counter, reserved, amount in (
            ("steps", limits.steps, self.steps, self.reserved_steps, steps),
            ("tokens", limits.tokens, self.tokens, self.reserved_tokens, tokens),
            ("cost", limits.cost_nano, self.cost, self.reserved_nano, cost_nano),
        ):
            if limit is None:
                continue
            spent = counter.total()
            total = spent + reserved + amount
            if total <= limit:
                continue
            # Not even the committed spend leaves room: the chain stops. When
            # only other calls' reservations stand in the way (they settle),
            # it does not (as for a chain's own ceilings).
            hard = spent + amount > limit
            if denied is None or (hard and not sticky):
                denied = (reason, limit, total)  # type: ignore[assignment]
            sticky = sticky or hard
            needed = total - limit
            wait = counter.retry_after_s(needed) if needed <= spent else None
            retry = None if retry is None or wait is None else max(retry, wait)
        if denied is None:
            return None
        return pool_denial(level, chain_id, *denied, sticky, retry)

    def charge(self, cost_nano: int, tokens: int, steps: int) -> None:
        self.reserved_nano += cost_nano
        self.reserved_tokens += tokens
        self.reserved_steps += steps

    def settle(
        self, held_nano: int, held_tokens: int, held_steps: int, cost: int, tokens: int, steps: int
    ) -> None:
        """Drop a reservation's hold; count what it actually spent (now)."""
        self.reserved_nano -= held_nano
        self.reserved_tokens -= held_tokens
        self.reserved_steps -= held_steps
        if cost or tokens or steps:
            now = self._clock()
            if cost:
                self.cost.add(cost, now)
            if tokens:
                self.tokens.add(tokens, now)
            if steps:
                self.steps.add(steps, now)

    @property
    def idle(self) -> bool:
        """Nothing spent (in the window, or kept beyond it after a window
        change) and nothing reserved: as good as new."""
        return (
            self.forked is None
            and not (self.reserved_nano or self.reserved_steps or self.reserved_tokens)
            and not any(
                c.everything() if isinstance(c, RollingWindow) else c.total()
                for c in (self.cost, self.steps, self.tokens)
            )
        )

    def free_in_s(self) -> float | None:
        """Seconds until the oldest spend in the window leaves it; None if none will."""
        if self.window_s is None:
            return None
        waits = [
            wait
            for counter in (self.cost, self.steps, self.tokens)
            if counter.total() > 0 and (wait := counter.retry_after_s(1)) is not None
        ]
        return min(waits) if waits else None

    def totals(self) -> tuple[int, int, int]:
        """Spent within the window (or lifetime): cost_nano, steps, tokens."""
        return self.cost.total(), self.steps.total(), self.tokens.total()


_UNITS = {"cost": " USD", "steps": " steps", "tokens": " tokens"}


def pool_denial(
    level: PoolLevel,
    chain_id: str,
    reason: TripReason,
    limit: int,
    observed: int,
    sticky: bool,
    retry_after_s: float | None,
) -> TripEvent:
    """The denial of a call by a pool (the same words from every ledger)."""
    shown_limit, shown = (
        (nano_to_usd(limit), nano_to_usd(observed)) if reason == "cost" else (limit, observed)
    )
    span = "in its lifetime" if level.window_s is None else f"within {level.window_s:g} s"
    message = (
        f"pool {level.name}: {reason} limit reached {span} (limit {shown_limit:g}"
        f"{_UNITS.get(reason, '')}, chain {chain_id}'s call would make it {shown:g})"
    )
    if retry_after_s is not None:
        message += f"; the window frees enough in {retry_after_s:.3g} s"
    if not sticky:
        message += "; calls in flight hold the rest, try again once they finish"
    return TripEvent(
        reason,
        float(shown_limit),
        float(shown),
        chain_id,
        message,
        sticky=sticky,
        pool=level.name,
        retry_after_s=retry_after_s,
    )


def _forked(level: PoolLevel, chain_id: str, pid: int) -> TripEvent:
    return TripEvent(
        "cost",
        0.0,
        0.0,
        chain_id,
        f"pool {level.name} was inherited across os.fork() on an in-process ledger: the "
        f"child process (pid {pid}) would get a second copy of its budget, so it admits "
        "nothing here; use veronica_otel.distributed.RedisLedger (VERONICA_REDIS_URL) to "
        "share a pool between processes",
        pool=level.name,
    )
