"""The chain ledger: reserve / commit / release / trip / snapshot, per chain id.

Every operation is one atomic step (one lock here; one Lua script in the Redis
ledger), so the bounds hold for any number of threads, tasks or processes.
A call's path is the chain and its ancestors, root first: a reservation is
checked against, and charged to, every level at once, which is how a child's
spending counts in its parent and a parent's trip stops its children.

Money is integer nano-USD; there is no float arithmetic in here.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from . import _fork
from ._errors import TripEvent, TripReason
from ._limits import Level, Limits, PoolLevel
from ._pool_accounts import PoolAccount
from ._units import nano_to_usd
from ._window import Clock

if TYPE_CHECKING:
    from ._clamp import OutputClamp

__all__ = [
    "DEFAULT_LEDGER",
    "Ledger",
    "LedgerState",
    "Level",
    "Limits",
    "LocalLedger",
    "PoolLevel",
    "PoolSnapshot",
    "Reservation",
    "MAX_RESERVE_STEPS",
    "SIGNATURE_MEMORY",
]

# Distinct call signatures remembered per chain for the repeat limit; the
# least recently seen are forgotten first, so memory per chain is bounded.
SIGNATURE_MEMORY = 4096

# The most steps one reservation may hold (a cross-service grant carves its
# steps in one reservation); bounded so every sum a store script makes stays exact.
MAX_RESERVE_STEPS = 1000

# Exact commits queued per chain before they are applied under the lock
# (LocalLedger.commit_one): bounds the queue, amortises the lock.
_SETTLE_BATCH = 64

# Pools live as long as their ledger (their names are few, unlike chain ids);
# past this many, idle ones (nothing in the window, nothing reserved) are
# forgotten when a new one is made: they are indistinguishable from new.
_POOLS_BEFORE_SWEEP = 1024

# One step, compared by identity on the hot path (any other 1 goes the general way).
_ONE = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSnapshot:
    """A pool's counters as one ledger sees them (``BudgetPool.snapshot()``).

    Attributes:
        name: The pool's name.
        window_s: Its rolling window in seconds; None for a lifetime budget.
        cost_usd: Committed within the window (or lifetime).
        steps: Steps committed within the window.
        tokens: Tokens committed within the window.
        reserved_cost_usd: Held by calls in flight (counted when they settle).
        reserved_steps: Steps held by calls in flight.
        reserved_tokens: Tokens held by calls in flight.
        free_in_s: Seconds until the oldest spend still in the window leaves
            it; None when nothing will (a lifetime pool, or nothing spent).
    """

    name: str
    window_s: float | None = None
    cost_usd: float = 0.0
    steps: int = 0
    tokens: int = 0
    reserved_cost_usd: float = 0.0
    reserved_steps: int = 0
    reserved_tokens: int = 0
    free_in_s: float | None = None


class Reservation:
    """What one admitted call holds until it commits or releases.

    A plain slotted class rather than a frozen dataclass: one is built per
    call, on the hot path. ``pools`` are the pools it is also held in, so
    ``commit`` and ``release`` settle them too. A value: never changed once
    made, so one may be shared (a plain one-level step reuses the last
    one for the same amounts).
    """

    __slots__ = ("cost_nano", "id", "pools", "retry", "step", "tokens")

    def __init__(
        self,
        id: str,
        cost_nano: int,
        tokens: int,
        step: int = 0,
        retry: bool = False,
        pools: tuple[PoolLevel, ...] = (),
    ) -> None:
        self.id = id
        self.cost_nano = cost_nano
        self.tokens = tokens
        self.step = (
            step  # how many steps were counted (0, 1, or a carve's k): a release gives them back
        )
        self.retry = retry
        self.pools = pools

    def __repr__(self) -> str:
        return f"Reservation(id={self.id!r}, cost_nano={self.cost_nano}, tokens={self.tokens})"


_new = object.__new__


def _one_step(cost_nano: int, tokens: int) -> Reservation:
    """``Reservation("", cost_nano, tokens, 1, False)`` without a class call
    running ``__init__`` (a plain step of new amounts: per call, in real use)."""
    held: Reservation = _new(Reservation)
    held.id = ""
    held.cost_nano = cost_nano
    held.tokens = tokens
    held.step = 1
    held.retry = False
    held.pools = ()
    return held


@dataclass(frozen=True, slots=True)
class LedgerState:
    """A consistent copy of one chain's counters."""

    cost_nano: int = 0
    reserved_nano: int = 0
    steps: int = 0
    retries: int = 0
    tokens: int = 0
    reserved_tokens: int = 0
    trip: TripEvent | None = None


@runtime_checkable
class Ledger(Protocol):
    """Storage of chain counters. One call of each method is one atomic step."""

    def reserve(
        self,
        path: Sequence[Level],
        cost_nano: int,
        tokens: int,
        *,
        step: bool = True,
        steps: int = 1,
        retry: bool = False,
        signature: str | None = None,
        pools: Sequence[PoolLevel] = (),
    ) -> Reservation | TripEvent:
        """Check every level's limits, then charge every level; or trip.

        Returns the reservation, or the trip that denies the call.
        Check-before-increment: nothing is charged when any level says no.
        With ``step``, ``steps`` (1..MAX_RESERVE_STEPS) steps are checked and
        counted at once; the reservation remembers them for release.
        A cost or token denial that only other calls' in-flight reservations
        cause (the call fits against committed spend alone) is returned with
        ``sticky=False`` and not stored: the chain keeps running, and the
        call may be retried once those reservations settle.

        ``pools`` are checked and charged in the same step (cost, tokens
        and the steps): all fit, or nothing is reserved anywhere. A pool's
        denial has ``pool`` set (and ``retry_after_s`` for a windowed pool)
        and is stored nowhere: a pool never trips (the caller trips its chain).
        """
        ...

    def commit(
        self,
        path: Sequence[Level],
        reservation: Reservation,
        cost_nano: int,
        tokens: int,
        *,
        release_steps: int = 0,
    ) -> TripEvent | None:
        """Replace a reservation with the actual cost and tokens.

        ``release_steps`` of the reservation's steps are given back (a carve
        that used fewer than it held); the rest stay counted.
        Returns a trip when the actual amounts pushed a level past a ceiling
        (possible only when a caller reported more than it reserved).
        """
        ...

    def release(self, path: Sequence[Level], reservation: Reservation) -> None:
        """Give back a reservation whose call was never sent (its step too)."""
        ...

    def trip(self, chain_id: str, event: TripEvent) -> TripEvent:
        """Make a trip sticky. The first trip wins and is returned."""
        ...

    def snapshot(self, chain_id: str) -> LedgerState:
        """Return the chain's counters (all zero for an unknown chain)."""
        ...

    def pool_snapshot(self, pool: PoolLevel) -> PoolSnapshot:
        """Return ``pool``'s counters within its window (all zero if unknown)."""
        ...


class _ChainState:
    __slots__ = (
        "cost_nano",
        "override",
        "refs",
        "reserved_nano",
        "reserved_tokens",
        "retries",
        "settled",
        "signatures",
        "steps",
        "tokens",
        "trip",
    )

    def __init__(self) -> None:
        self.cost_nano = 0
        self.reserved_nano = 0
        self.steps = 0
        self.retries = 0
        self.tokens = 0
        self.reserved_tokens = 0
        self.trip: TripEvent | None = None
        self.signatures: OrderedDict[str, int] | None = None
        self.refs = 0
        # (expires_at wall time, extra cost_nano, extra steps) from an override
        self.override: tuple[float, int, int] | None = None
        # Reservations committed at exactly what they held, not yet moved from
        # reserved to spent (commit_one; applied under the lock by _settle).
        self.settled: deque[Reservation] = deque()


class LocalLedger:
    """In-process ledger: one lock, integer counters, bounded per chain.

    Chains are kept while an :class:`ExecutionContext` holds them
    (:meth:`acquire` / :meth:`discard`), so a long-running process does not
    accumulate dead chains. Budget pools are kept as long as the ledger.

    Args:
        clock: Seconds for the pools' rolling windows (``time.monotonic``).
    """

    def __init__(self, *, clock: Clock = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._chains: dict[str, _ChainState] = {}
        self._discarded: deque[str] = deque()
        self._clock = clock
        self._pools: dict[str, PoolAccount] = {}
        self._sweep_at = _POOLS_BEFORE_SWEEP
        self._one = Reservation("", 0, 0, 1, False)

    def acquire(self, chain_id: str) -> None:
        """Keep ``chain_id``'s state alive until a matching :meth:`discard`."""
        with self._lock:
            if self._discarded:
                self._drop_discarded()
            self._state(chain_id).refs += 1

    def discard(self, chain_id: str) -> None:
        """Drop one hold on ``chain_id``; its state goes with the last one.

        Called from a weakref finaliser, so possibly by the garbage collector
        while this very thread holds the lock: it never blocks. The drop is
        queued and applied now if the lock is free, else at the next acquire.
        """
        self._discarded.append(chain_id)
        if self._lock.acquire(blocking=False):
            try:
                self._drop_discarded()
            finally:
                self._lock.release()

    def _drop_discarded(self) -> None:
        while self._discarded:
            chain_id = self._discarded.popleft()
            state = self._chains.get(chain_id)
            if state is not None:
                state.refs -= 1
                if state.refs <= 0:
                    del self._chains[chain_id]

    def __len__(self) -> int:
        return len(self._chains)

    def __repr__(self) -> str:
        default = " (the process default)" if self is DEFAULT_LEDGER else ""
        return f"<LocalLedger{default} at {id(self):#x}>"

    def _state(self, chain_id: str) -> _ChainState:
        state = self._chains.get(chain_id)
        if state is None:
            state = self._chains[chain_id] = _ChainState()
        return state

    def reserve(
        self,
        path: Sequence[Level],
        cost_nano: int,
        tokens: int,
        step: bool = True,
        steps: int = 1,
        retry: bool = False,
        signature: str | None = None,
        pools: Sequence[PoolLevel] = (),
        clamp: OutputClamp | None = None,
    ) -> Reservation | TripEvent:
        """:meth:`Ledger.reserve`; with ``clamp``, of an uncapped call sized under
        the same lock. (No keyword-only parameters: CPython 3.11 takes its
        slow call path for such a function, and every call's hot path comes
        here with three positions.)

        ``clamp`` is fed the unreserved room of every level of ``path`` with a
        cost or token ceiling, then of every pool, and sizes the call
        (``clamp.cap``, ``clamp.pool``); that worst case (not ``cost_nano``
        and ``tokens``) is then checked and charged. No other call can take
        the room between the read and the reservation.
        """
        if (
            steps is _ONE
            and step
            and not (retry or pools)
            and signature is None
            and clamp is None
            and len(path) == 1
        ):
            level = path[0]
            state = self._chains.get(level.chain_id)
            if state is not None:  # (a new chain: the general way)
                held = self.plain_step(state, level.limits, cost_nano, tokens)
                if held is not None:
                    return held
        count = step_count(steps) if step else 0
        with self._lock:
            if clamp is not None:
                cost_nano, tokens = self._size(path, pools, clamp)
            return self._reserve_locked(path, cost_nano, tokens, count, retry, signature, pools)

    def plain_step(
        self, state: _ChainState, limits: Limits, cost_nano: int, tokens: int
    ) -> Reservation | None:
        """The common call of :meth:`reserve` (one root level, a plain step, no
        retry, signature, pools or clamp) in a few comparisons, or ``None``:
        anything unusual (a trip, an override, a denial) goes :meth:`reserve`'s
        general way, which re-checks under the lock (and tells a sticky trip
        from a denial that only calls in flight cause). ``state`` is the
        level's live counters (:meth:`state_of`, held with :meth:`acquire`).
        The kernel's hot path calls it directly, then :meth:`reserve` on
        ``None``; the checks are ``_check``'s for such a step.
        """
        lock = self._lock
        lock.acquire()  # not ``with``: its two special-method lookups, per call
        try:
            if state.trip is not None or state.override is not None:
                return None
            count = state.steps + 1
            if (
                (limits.steps is None or count <= limits.steps)
                and (
                    limits.tokens is None
                    or state.tokens + state.reserved_tokens + tokens <= limits.tokens
                )
                and (
                    limits.cost_nano is None
                    or state.cost_nano + state.reserved_nano + cost_nano <= limits.cost_nano
                )
            ):
                state.steps = count
                state.reserved_nano += cost_nano
                state.reserved_tokens += tokens
                held = self._one
                if held.cost_nano != cost_nano or held.tokens != tokens:
                    held = self._one = _one_step(cost_nano, tokens)
                return held
        finally:
            lock.release()
        return None

    def _size(
        self, path: Sequence[Level], pools: Sequence[PoolLevel], clamp: OutputClamp
    ) -> tuple[int, int]:
        """Feed ``clamp`` the room of every limited level and pool, then size
        the call (under the lock): its worst case, cost and tokens."""
        chains = self._chains
        for level in path:
            limits = level.limits
            if limits.cost_nano is None and limits.tokens is None:
                continue
            state = chains.get(level.chain_id)
            if state is None:
                clamp.room(limits.cost_nano, limits.tokens)
                continue
            clamp.room(
                None
                if limits.cost_nano is None
                else max(0, limits.cost_nano - state.cost_nano - state.reserved_nano),
                None
                if limits.tokens is None
                else max(0, limits.tokens - state.tokens - state.reserved_tokens),
            )
        for pool in pools:
            limits = pool.limits
            if limits.cost_nano is None and limits.tokens is None:
                continue
            account = self._pool(pool)
            cost, _, tokens = account.totals()
            clamp.room(
                None
                if limits.cost_nano is None
                else max(0, limits.cost_nano - cost - account.reserved_nano),
                None
                if limits.tokens is None
                else max(0, limits.tokens - tokens - account.reserved_tokens),
                pool.name,
            )
        return clamp.size()

    def _reserve_locked(
        self,
        path: Sequence[Level],
        cost_nano: int,
        tokens: int,
        count: int,
        retry: bool,
        signature: str | None,
        pools: Sequence[PoolLevel],
    ) -> Reservation | TripEvent:
        """Check every level and pool, then charge them all (the lock held)."""
        chains = self._chains
        states = []
        soft: TripEvent | None = None  # a non-sticky denial; later levels may trip
        for level in path:
            state = chains.get(level.chain_id)
            if state is None:
                state = chains[level.chain_id] = _ChainState()
            if state.trip is not None:
                return state.trip
            if state.settled:
                _settle(state)
            denial = _check(level, state, cost_nano, tokens, count, retry, signature)
            if denial is not None:
                if denial.sticky:
                    state.trip = denial
                    return denial
                soft = soft or denial
            states.append(state)
        accounts: list[PoolAccount] = []
        if pools:
            chain_id = path[-1].chain_id if path else ""
            for pool in pools:
                account = self._pool(pool)
                denial = account.check(pool, chain_id, cost_nano, tokens, count)
                if denial is not None:
                    if denial.sticky:
                        return denial  # stored nowhere: a pool never trips
                    soft = soft or denial
                accounts.append(account)
        if soft is not None:
            return soft
        for i, state in enumerate(states):
            _charge(path[i], state, cost_nano, tokens, count, retry, signature)
        for account in accounts:
            account.charge(cost_nano, tokens, count)
        return Reservation("", cost_nano, tokens, count, retry, tuple(pools))

    def _pool(self, level: PoolLevel) -> PoolAccount:
        """``level``'s account, made on first use (under the lock)."""
        account = self._pools.get(level.name)
        if account is not None and (
            level.window_s == account.window_s and level.bucket_s == account.bucket_s
        ):
            return account  # the common case: known, same window
        if account is None:
            if len(self._pools) >= self._sweep_at:
                for name in [n for n, a in self._pools.items() if a.idle]:
                    del self._pools[name]
                self._sweep_at = max(_POOLS_BEFORE_SWEEP, 2 * len(self._pools))
            account = self._pools[level.name] = PoolAccount(level, self._clock)
        else:
            account.configure(level)
        return account

    def _settle_pools(
        self, reservation: Reservation, cost_nano: int, tokens: int, steps: int
    ) -> None:
        for level in reservation.pools:
            self._pool(level).settle(
                reservation.cost_nano,
                reservation.tokens,
                reservation.step,
                cost_nano,
                tokens,
                steps,
            )

    def pool_snapshot(self, pool: PoolLevel) -> PoolSnapshot:
        with self._lock:
            account = self._pools.get(pool.name)
            if account is None:
                return PoolSnapshot(name=pool.name, window_s=pool.window_s)
            account.configure(pool)
            cost, steps, tokens = account.totals()
            return PoolSnapshot(
                name=pool.name,
                window_s=account.window_s,
                cost_usd=nano_to_usd(cost),
                steps=steps,
                tokens=tokens,
                reserved_cost_usd=nano_to_usd(account.reserved_nano),
                reserved_steps=account.reserved_steps,
                reserved_tokens=account.reserved_tokens,
                free_in_s=account.free_in_s(),
            )

    def state_of(self, chain_id: str) -> _ChainState:
        """The live counters of ``chain_id`` (for :meth:`commit_one`); hold it with acquire."""
        with self._lock:
            return self._state(chain_id)

    def commit_one(
        self,
        level: Level,
        state: _ChainState,
        reservation: Reservation,
        cost_nano: int,
        tokens: int,
    ) -> TripEvent | None:
        """:meth:`commit` for the hot path (one root level).

        A commit of exactly what was reserved (a call that reported no usage)
        only moves it from reserved to spent: every sum a limit is checked
        against stays the same, so it can cross no ceiling and takes no lock.
        It is queued (``deque.append`` is atomic) and applied under the lock
        by the next operation that reads the split, or once _SETTLE_BATCH
        are queued (:func:`_settle`).
        """
        if cost_nano == reservation.cost_nano and tokens == reservation.tokens:
            settled = state.settled
            settled.append(reservation)
            if len(settled) < _SETTLE_BATCH:
                return None
            with self._lock:
                _settle(state)
            return None
        lock = self._lock
        lock.acquire()  # (plain_step's reason)
        try:
            if state.settled:
                _settle(state)
            state.reserved_nano -= reservation.cost_nano
            state.reserved_tokens -= reservation.tokens
            state.cost_nano += cost_nano
            state.tokens += tokens
            if cost_nano <= reservation.cost_nano and tokens <= reservation.tokens:
                return None
            trip = _overrun(level, state)
            if trip is not None and state.trip is None:
                state.trip = trip
                return trip
            return None
        finally:
            lock.release()

    def commit(
        self,
        path: Sequence[Level],
        reservation: Reservation,
        cost_nano: int,
        tokens: int,
        *,
        release_steps: int = 0,
    ) -> TripEvent | None:
        back = min(max(0, release_steps), reservation.step)
        overrun: TripEvent | None = None
        chains = self._chains
        with self._lock:
            for level in path:
                state = chains.get(level.chain_id) or self._state(level.chain_id)
                if state.settled:
                    _settle(state)
                state.reserved_nano -= reservation.cost_nano
                state.reserved_tokens -= reservation.tokens
                state.cost_nano += cost_nano
                state.tokens += tokens
                state.steps -= back
                if cost_nano <= reservation.cost_nano and tokens <= reservation.tokens:
                    continue  # within what was reserved: cannot cross a ceiling
                trip = _overrun(level, state)
                if trip is not None and state.trip is None:
                    state.trip = trip
                    overrun = overrun or trip
            if reservation.pools:
                # Spend past a pool's limit trips nothing: the pool denies
                # later calls until its window frees enough.
                self._settle_pools(reservation, cost_nano, tokens, reservation.step - back)
        return overrun

    def release(self, path: Sequence[Level], reservation: Reservation) -> None:
        with self._lock:
            for level in path:
                state = self._state(level.chain_id)
                state.reserved_nano -= reservation.cost_nano
                state.reserved_tokens -= reservation.tokens
                # Not sent: it was no step (or retry) after all.
                state.steps -= reservation.step
                state.retries -= reservation.retry
            if reservation.pools:
                self._settle_pools(reservation, 0, 0, 0)

    def trip(self, chain_id: str, event: TripEvent) -> TripEvent:
        with self._lock:
            state = self._state(chain_id)
            if state.trip is None:
                state.trip = event
            return state.trip

    def clear_trip(self, chain_id: str) -> TripEvent | None:
        """Remove a sticky trip (only the logged override path calls this)."""
        with self._lock:
            state = self._chains.get(chain_id)
            if state is None:
                return None
            trip, state.trip = state.trip, None
            return trip

    def override(
        self, chain_id: str, *, expires_at: float, add_cost_nano: int = 0, add_steps: int = 0
    ) -> TripEvent | None:
        """Lift a sticky trip and widen the limits until ``expires_at`` (wall time).

        Returns the trip that was lifted. When the override expires the extra
        allowance goes away by itself; a chain past its own limits then trips
        again at its next call.
        """
        with self._lock:
            state = self._state(chain_id)
            trip, state.trip = state.trip, None
            state.override = (expires_at, add_cost_nano, add_steps)
            return trip

    def snapshot(self, chain_id: str) -> LedgerState:
        with self._lock:
            state = self._chains.get(chain_id)
            if state is None:
                return LedgerState()
            if state.settled:
                _settle(state)
            return LedgerState(
                state.cost_nano,
                state.reserved_nano,
                state.steps,
                state.retries,
                state.tokens,
                state.reserved_tokens,
                state.trip,
            )

    # -- os.fork (see _fork.py) ----------------------------------------------

    def __new__(cls, *args: object, **kwargs: object) -> LocalLedger:
        ledger = super().__new__(cls)
        _fork.track_ledger(ledger)
        return ledger

    def after_fork_in_child(self, pid: int) -> None:
        """In a forked child: a new lock, every inherited chain tripped and pool closed.

        A copy of a chain or a pool in another process would be a second
        budget. The trip is sticky, an inherited pool admits nothing, and
        both messages point to the shared (Redis) ledger.
        """
        self._lock = threading.Lock()
        for account in self._pools.values():
            account.forked = pid  # a copy of a shared budget is a second budget
        for chain_id, state in self._chains.items():
            _settle(state)
            if state.trip is None:
                message = _fork.FORK_MESSAGE.format(chain_id=chain_id, pid=pid)
                # Nothing of it may be spent here: limit 0, observed what was spent.
                state.trip = TripEvent("cost", 0.0, nano_to_usd(state.cost_nano), chain_id, message)


# The process's in-process ledger: chains and pools use it unless given another.
DEFAULT_LEDGER = LocalLedger()


def _settle(state: _ChainState) -> None:
    """Apply the exact commits queued by commit_one (under the ledger lock)."""
    settled = state.settled
    while settled:
        held = settled.popleft()  # only ever taken under the lock: never empty here
        state.reserved_nano -= held.cost_nano
        state.cost_nano += held.cost_nano
        state.reserved_tokens -= held.tokens
        state.tokens += held.tokens


def _check(
    level: Level,
    state: _ChainState,
    cost_nano: int,
    tokens: int,
    step: int,
    retry: bool,
    signature: str | None,
) -> TripEvent | None:
    limits = level.limits
    extra_cost = extra_steps = 0
    if state.override is not None:  # rare: only after a logged override
        if time.time() < state.override[0]:
            _, extra_cost, extra_steps = state.override
        else:
            state.override = None
    if step and limits.steps is not None and state.steps + step > limits.steps + extra_steps:
        return _trip(level, "steps", limits.steps + extra_steps, state.steps + step)
    if retry and limits.retries is not None and state.retries + 1 > limits.retries:
        return _trip(level, "retries", limits.retries, state.retries + 1)
    # A call that fits against committed spend alone is denied only by other
    # calls' reservations, which settle: that denial must not stop the chain.
    # Any sticky reason found later still wins over such a denial.
    soft: TripEvent | None = None
    if limits.tokens is not None:
        total = state.tokens + state.reserved_tokens + tokens
        if total > limits.tokens:
            soft = _trip(
                level, "tokens", limits.tokens, total, state.tokens + tokens > limits.tokens
            )
            if soft.sticky:
                return soft
    if limits.cost_nano is not None:
        total = state.cost_nano + state.reserved_nano + cost_nano
        ceiling = limits.cost_nano + extra_cost
        if total > ceiling:
            sticky = state.cost_nano + cost_nano > ceiling
            denial = _trip(level, "cost", nano_to_usd(ceiling), nano_to_usd(total), sticky)
            if sticky:
                return denial
            soft = soft or denial
    if signature is not None and limits.repeats is not None and state.signatures is not None:
        seen = state.signatures.get(signature, 0)
        if seen + 1 > limits.repeats:
            return _trip(level, "loop", limits.repeats, seen + 1)
    return soft


def _charge(
    level: Level,
    state: _ChainState,
    cost_nano: int,
    tokens: int,
    step: int,
    retry: bool,
    signature: str | None,
) -> None:
    state.steps += step
    if retry:
        state.retries += 1
    state.reserved_nano += cost_nano
    state.reserved_tokens += tokens
    if signature is not None and level.limits.repeats is not None:
        _remember(state, signature)


def step_count(steps: int) -> int:
    """``steps`` checked: an int in 1..MAX_RESERVE_STEPS, else ValueError naming it."""
    if type(steps) is not int or not 1 <= steps <= MAX_RESERVE_STEPS:
        raise ValueError(f"steps must be an int in 1..{MAX_RESERVE_STEPS}, got {steps!r}")
    return steps


def _overrun(level: Level, state: _ChainState) -> TripEvent | None:
    limits = level.limits
    if limits.cost_nano is not None and state.cost_nano > limits.cost_nano:
        return _trip(level, "cost", nano_to_usd(limits.cost_nano), nano_to_usd(state.cost_nano))
    if limits.tokens is not None and state.tokens > limits.tokens:
        return _trip(level, "tokens", limits.tokens, state.tokens)
    return None


def _remember(state: _ChainState, signature: str) -> None:
    memory = state.signatures
    if memory is None:
        memory = state.signatures = OrderedDict()
    memory[signature] = memory.get(signature, 0) + 1
    memory.move_to_end(signature)
    if len(memory) > SIGNATURE_MEMORY:
        memory.popitem(last=False)


_UNITS = {"cost": "USD", "timeout": "ms"}


def _trip(
    level: Level, reason: TripReason, limit: float, observed: float, sticky: bool = True
) -> TripEvent:
    unit = _UNITS.get(reason, "")
    message = (
        f"chain {level.chain_id}: {reason} limit reached "
        f"(limit {limit:g}{' ' + unit if unit else ''}, this call would make it {observed:g})"
    )
    if not sticky:  # the same words as the store's script (_scripts.RESERVE)
        message += "; calls in flight hold the rest, try again once they finish"
    return TripEvent(reason, float(limit), float(observed), level.chain_id, message, sticky=sticky)
