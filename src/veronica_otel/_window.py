"""Spend over time: a rolling-window counter, and its lifetime twin.

An amount added at time ``t`` counts while ``now < t + window_s``, then is
forgotten. Amounts are kept in buckets of ``bucket_s`` seconds (at most 1/60
of the window), so memory is bounded by the bucket count (``window_s /
bucket_s + 2`` at most) whatever the traffic. A bucket goes only once the
*newest* amount in it is older than the window: spend is never forgotten
early, and counts at most one bucket longer than exact (the resolution).

A window whose length changed (a pool named again with another window)
keeps what leaves it in one lump for as long as the longest window it has
had (``keep_s``; ``math.inf`` once it was a lifetime budget): the lump does
not count in this window, but a longer one later counts it again, so going
from ``1d`` to ``1h`` and back never drops the day's spend.

Amounts are ints (nano-USD, steps, tokens): no float sums. Not thread-safe:
the ledger calls it under its own lock.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

__all__ = [
    "BUCKETS_PER_WINDOW",
    "MAX_WINDOW_S",
    "MIN_WINDOW_S",
    "LifetimeCounter",
    "RollingWindow",
    "check_window",
]

# The coarsest resolution allowed: a window holds at least this many buckets.
BUCKETS_PER_WINDOW = 60
MIN_WINDOW_S = 1.0
MAX_WINDOW_S = 366 * 86400.0
# retry_after_s rounds up to this: the answer is never early by a float ulp.
_RETRY_RESOLUTION_S = 1e-6

Clock = Callable[[], float]


class _Bucket:
    __slots__ = ("amount", "index", "newest")

    def __init__(self, index: float, newest: float, amount: int) -> None:
        self.index = index  # its start time // bucket_s
        self.newest = newest  # the time of the newest amount in it
        self.amount = amount


def check_window(window_s: float, bucket_s: float | None = None) -> tuple[float, float]:
    """``(window_s, bucket_s)`` checked; ``bucket_s`` defaults to 1/60 of the window."""
    if isinstance(window_s, bool) or not isinstance(window_s, (int, float)):
        raise TypeError(f"window must be a number of seconds, got {window_s!r}")
    window = float(window_s)
    if not math.isfinite(window) or not MIN_WINDOW_S <= window <= MAX_WINDOW_S:
        raise ValueError(
            f"window must be between {MIN_WINDOW_S:g} second and 366 days, got {window_s!r}"
        )
    if bucket_s is None:
        return window, window / BUCKETS_PER_WINDOW
    if isinstance(bucket_s, bool) or not isinstance(bucket_s, (int, float)):
        raise TypeError(f"bucket_s must be a number of seconds, got {bucket_s!r}")
    bucket = float(bucket_s)
    if not math.isfinite(bucket) or not 0 < bucket <= window / BUCKETS_PER_WINDOW:
        raise ValueError(
            f"bucket_s must be above 0 and at most 1/{BUCKETS_PER_WINDOW} of the window "
            f"({window / BUCKETS_PER_WINDOW:g} s), got {bucket_s!r}"
        )
    return window, bucket


class RollingWindow:
    """The sum of what was added within the last ``window_s`` seconds.

    Args:
        window_s: The window's length in seconds (1 s .. 366 days).
        bucket_s: The resolution; at most (and by default) 1/60 of the window.
        clock: Seconds, never decreasing (``time.monotonic`` by default).
    """

    __slots__ = (
        "_buckets",
        "_clock",
        "_past",
        "_past_newest",
        "_total",
        "bucket_s",
        "keep_s",
        "window_s",
    )

    def __init__(
        self,
        window_s: float,
        bucket_s: float | None = None,
        *,
        clock: Clock = time.monotonic,
    ) -> None:
        self.window_s, self.bucket_s = check_window(window_s, bucket_s)
        self._clock = clock
        self._buckets: deque[_Bucket] = deque()  # oldest first
        self._total = 0
        self.keep_s = self.window_s  # how long spend is kept (longer after a window change)
        self._past = 0  # what left the window but is kept (see the module docstring)
        self._past_newest = 0.0

    def add(self, amount: int, now: float | None = None) -> None:
        """Count ``amount`` (an int >= 0) from now until it is older than the window.

        ``now`` is the clock's reading if the caller already took it.
        """
        if amount <= 0:
            return
        if now is None:
            now = self._clock()
        buckets = self._buckets
        if buckets and buckets[-1].index >= now // self.bucket_s:  # the common case, inline
            last = buckets[-1]
            last.newest = max(last.newest, now)
            last.amount += amount
        else:
            self._put(now, amount)
        self._total += amount
        if now >= buckets[0].newest + self.window_s:
            self._expire(now)

    def _put(self, at: float, amount: int) -> None:
        index = at // self.bucket_s
        buckets = self._buckets
        if buckets and buckets[-1].index >= index:
            # The newest bucket (or a clock that stepped back: fold it in; its
            # expiry only moves later, never earlier).
            last = buckets[-1]
            last.newest = max(last.newest, at)
            last.amount += amount
        else:
            buckets.append(_Bucket(index, at, amount))

    def total(self, now: float | None = None) -> int:
        """What was added within the window, as of now (or ``now``)."""
        buckets = self._buckets
        if buckets:
            if now is None:
                now = self._clock()
            if now >= buckets[0].newest + self.window_s:
                self._expire(now)
        return self._total

    def retry_after_s(self, amount_needed: int) -> float | None:
        """Seconds until the window will have freed at least ``amount_needed``.

        0.0 when nothing needs freeing; None when even emptying the window
        would not free that much. Rounded up to the microsecond, so that at
        ``now + retry_after_s`` the amount is freed (never early).
        """
        if amount_needed <= 0:
            return 0.0
        now = self._clock()
        self._expire(now)
        freed = 0
        for bucket in self._buckets:
            freed += bucket.amount
            if freed >= amount_needed:
                expires_at = bucket.newest + self.window_s
                wait = math.ceil((expires_at - now) / _RETRY_RESOLUTION_S) * _RETRY_RESOLUTION_S
                while now + wait < expires_at:  # float rounding: never answer early
                    wait = math.nextafter(wait, math.inf)
                return max(0.0, wait)
        return None

    def rebucket(
        self, window_s: float, bucket_s: float | None = None, *, keep_s: float | None = None
    ) -> RollingWindow:
        """The same spend in a window of another length (a pool's window changed).

        Each bucket keeps its newest time, so nothing is forgotten earlier than
        the new window says; what is older than the new window is kept (as
        the lump) for the longest window either had, or ``keep_s`` if longer.
        """
        other = RollingWindow(window_s, bucket_s, clock=self._clock)
        other.keep_s = max(self.keep_s, self.window_s, other.window_s, keep_s or 0.0)
        now = self._clock()
        self._expire(now)
        if self._past:
            other._put(self._past_newest, self._past)
            other._total += self._past
        for bucket in self._buckets:
            other._put(bucket.newest, bucket.amount)
            other._total += bucket.amount
        other._expire(now)
        return other

    def everything(self) -> int:
        """What the window holds and what it keeps beyond it (the lump)."""
        return self.total() + self._past

    def __len__(self) -> int:
        """Buckets held (bounded by ``window_s / bucket_s + 2``)."""
        return len(self._buckets)

    def _expire(self, now: float) -> None:
        buckets = self._buckets
        while buckets and now >= buckets[0].newest + self.window_s:
            gone = buckets.popleft()
            self._total -= gone.amount
            if self.keep_s > self.window_s:  # a window that changed: keep it in the lump
                self._past += gone.amount
                self._past_newest = max(self._past_newest, gone.newest)
        if self._past and now >= self._past_newest + self.keep_s:
            self._past = 0


class LifetimeCounter:
    """A lifetime budget's spend: a :class:`RollingWindow` that never forgets."""

    __slots__ = ("_total",)

    window_s = None

    def __init__(self, total: int = 0) -> None:
        self._total = total

    def add(self, amount: int, now: float | None = None) -> None:
        if amount > 0:
            self._total += amount

    def total(self, now: float | None = None) -> int:
        return self._total

    def retry_after_s(self, amount_needed: int) -> float | None:
        """0.0 if nothing needs freeing, else None: a lifetime budget never frees."""
        return 0.0 if amount_needed <= 0 else None
