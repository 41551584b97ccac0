"""What a chain holds and how it is read: limits, the path of ledger levels, snapshots.

:class:`~veronica_otel.ExecutionContext` is a front over parts it holds, each
made with what it uses: this :class:`ChainState` (the data every part reads),
the trips record (``_chain_trips``), the store polls of work in flight
(``_chain_poll``), settlement (``_settlement``), admission (``_admission`` and
``_llm_admission``) and the wrap API (``_wrap``). Nothing here changes the ledger.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Mapping
from typing import Any, TypedDict

from . import _agents
from ._agent_limits import AgentLevels, Lookup, lookups_of
from ._agents import HandoffCounter
from ._children import min_limit
from ._config import ExecutionConfig
from ._errors import TripEvent
from ._gc_safe import drain, pending
from ._ledger import (
    Ledger,
    LedgerState,
    Level,
    Limits,
    LocalLedger,
    PoolLevel,
)
from ._options import ChainSnapshot
from ._policy import PolicyPipeline
from ._pools import BudgetPool, PoolRoom, apool_room, pool_room
from ._pricing import PriceTable
from ._telemetry import track_chain
from ._timer import CancellationToken, TimerHandle
from ._units import nano_to_usd, usd_to_nano

__all__ = ["ChainState"]


class _PoolArgs(TypedDict, total=False):
    pools: tuple[PoolLevel, ...]


_NO_POOLS: _PoolArgs = {}
_monotonic = time.monotonic


class ChainState:
    """A chain's data: set once when the chain is made, except its sticky
    ``trip``, the ``partial`` result, ``metrics`` (set on entering) and the
    agent tree (made at the first agent-bound call)."""

    # The agent levels of this chain tree: made at its first agent-bound call (root's).
    agent_tree: AgentLevels | None = None
    # A chain with a deadline sets its own; the rest share this default.
    timer: TimerHandle | None = None

    def __init__(
        self,
        config: ExecutionConfig,
        pipeline: PolicyPipeline,
        chain_id: str,
        name: str,
        depth: int,
        ledger: Ledger,
        pools: tuple[BudgetPool, ...],
        prices: PriceTable | None,
        parent: ChainState | None,
    ) -> None:
        self.config = config
        self.pipeline = pipeline
        self.has_policies = bool(pipeline)  # pipelines are immutable
        # Policies that know agents' limits by name (a policy file's [agents]).
        self.agent_lookups: tuple[Lookup, ...] = lookups_of(pipeline)
        self.chain_id = chain_id
        self.name = name
        self.depth = depth
        self.ledger = ledger
        # A ledger with coroutine operations (a shared store): async calls await it.
        self.aledger: Any = ledger if hasattr(ledger, "areserve") else None
        self.pools = pools
        self.prices = prices
        self.parent = parent
        self.started = _monotonic()
        # This chain's sticky trip as this process knows it (see current_trip).
        self.trip: TripEvent | None = None
        self.partial: Any = None
        self.token = CancellationToken()
        self.metrics = False  # a recording chain span: every call records metrics
        # The chain and its ancestors, root first: what every reservation is checked against.
        self.path: tuple[Level, ...] = (
            *(parent.path if parent is not None else ()),
            Level(
                chain_id,
                Limits(
                    cost_nano=None
                    if config.max_cost_usd is None
                    else usd_to_nano(config.max_cost_usd),
                    steps=config.max_steps,
                    retries=config.max_retries_total,
                    tokens=config.max_tokens,
                    repeats=config.max_repeats,
                ),
            ),
        )
        self.priced = any(level.limits.cost_nano is not None for level in self.path) or any(
            pool.max_cost_usd is not None for pool in pools
        )
        self.repeats_limited = any(level.limits.repeats is not None for level in self.path)
        self.deadline = self._first_deadline(parent)
        self.handoffs = (
            HandoffCounter(config.max_handoffs) if config.max_handoffs is not None else None
        )
        # The chain names its calls' agents (``names_agents``, but for an agent
        # given limits in code later): read once per call, fixed here.
        self.agents_named = self.handoffs is not None or bool(self.agent_lookups)
        # A deadline, handoffs or policies: what admission checks before the ledger
        # (fixed when the chain is built; the common chain tests this one flag).
        self.checked = self.deadline is not None or self.handoffs is not None or self.has_policies
        # An in-process root chain with no policies, pools or handoffs: (ledger,
        # level, live counters), the one-level ledger step of admission and settlement.
        self.fast: tuple[LocalLedger, Level, Any] | None = None
        # The live counters of every level of the path (in process): ensure_active reads them.
        self.live: tuple[Any, ...] | None = None
        if isinstance(ledger, LocalLedger):
            self._hold(ledger)
        if self.priced:
            track_chain(self)

    def _first_deadline(self, parent: ChainState | None) -> float | None:
        """The earlier of this chain's own ``timeout_ms`` and its parent's deadline."""
        timeout_ms = self.config.timeout_ms
        deadline = None if timeout_ms is None else self.started + timeout_ms / 1000
        inherited = None if parent is None else parent.deadline
        if inherited is not None and (deadline is None or inherited < deadline):
            deadline = inherited
        return deadline

    def _hold(self, ledger: LocalLedger) -> None:
        # Held while this state lives: the context and every call in flight keep it.
        ledger.acquire(self.chain_id)
        weakref.finalize(self, ledger.discard, self.chain_id)
        self.live = tuple(ledger.state_of(level.chain_id) for level in self.path)
        if (
            self.parent is None
            and not self.has_policies
            and self.handoffs is None
            and not self.pools
        ):
            # Held by acquire(): the live counters outlast nothing we use.
            self.fast = (ledger, self.path[0], self.live[0])

    @property
    def names_agents(self) -> bool:
        """Whether a call's span should name its agent (``gen_ai.agent.name``)."""
        return self.agents_named or _agents._limited_in_code

    @property
    def awaits_store(self) -> bool:
        """Whether async calls await the ledger (a shared store; in process, never)."""
        return self.aledger is not None

    def current_trip(self) -> TripEvent | None:
        """The sticky trip of this chain or the nearest tripped ancestor."""
        if self.trip is not None:
            return self.trip
        for level in reversed(self.path):
            trip = self.ledger.snapshot(level.chain_id).trip
            if trip is not None:
                return trip
        return None

    async def asnapshots(self) -> dict[str, LedgerState] | None:
        """The counters of every level with a cost, step or token ceiling, read
        without blocking; None with an in-process ledger (read it directly)."""
        aledger = self.aledger
        if aledger is None:
            return None
        states: dict[str, LedgerState] = {}
        for level in self.path:
            limits = level.limits
            if not (limits.cost_nano is None and limits.tokens is None and limits.steps is None):
                states[level.chain_id] = await aledger.asnapshot(level.chain_id)
        return states

    async def atrip(self) -> TripEvent | None:
        """:meth:`current_trip` for async code: a shared store is read without blocking."""
        aledger = self.aledger
        if self.trip is not None or aledger is None:
            return self.current_trip()
        for level in reversed(self.path):
            found: TripEvent | None = (await aledger.asnapshot(level.chain_id)).trip
            if found is not None:
                return found
        return None

    def snapshot(self) -> ChainSnapshot:
        """A frozen view of this chain's counters."""
        if pending:
            drain()
        return self._snapshot_of(self.ledger.snapshot(self.chain_id), self.current_trip())

    async def asnapshot(self) -> ChainSnapshot:
        """:meth:`snapshot` for async code: a shared store is read without blocking."""
        aledger = self.aledger
        if aledger is None:
            return self.snapshot()
        if pending:
            drain()
        state = await aledger.asnapshot(self.chain_id)
        return self._snapshot_of(state, await self.atrip())

    def _snapshot_of(self, state: LedgerState, trip: TripEvent | None) -> ChainSnapshot:
        return ChainSnapshot(
            chain_id=self.chain_id,
            cost_usd=nano_to_usd(state.cost_nano),
            steps=state.steps,
            retries=state.retries,
            tokens=state.tokens,
            elapsed_ms=(_monotonic() - self.started) * 1000,
            aborted=trip is not None,
            trip=trip,
            reserved_usd=nano_to_usd(state.reserved_nano),
            depth=self.depth,
        )

    def remaining_cost_and_steps(
        self, states: Mapping[str, LedgerState] | None = None, room: PoolRoom | None = None
    ) -> tuple[int | None, int | None]:
        """What the tightest cost and step ceilings have left (one ledger read a
        level, or ``states`` from :meth:`asnapshots`; the pools' ``room`` from
        :meth:`apool_room`, else read here)."""
        fast = self.fast
        if fast is not None:  # a root in-process chain: read the live counters
            limits, state = fast[1].limits, fast[2]
            return (
                None
                if limits.cost_nano is None
                else max(0, limits.cost_nano - state.cost_nano - state.reserved_nano),
                None if limits.steps is None else max(0, limits.steps - state.steps),
            )
        cost_left: int | None = None
        steps_left: int | None = None
        for level in self.path:
            limits = level.limits
            if limits.cost_nano is None and limits.steps is None:
                continue
            state = (
                self.ledger.snapshot(level.chain_id) if states is None else states[level.chain_id]
            )
            if limits.cost_nano is not None:
                left = max(0, limits.cost_nano - state.cost_nano - state.reserved_nano)
                cost_left = left if cost_left is None else min(cost_left, left)
            if limits.steps is not None:
                steps = max(0, limits.steps - state.steps)
                steps_left = steps if steps_left is None else min(steps_left, steps)
        if self.pools:
            if room is None:
                room = pool_room(self.pools)
            cost_left = min_limit(cost_left, room.cost_nano)
            steps_left = min_limit(steps_left, room.steps)
        return cost_left, steps_left

    def remaining_cost_nano(
        self, states: Mapping[str, LedgerState] | None = None, *, pools: bool = True
    ) -> int | None:
        """What the tightest cost ceiling on the path (and, with ``pools``, in the
        chain's pools) has left unreserved, or None."""
        remaining = self.path_left(states, tokens=False)
        if pools and self.pools:
            remaining = min_limit(remaining, pool_room(self.pools).cost_nano)
        return remaining

    def remaining_tokens(
        self, states: Mapping[str, LedgerState] | None = None, *, pools: bool = True
    ) -> int | None:
        """What the tightest token ceiling on the path (and, with ``pools``, in the
        chain's pools) has left unreserved, or None."""
        remaining = self.path_left(states, tokens=True)
        if pools and self.pools:
            remaining = min_limit(remaining, pool_room(self.pools).tokens)
        return remaining

    def path_left(self, states: Mapping[str, LedgerState] | None, *, tokens: bool) -> int | None:
        """The tightest unreserved cost (or tokens) left over the path's levels
        (the path's counters from ``states``, :meth:`asnapshots`, when given)."""
        remaining: int | None = None
        for level in self.path:
            limit = level.limits.tokens if tokens else level.limits.cost_nano
            if limit is None:
                continue
            state = (
                self.ledger.snapshot(level.chain_id) if states is None else states[level.chain_id]
            )
            used = (
                state.tokens + state.reserved_tokens
                if tokens
                else state.cost_nano + state.reserved_nano
            )
            left = max(0, limit - used)
            remaining = left if remaining is None else min(remaining, left)
        return remaining

    def pool_room(self) -> PoolRoom | None:
        """What the chain's pools have left unreserved; None for a chain with no pools."""
        return pool_room(self.pools) if self.pools else None

    async def apool_room(self) -> PoolRoom | None:
        """:meth:`pool_room` for async code: a shared store is read without blocking."""
        return await apool_room(self.pools) if self.pools else None

    def pool_args(self) -> _PoolArgs:
        """``pools=`` for a ledger reservation: each pool's current level (new
        limits apply from the next call). Empty for a chain with no pools, so
        a ledger that knows no pools is called as before."""
        if not self.pools:
            return _NO_POOLS
        return {"pools": tuple([pool.level for pool in self.pools])}

    def elapsed_ms(self) -> float:
        return (_monotonic() - self.started) * 1000
