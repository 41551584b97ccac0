"""Budget pools: budgets shared by every chain that lists them.

Usage::

    from veronica_otel import BudgetPool, ExecutionConfig, ExecutionContext

    acme = BudgetPool("tenant:acme", max_cost_usd=50.0, window="1d")
    alice = BudgetPool("user:alice", max_cost_usd=5.0, window="1h")
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0), pools=[acme, alice]):
        ...  # every call is reserved in the chain, acme and alice at once

A pool is a name, limits and a ledger; its counters live in the ledger, so
pools with the same name and ledger share one budget (across processes with
a ``RedisLedger``). A pool denies calls; it never trips: once its window
frees room, later chains run again.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import NamedTuple

from ._ledger import DEFAULT_LEDGER, Ledger, Limits, PoolLevel, PoolSnapshot
from ._telemetry import track_pool
from ._units import check_count, check_usd, usd_to_nano
from ._window import MAX_WINDOW_S, MIN_WINDOW_S, check_window

__all__ = [
    "MAX_POOLS_PER_CHAIN",
    "BudgetPool",
    "PoolLimits",
    "PoolRoom",
    "PoolSnapshot",
    "apool_room",
    "check_pool_name",
    "check_pools",
    "parse_window",
    "pool_limits",
    "pool_room",
]

_NAME = re.compile(r"[A-Za-z0-9_.:@/-]{1,128}")
_WINDOW = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd])\s*")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_window(window: str | float | None) -> float | None:
    """Seconds in a window ("30s", "15m", "1h", "1d", "30d", or a number of
    seconds); None for a lifetime budget. Raises ValueError/TypeError naming
    ``window``."""
    if window is None:
        return None
    if isinstance(window, str):
        match = _WINDOW.fullmatch(window)
        if match is None:
            raise ValueError(
                f"window must be a duration like '30s', '15m', '1h', '1d' or '30d' "
                f"(or a number of seconds), got {window!r}"
            )
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    elif isinstance(window, bool) or not isinstance(window, (int, float)):
        raise TypeError(f"window must be a duration string or seconds, got {window!r}")
    else:
        seconds = float(window)
    if not math.isfinite(seconds) or not MIN_WINDOW_S <= seconds <= MAX_WINDOW_S:
        raise ValueError(f"window must be between 1 second and 366 days, got {window!r}")
    return check_window(seconds)[0]


class PoolLimits(NamedTuple):
    """One pool's limits as given, and as a ledger reads them (``level``)."""

    max_cost_usd: float | None
    max_steps: int | None
    max_tokens: int | None
    level: PoolLevel


def check_pool_name(name: object) -> str:
    """``name`` if it is a valid pool name; else TypeError/ValueError naming ``name``."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__} {name!r}")
    if _NAME.fullmatch(name) is None:
        raise ValueError(f"name must be 1-128 letters, digits or -_.:@/, got {name!r}")
    return name


def pool_limits(
    name: str,
    max_cost_usd: float | None,
    max_steps: int | None,
    max_tokens: int | None,
    window: str | float | None,
) -> PoolLimits:
    """Checked limits (ValueError/TypeError naming the argument) and their PoolLevel."""
    cost = None if max_cost_usd is None else check_usd("max_cost_usd", max_cost_usd)
    steps = None if max_steps is None else check_count("max_steps", max_steps)
    tokens = None if max_tokens is None else check_count("max_tokens", max_tokens)
    window_s = parse_window(window)
    level = PoolLevel(
        name,
        Limits(cost_nano=None if cost is None else usd_to_nano(cost), steps=steps, tokens=tokens),
        window_s,
        None if window_s is None else check_window(window_s)[1],
    )
    return PoolLimits(cost, steps, tokens, level)


class BudgetPool:
    """A budget shared by every chain that lists it (same name and ledger).

    Args:
        name: 1-128 letters, digits or ``-_.:@/`` (``"tenant:acme"``).
        max_cost_usd: Ceiling on the cost committed within the window.
        max_steps: Ceiling on the calls dispatched within the window.
        max_tokens: Ceiling on the tokens (input + output) within the window.
        window: A rolling window ("30s", "15m", "1h", "1d", "30d" or seconds,
            1 s to 366 days); None (the default) for a lifetime budget.
            Spend counts from when it was committed until it is older than
            the window, at a resolution of 1/60 of the window.
        ledger: Where the pool's counters live; the process's in-process
            ledger (the one chains use by default) when omitted. A chain may
            only use pools on its own ledger.

    Invalid limits or windows raise ``ValueError`` (``TypeError`` for a
    wrong type) naming the argument. ``None`` limits are unlimited.
    """

    __slots__ = ("_ledger", "_limits", "name")

    def __init__(
        self,
        name: str,
        *,
        max_cost_usd: float | None = None,
        max_steps: int | None = None,
        max_tokens: int | None = None,
        window: str | float | None = None,
        ledger: Ledger | None = None,
    ) -> None:
        self.name = check_pool_name(name)
        self._limits = pool_limits(name, max_cost_usd, max_steps, max_tokens, window)
        if ledger is None:
            ledger = DEFAULT_LEDGER
        elif not callable(getattr(ledger, "pool_snapshot", None)):
            raise TypeError(f"ledger must be a Ledger that supports pools, got {ledger!r}")
        self._ledger: Ledger = ledger
        track_pool(self)

    def _current(self) -> PoolLimits:
        """The limits in force (a pool that follows a policy file re-reads it here)."""
        return self._limits

    @property
    def max_cost_usd(self) -> float | None:
        """Ceiling on the cost committed within the window; None: unlimited."""
        return self._current().max_cost_usd

    @property
    def max_steps(self) -> int | None:
        """Ceiling on the calls dispatched within the window; None: unlimited."""
        return self._current().max_steps

    @property
    def max_tokens(self) -> int | None:
        """Ceiling on the tokens within the window; None: unlimited."""
        return self._current().max_tokens

    @property
    def window_s(self) -> float | None:
        """The rolling window in seconds; None for a lifetime budget."""
        return self._current().level.window_s

    @property
    def ledger(self) -> Ledger:
        return self._ledger

    @property
    def level(self) -> PoolLevel:
        """What a ledger needs to know of this pool (its name, limits, window)."""
        return self._current().level

    def snapshot(self) -> PoolSnapshot:
        """What was spent within the current window and what calls in flight hold."""
        return self._ledger.pool_snapshot(self.level)

    async def asnapshot(self) -> PoolSnapshot:
        """:meth:`snapshot` for async code: a shared store is read without blocking."""
        read = getattr(self._ledger, "apool_snapshot", None)
        if read is None:
            return self.snapshot()
        found: PoolSnapshot = await read(self.level)
        return found

    def __repr__(self) -> str:
        limits = ", ".join(
            f"{key}={value!r}"
            for key, value in (
                ("max_cost_usd", self.max_cost_usd),
                ("max_steps", self.max_steps),
                ("max_tokens", self.max_tokens),
                ("window_s", self.window_s),
            )
            if value is not None
        )
        return f"BudgetPool({self.name!r}{', ' if limits else ''}{limits})"


MAX_POOLS_PER_CHAIN = 16


def check_pools(pools: object, ledger: Ledger) -> tuple[BudgetPool, ...]:
    """A chain's ``pools`` argument checked: BudgetPools on the chain's ledger.

    Raises TypeError for a wrong type, ValueError for a pool on another
    ledger (naming the pool and both ledgers), a name listed twice, or more
    than MAX_POOLS_PER_CHAIN pools.
    """
    if pools is None:
        return ()
    if isinstance(pools, (str, bytes, BudgetPool)) or not hasattr(pools, "__iter__"):
        raise TypeError(f"pools must be a list of BudgetPool, got {pools!r}")
    checked = tuple(pools)
    names: set[str] = set()
    for pool in checked:
        if not isinstance(pool, BudgetPool):
            raise TypeError(f"pools must hold BudgetPool objects, got {pool!r}")
        if pool.ledger is not ledger:
            raise ValueError(
                f"pool {pool.name!r} lives on {pool.ledger!r} but the chain's ledger is "
                f"{ledger!r}; a chain can only use pools on its own ledger "
                "(pass the same ledger= to both)"
            )
        if pool.name in names:
            raise ValueError(f"pools lists pool {pool.name!r} twice")
        names.add(pool.name)
    if len(checked) > MAX_POOLS_PER_CHAIN:
        raise ValueError(
            f"pools holds {len(checked)} pools; a chain may use at most {MAX_POOLS_PER_CHAIN}"
        )
    return checked


class PoolRoom(NamedTuple):
    """What a chain's pools have left, unreserved (None: no pool limits it)."""

    cost_nano: int | None
    steps: int | None
    tokens: int | None
    cost_pool: str | None  # the pool with the least cost left
    tokens_pool: str | None  # the pool with the fewest tokens left


async def apool_room(pools: Sequence[BudgetPool]) -> PoolRoom:
    """:func:`pool_room` for async code: each pool's snapshot is awaited."""
    return pool_room(pools, [await pool.asnapshot() if _limited(pool) else None for pool in pools])


def _limited(pool: BudgetPool) -> bool:
    limits = pool.level.limits
    return not (limits.cost_nano is None and limits.steps is None and limits.tokens is None)


def pool_room(
    pools: Sequence[BudgetPool], snaps: Sequence[PoolSnapshot | None] | None = None
) -> PoolRoom:
    """The least room left in ``pools`` on each measure (one snapshot a pool,
    or ``snaps``: :func:`apool_room`'s, in the order of ``pools``)."""
    cost: int | None = None
    steps: int | None = None
    tokens: int | None = None
    cost_pool: str | None = None
    tokens_pool: str | None = None
    for i, pool in enumerate(pools):
        limits = pool.level.limits
        if not _limited(pool):
            continue
        snap = pool.snapshot() if snaps is None else snaps[i]
        if snap is None:
            continue
        if limits.cost_nano is not None:
            spent = usd_to_nano(snap.cost_usd) + usd_to_nano(snap.reserved_cost_usd)
            left = max(0, limits.cost_nano - spent)
            if cost is None or left < cost:
                cost, cost_pool = left, pool.name
        if limits.steps is not None:
            left = max(0, limits.steps - snap.steps - snap.reserved_steps)
            steps = left if steps is None else min(steps, left)
        if limits.tokens is not None:
            left = max(0, limits.tokens - snap.tokens - snap.reserved_tokens)
            if tokens is None or left < tokens:
                tokens, tokens_pool = left, pool.name
    return PoolRoom(cost, steps, tokens, cost_pool, tokens_pool)
