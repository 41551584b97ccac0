"""Property tests for LocalLedger: bounds, stickiness, atomic denials, integer money.

A hypothesis state machine drives random reserve (one step, or k at once as a
grant's carve holds them) / commit (giving back some of a multi-step
reservation's steps, as a carve's settlement does) / release (a call
cancelled before it was sent) / raise (sent, then failed: its reservation is
committed) / trip / settle sequences over a small tree of chains and compares
the ledger, step by step, with a plain reference model written from the
``Ledger`` protocol's contract. When every call has settled nothing is
reserved and spent is exactly the sum of the commits. The same machine runs
on a RedisLedger over a real Valkey (tests/integration/test_redis_ledger.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from veronica_otel._errors import TripEvent
from veronica_otel._ledger import (
    SIGNATURE_MEMORY,
    LedgerState,
    Level,
    Limits,
    LocalLedger,
    PoolLevel,
    Reservation,
)
from veronica_otel._units import nano_to_usd

# A small tree of chains; every path is root first, as ExecutionContext builds it.
CHAINS = ("root", "root.1", "root.2", "root.1.1", "solo")
PATHS: tuple[tuple[str, ...], ...] = (
    ("root",),
    ("root", "root.1"),
    ("root", "root.2"),
    ("root", "root.1", "root.1.1"),
    ("solo",),
)
SIGNATURES = (None, "sig-a", "sig-b", "sig-c")

optional_limit = st.one_of(st.none(), st.integers(0, 8))
limits_strategy = st.builds(
    Limits,
    cost_nano=st.one_of(st.none(), st.integers(0, 20_000)),
    steps=optional_limit,
    retries=st.one_of(st.none(), st.integers(0, 5)),
    tokens=st.one_of(st.none(), st.integers(0, 3_000)),
    repeats=st.one_of(st.none(), st.integers(1, 3)),
)

pool_limits_strategy = st.builds(
    Limits,
    cost_nano=st.one_of(st.none(), st.integers(0, 30_000)),
    steps=st.one_of(st.none(), st.integers(0, 10)),
    tokens=st.one_of(st.none(), st.integers(0, 4_000)),
)

STATE_FIELDS = ("cost_nano", "reserved_nano", "steps", "retries", "tokens", "reserved_tokens")


def _counters(state: LedgerState) -> LedgerState:
    return dataclasses.replace(state, trip=None)


def _trip_key(trip: TripEvent) -> tuple[str, str, float, float]:
    return (trip.reason, trip.chain_id, trip.limit, trip.observed)


Denial = tuple[tuple[str, str, float, float], bool]  # (trip key, sticky)


class _ModelChain:
    def __init__(self) -> None:
        self.cost_nano = 0
        self.reserved_nano = 0
        self.steps = 0
        self.retries = 0
        self.tokens = 0
        self.reserved_tokens = 0
        self.trip: tuple[str, str, float, float] | None = None
        self.seen: dict[str, int] = {}
        self.committed: list[tuple[int, int]] = []  # every commit's (cost, tokens)


class _ModelPool:
    """A lifetime budget pool: committed and held cost, steps and tokens."""

    def __init__(self, level: PoolLevel) -> None:
        self.level = level
        self.spent = {"steps": 0, "tokens": 0, "cost": 0}
        self.held = {"steps": 0, "tokens": 0, "cost": 0}


class ReferenceLedger:
    """The ledger contract, written as plainly as possible (no locks, no speed)."""

    def __init__(self) -> None:
        self.chains: dict[str, _ModelChain] = {}
        self.pool: _ModelPool | None = None  # one pool every call is also reserved in

    def chain(self, chain_id: str) -> _ModelChain:
        return self.chains.setdefault(chain_id, _ModelChain())

    def reserve(
        self,
        path: Sequence[Level],
        cost: int,
        tokens: int,
        step: int,
        retry: bool,
        signature: str | None,
    ) -> Denial | None:
        soft: Denial | None = None
        for level in path:
            chain = self.chain(level.chain_id)
            if chain.trip is not None:
                return chain.trip, True
            denial = self._denial(level, chain, cost, tokens, step, retry, signature)
            if denial is not None and denial[1]:
                chain.trip = denial[0]
                return denial
            soft = soft or denial
        if self.pool is not None:  # checked after the chain's levels; stores no trip
            denial = self._pool_denial(self.pool, path[-1].chain_id, cost, tokens, step)
            if denial is not None and denial[1]:
                return denial
            soft = soft or denial
        if soft is not None:
            return soft  # only in-flight reservations deny it: nothing is stored
        if self.pool is not None:
            for measure, amount in (("steps", step), ("tokens", tokens), ("cost", cost)):
                self.pool.held[measure] += amount
        for level in path:
            chain = self.chain(level.chain_id)
            chain.steps += step
            chain.retries += int(retry)
            chain.reserved_nano += cost
            chain.reserved_tokens += tokens
            if signature is not None and level.limits.repeats is not None:
                chain.seen[signature] = chain.seen.get(signature, 0) + 1
        return None

    @staticmethod
    def _pool_denial(
        pool: _ModelPool, cid: str, cost: int, tokens: int, step: int
    ) -> Denial | None:
        """The first measure over the pool's limit (a measure that committed
        spend alone exceeds wins over one only reservations exceed)."""
        lim = pool.level.limits
        denied: tuple[str, str, float, float] | None = None
        sticky = False
        for measure, limit, amount in (
            ("steps", lim.steps, step),
            ("tokens", lim.tokens, tokens),
            ("cost", lim.cost_nano, cost),
        ):
            if limit is None:
                continue
            total = pool.spent[measure] + pool.held[measure] + amount
            if total <= limit:
                continue
            hard = pool.spent[measure] + amount > limit
            if denied is None or (hard and not sticky):
                shown = (
                    (nano_to_usd(limit), nano_to_usd(total))
                    if measure == "cost"
                    else (
                        float(limit),
                        float(total),
                    )
                )
                denied = (measure, cid, *shown)
            sticky = sticky or hard
        return None if denied is None else (denied, sticky)

    def settle_pool(self, reserved: Reservation, cost: int, tokens: int, steps: int) -> None:
        """A call's settlement in the pool: its hold dropped, what it spent counted."""
        if self.pool is None:
            return
        for measure, held, spent in (
            ("steps", reserved.step, steps),
            ("tokens", reserved.tokens, tokens),
            ("cost", reserved.cost_nano, cost),
        ):
            self.pool.held[measure] -= held
            self.pool.spent[measure] += spent

    @staticmethod
    def _denial(
        level: Level,
        chain: _ModelChain,
        cost: int,
        tokens: int,
        step: int,
        retry: bool,
        signature: str | None,
    ) -> Denial | None:
        """The first sticky reason, else the first that only reservations cause."""
        lim = level.limits
        cid = level.chain_id
        if step and lim.steps is not None and chain.steps + step > lim.steps:
            return ("steps", cid, float(lim.steps), float(chain.steps + step)), True
        if retry and lim.retries is not None and chain.retries + 1 > lim.retries:
            return ("retries", cid, float(lim.retries), float(chain.retries + 1)), True
        found: list[Denial] = []
        if lim.tokens is not None:
            total = chain.tokens + chain.reserved_tokens + tokens
            if total > lim.tokens:
                sticky = chain.tokens + tokens > lim.tokens
                found.append((("tokens", cid, float(lim.tokens), float(total)), sticky))
        if lim.cost_nano is not None:
            total = chain.cost_nano + chain.reserved_nano + cost
            if total > lim.cost_nano:
                sticky = chain.cost_nano + cost > lim.cost_nano
                key = ("cost", cid, nano_to_usd(lim.cost_nano), nano_to_usd(total))
                found.append((key, sticky))
        if signature is not None and lim.repeats is not None:
            seen = chain.seen.get(signature, 0)
            if seen + 1 > lim.repeats:
                found.append((("loop", cid, float(lim.repeats), float(seen + 1)), True))
        sticky_found = [d for d in found if d[1]]
        return (sticky_found or found or [None])[0]

    def commit(
        self,
        path: Sequence[Level],
        reserved: tuple[int, int],
        cost: int,
        tokens: int,
        steps_back: int = 0,
    ) -> tuple[str, str, float, float] | None:
        first: tuple[str, str, float, float] | None = None
        for level in path:
            chain = self.chain(level.chain_id)
            chain.steps -= steps_back  # a carve's unused steps
            chain.reserved_nano -= reserved[0]
            chain.reserved_tokens -= reserved[1]
            chain.cost_nano += cost
            chain.tokens += tokens
            chain.committed.append((cost, tokens))
            lim = level.limits
            overrun: tuple[str, str, float, float] | None = None
            if lim.cost_nano is not None and chain.cost_nano > lim.cost_nano:
                overrun = (
                    "cost",
                    level.chain_id,
                    nano_to_usd(lim.cost_nano),
                    nano_to_usd(chain.cost_nano),
                )
            elif lim.tokens is not None and chain.tokens > lim.tokens:
                overrun = ("tokens", level.chain_id, float(lim.tokens), float(chain.tokens))
            if overrun is not None and chain.trip is None:
                chain.trip = overrun
                first = first or overrun
        return first

    def release(self, path: Sequence[Level], reserved: Reservation) -> None:
        # A released call was never sent: its step and retry are given back.
        for level in path:
            chain = self.chain(level.chain_id)
            chain.reserved_nano -= reserved.cost_nano
            chain.reserved_tokens -= reserved.tokens
            chain.steps -= reserved.step
            chain.retries -= reserved.retry

    def trip(self, chain_id: str, key: tuple[str, str, float, float]) -> None:
        chain = self.chain(chain_id)
        if chain.trip is None:
            chain.trip = key


class LedgerMachine(RuleBasedStateMachine):
    """Random reserve / commit / raise / release / trip / settle against a ledger and the model."""

    # Whether commits may report more than was reserved (an over-reporting caller).
    ALLOW_OVERRUN = True
    # Whether every call is also reserved in one budget pool (LedgerMachineWithPool).
    POOLED = False

    def __init__(self) -> None:
        super().__init__()
        self.ledger = LocalLedger()
        self.model = ReferenceLedger()
        self.limits: dict[str, Limits] = {}
        self.outstanding: list[tuple[tuple[Level, ...], Reservation]] = []
        self.first_trip: dict[str, TripEvent] = {}
        self.overrun = False
        self.pools: tuple[PoolLevel, ...] = ()
        # The chains' ids (HostileNamesLedgerMachine draws them), in CHAINS' order.
        self.ids: dict[str, str] = {name: name for name in CHAINS}
        self.pool_name = "pool"

    @initialize(
        limits=st.lists(limits_strategy, min_size=len(CHAINS), max_size=len(CHAINS)),
        pool_limits=pool_limits_strategy,
    )
    def set_limits(self, limits: list[Limits], pool_limits: Limits) -> None:
        self.limits = dict(zip(self.ids.values(), limits, strict=True))
        if self.POOLED:
            pool = PoolLevel(self.pool_name, pool_limits)
            self.pools = (pool,)
            self.model.pool = _ModelPool(pool)

    @property
    def pool_args(self) -> dict[str, tuple[PoolLevel, ...]]:
        """``pools=`` for a reservation; none (the argument left out) unless POOLED."""
        return {"pools": self.pools} if self.pools else {}

    def path(self, index: int) -> tuple[Level, ...]:
        return tuple(Level(self.ids[name], self.limits[self.ids[name]]) for name in PATHS[index])

    # -- rules ---------------------------------------------------------------

    @rule(
        path_index=st.integers(0, len(PATHS) - 1),
        cost=st.integers(0, 6_000),
        tokens=st.integers(0, 900),
        step=st.booleans(),
        retry=st.booleans(),
        signature=st.sampled_from(SIGNATURES),
        steps=st.sampled_from([1, 1, 1, 2, 3, 4, 5]),
    )
    def reserve(
        self,
        path_index: int,
        cost: int,
        tokens: int,
        step: bool,
        retry: bool,
        signature: str | None,
        steps: int = 1,
    ) -> None:
        path = self.path(path_index)
        before = {level.chain_id: self.ledger.snapshot(level.chain_id) for level in path}
        count = steps if step else 0
        expected = self.model.reserve(path, cost, tokens, count, retry, signature)
        if steps == 1:  # the default: no steps argument at all
            result = self.ledger.reserve(
                path, cost, tokens, step=step, retry=retry, signature=signature, **self.pool_args
            )
        else:
            result = self.ledger.reserve(
                path,
                cost,
                tokens,
                step=step,
                steps=steps,
                retry=retry,
                signature=signature,
                **self.pool_args,
            )
        after = {level.chain_id: self.ledger.snapshot(level.chain_id) for level in path}
        if isinstance(result, TripEvent):
            assert expected is not None, f"ledger denied {result} but the model allows"
            assert (_trip_key(result), result.sticky) == expected
            # A denial charges nothing anywhere on the path.
            for cid, snap in before.items():
                assert _counters(after[cid]) == _counters(snap)
            # Sticky: a chain that had tripped keeps its first trip; the denial is
            # either that trip or a new trip of a level checked before it.
            tripped = [i for i, level in enumerate(path) if before[level.chain_id].trip]
            if not result.sticky:
                # Only reservations denied it: nothing is remembered anywhere.
                assert not tripped
                assert all(after[cid].trip is None for cid in after)
            elif tripped:
                first = path[tripped[0]].chain_id
                if result.chain_id == first:
                    assert result is before[first].trip
                else:
                    assert [lvl.chain_id for lvl in path].index(result.chain_id) < tripped[0]
        else:
            assert isinstance(result, Reservation)
            assert expected is None, f"model denies {expected} but the ledger allowed"
            assert all(not before[cid].trip for cid in before)
            assert (result.cost_nano, result.tokens, result.step) == (cost, tokens, count)
            self.outstanding.append((path, result))

    @rule(path_index=st.integers(0, len(PATHS) - 1), level=st.integers(0, 2))
    def reserve_what_committed_spend_leaves(self, path_index: int, level: int) -> None:
        """Ask for all that a level's committed spend leaves: while other calls
        hold reservations there, only they deny it (a non-sticky denial)."""
        path = self.path(path_index)
        target = path[min(level, len(path) - 1)]
        snap = self.ledger.snapshot(target.chain_id)
        limits = target.limits
        cost = max(0, limits.cost_nano - snap.cost_nano) if limits.cost_nano is not None else 0
        tokens = max(0, limits.tokens - snap.tokens) if limits.tokens is not None else 0
        self.reserve(path_index, cost, tokens, step=False, retry=False, signature=None)

    @precondition(lambda self: bool(self.outstanding))
    @rule(
        pick=st.integers(0, 10**6),
        percent=st.integers(0, 100),
        over=st.integers(0, 9),
        back=st.integers(0, 6),
    )
    def commit(self, pick: int, percent: int, over: int, back: int = 0) -> None:
        """Commit actual amounts, giving back up to ``back`` of its steps
        (more than it holds gives back only what it holds)."""
        path, reservation = self.outstanding.pop(pick % len(self.outstanding))
        steps_back = min(back, reservation.step)
        cost = reservation.cost_nano * percent // 100
        tokens = reservation.tokens * percent // 100
        if self.ALLOW_OVERRUN and over == 0:
            cost += 1 + reservation.cost_nano
            tokens += 1 + reservation.tokens
            self.overrun = True
        expected = self.model.commit(
            path, (reservation.cost_nano, reservation.tokens), cost, tokens, steps_back
        )
        self.model.settle_pool(reservation, cost, tokens, reservation.step - steps_back)
        if back:
            overrun = self.ledger.commit(path, reservation, cost, tokens, release_steps=back)
        else:
            overrun = self.ledger.commit(path, reservation, cost, tokens)
        if expected is None:
            assert overrun is None
        else:
            assert overrun is not None
            assert _trip_key(overrun) == expected
        if cost <= reservation.cost_nano and tokens <= reservation.tokens:
            assert overrun is None, "a commit within its reservation can never overrun"

    @precondition(lambda self: bool(self.outstanding))
    @rule(pick=st.integers(0, 10**6))
    def raise_after_send(self, pick: int) -> None:
        """Sent, then an exception or cancellation: the reservation is committed."""
        path, reservation = self.outstanding.pop(pick % len(self.outstanding))
        held = (reservation.cost_nano, reservation.tokens)
        expected = self.model.commit(path, held, *held)
        self.model.settle_pool(reservation, *held, reservation.step)
        assert expected is None
        assert self.ledger.commit(path, reservation, *held) is None

    @precondition(lambda self: bool(self.outstanding))
    @rule(pick=st.integers(0, 10**6))
    def release(self, pick: int) -> None:
        """Cancelled (or failed) before anything was sent: given back."""
        path, reservation = self.outstanding.pop(pick % len(self.outstanding))
        self.model.release(path, reservation)
        self.model.settle_pool(reservation, 0, 0, 0)
        self.ledger.release(path, reservation)

    @rule(
        chain=st.sampled_from(CHAINS),
        reason=st.sampled_from(["timeout", "circuit_open", "depth", "cost"]),
    )
    def trip(self, chain: str, reason: str) -> None:
        chain_id = self.ids[chain]
        previous = self.ledger.snapshot(chain_id).trip
        event = TripEvent(reason, 1.0, 2.0, chain_id, "manual")  # type: ignore[arg-type]
        returned = self.ledger.trip(chain_id, event)
        self.model.trip(chain_id, _trip_key(event))
        if previous is None:
            assert returned is event
        else:
            assert returned is previous, "the first trip wins"

    @rule()
    def settle_everything(self) -> None:
        while self.outstanding:
            path, reservation = self.outstanding.pop()
            self.model.release(path, reservation)
            self.model.settle_pool(reservation, 0, 0, 0)
            self.ledger.release(path, reservation)
        for cid in self.ids.values():
            snap = self.ledger.snapshot(cid)
            assert snap.reserved_nano == 0
            assert snap.reserved_tokens == 0
            # Spent is exactly what was committed, call by call.
            committed = self.model.chain(cid).committed
            assert snap.cost_nano == sum(cost for cost, _ in committed)
            assert snap.tokens == sum(tokens for _, tokens in committed)

    # -- invariants ------------------------------------------------------------
    # One snapshot per chain per step, shared by every check (each is a round
    # trip on the Redis ledger).

    @invariant()
    def invariants(self) -> None:
        snaps = {cid: self.ledger.snapshot(cid) for cid in self.ids.values()}
        self.matches_the_model(snaps)
        self.money_and_counts_are_integers(snaps)
        self.counted_limits_never_exceeded(snaps)
        self.cost_and_tokens_bounded_without_overrun(snaps)
        self.trips_are_sticky(snaps)
        self.pool_matches_the_model()

    def matches_the_model(self, snaps: dict[str, LedgerState]) -> None:
        for cid, snap in snaps.items():
            chain = self.model.chain(cid)
            for name in STATE_FIELDS:
                assert getattr(snap, name) == getattr(chain, name), (cid, name)
            assert (None if snap.trip is None else _trip_key(snap.trip)) == chain.trip

    def pool_matches_the_model(self) -> None:
        """The pool's committed and held amounts, and its limits held without overrun."""
        pool = self.model.pool
        if pool is None:
            return
        snap = self.ledger.pool_snapshot(pool.level)
        spent, held = pool.spent, pool.held
        assert (snap.steps, snap.tokens, snap.cost_usd) == (
            spent["steps"],
            spent["tokens"],
            nano_to_usd(spent["cost"]),
        )
        assert (snap.reserved_steps, snap.reserved_tokens, snap.reserved_cost_usd) == (
            held["steps"],
            held["tokens"],
            nano_to_usd(held["cost"]),
        )
        lim = pool.level.limits
        if lim.steps is not None:
            assert spent["steps"] + held["steps"] <= lim.steps
        if not self.overrun:
            for measure, limit in (("tokens", lim.tokens), ("cost", lim.cost_nano)):
                if limit is not None:
                    assert spent[measure] + held[measure] <= limit, measure

    def money_and_counts_are_integers(self, snaps: dict[str, LedgerState]) -> None:
        for cid, snap in snaps.items():
            for name in STATE_FIELDS:
                assert type(getattr(snap, name)) is int, (cid, name, getattr(snap, name))

    def counted_limits_never_exceeded(self, snaps: dict[str, LedgerState]) -> None:
        for cid, limits in self.limits.items():
            snap = snaps[cid]
            if limits.steps is not None:
                assert snap.steps <= limits.steps
            if limits.retries is not None:
                assert snap.retries <= limits.retries
            assert snap.reserved_nano >= 0
            assert snap.reserved_tokens >= 0

    def cost_and_tokens_bounded_without_overrun(self, snaps: dict[str, LedgerState]) -> None:
        if self.overrun:
            return
        for cid, limits in self.limits.items():
            snap = snaps[cid]
            if limits.cost_nano is not None:  # G1
                assert snap.cost_nano + snap.reserved_nano <= limits.cost_nano
            if limits.tokens is not None:  # G7
                assert snap.tokens + snap.reserved_tokens <= limits.tokens

    def trips_are_sticky(self, snaps: dict[str, LedgerState]) -> None:
        for cid, snap in snaps.items():
            trip = snap.trip
            if cid in self.first_trip:
                assert trip is self.first_trip[cid]
            elif trip is not None:
                self.first_trip[cid] = trip

    def teardown(self) -> None:
        self.settle_everything()


class LedgerMachineWithinReservations(LedgerMachine):
    """Every commit reports at most what it reserved: the ceilings must hold."""

    ALLOW_OVERRUN = False


class LedgerMachineWithPool(LedgerMachine):
    """Every call is also reserved in one lifetime pool: all fit or nothing is held.

    Runs on the Redis ledger too (tests/integration/test_redis_ledger.py): the
    chain's own limits decide first there as well, then the pool.
    """

    POOLED = True


# Ids a user may give (as ExecutionContext and BudgetPool accept them) made of
# the words and separators of our own keys, and agent names of any text.
_HOSTILE_WORDS = ["pools", "p", "c", "s", "o", "rh", "rz", "ad", "agent", "breaker", "root", "x"]
_hostile_part = st.sampled_from(_HOSTILE_WORDS) | st.text(
    st.sampled_from("ab09-_"), min_size=1, max_size=4
)
hostile_ids = st.lists(_hostile_part, min_size=1, max_size=3).flatmap(
    lambda parts: st.sampled_from([":", "."]).map(lambda sep: sep.join(parts))
)
hostile_agents = st.text(min_size=1, max_size=8).filter(
    lambda name: (
        name.strip()
        and not any(
            0xD800 <= ord(c) <= 0xDFFF or ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in name
        )
    )
)
hostile_pools = (
    st.lists(_hostile_part | st.sampled_from(["@", "/"]), min_size=1, max_size=3)
    .map(":".join)
    .map(lambda name: name[:128])
)


class HostileNamesLedgerMachine(LedgerMachineWithPool):
    """The pooled machine with generated hostile names: a root chain id and a
    second root made of the words our keys use (``pools``, ``rh``, ``c``,
    ``agent``...), an agent's level in the first tree under any agent name,
    and a pool named like any of them. Each must count apart from the others,
    exactly as the model says (on Redis too: tests/integration/test_redis_ledger.py)."""

    @initialize(
        limits=st.lists(limits_strategy, min_size=len(CHAINS), max_size=len(CHAINS)),
        pool_limits=pool_limits_strategy,
        root=hostile_ids,
        solo=hostile_ids,
        agent_name=hostile_agents,
        pool=st.one_of(hostile_pools, st.sampled_from(["root", "pools", "rh"])),
        pool_is_a_chain=st.booleans(),
    )
    def set_limits(  # type: ignore[override]
        self,
        limits: list[Limits],
        pool_limits: Limits,
        root: str,
        solo: str,
        agent_name: str,
        pool: str,
        pool_is_a_chain: bool,
    ) -> None:
        from veronica_otel import BudgetPool, ExecutionContext
        from veronica_otel._agent_limits import agent_level_id

        ids = {
            "root": root,
            "root.1": f"{root}.1",
            "root.2": f"{root}.2",
            "root.1.1": agent_level_id(root, agent_name),  # an agent of the root's tree
            "solo": solo,
        }
        assume(len(set(ids.values())) == len(ids))
        for name in (root, solo):
            ExecutionContext(chain_id=name, detached=True)  # what a user may name a chain
        self.ids = ids
        self.pool_name = BudgetPool(solo if pool_is_a_chain else pool).name
        LedgerMachineWithPool.set_limits(self, limits, pool_limits)


_MACHINE_SETTINGS = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = _MACHINE_SETTINGS
TestLedgerMachineWithinReservations = LedgerMachineWithinReservations.TestCase
TestLedgerMachineWithinReservations.settings = _MACHINE_SETTINGS
TestLedgerMachineWithPool = LedgerMachineWithPool.TestCase
TestLedgerMachineWithPool.settings = _MACHINE_SETTINGS
TestHostileNamesLedgerMachine = HostileNamesLedgerMachine.TestCase
TestHostileNamesLedgerMachine.settings = _MACHINE_SETTINGS


# -- targeted examples ---------------------------------------------------------


@pytest.fixture
def ledger() -> LocalLedger:
    return LocalLedger()


# The scenario table (trips across a family of chains, each limit at exactly
# limit + 1, exact cents, overruns, releases, repeats) runs on this ledger and
# on the Redis one alike: tests/integration/test_redis_ledger.py.


@pytest.mark.parametrize("steps", [0, 1001, -1, True, 2.0])
def test_a_step_count_out_of_range_is_refused_by_name(ledger: LocalLedger, steps: object) -> None:
    path = (Level("c", Limits(steps=5)),)
    with pytest.raises(ValueError, match="steps"):
        ledger.reserve(path, 0, 0, steps=steps)  # type: ignore[arg-type]
    assert ledger.snapshot("c").steps == 0


def test_k_steps_are_checked_at_every_level_before_any_is_counted(ledger: LocalLedger) -> None:
    path = (Level("root", Limits(steps=10)), Level("child", Limits(steps=3)))
    assert isinstance(ledger.reserve(path, 0, 0, steps=2), Reservation)
    denied = ledger.reserve(path, 0, 0, steps=2)  # 2 + 2 > 3 at the child
    assert isinstance(denied, TripEvent) and (denied.chain_id, denied.observed) == ("child", 4)
    assert (ledger.snapshot("root").steps, ledger.snapshot("child").steps) == (2, 2)


def test_signature_memory_is_bounded(ledger: LocalLedger) -> None:
    path = (Level("c", Limits(repeats=1)),)
    for i in range(SIGNATURE_MEMORY + 500):
        assert isinstance(ledger.reserve(path, 0, 0, signature=f"s{i}"), Reservation)
    memory = ledger._chains["c"].signatures
    assert memory is not None
    assert len(memory) == SIGNATURE_MEMORY
    # The most recent signatures are the ones remembered.
    assert f"s{SIGNATURE_MEMORY + 499}" in memory
    assert "s0" not in memory
