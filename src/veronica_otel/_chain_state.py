"""What a chain holds and how it is read: counters, room left, its trip.

The bottom of the :class:`~veronica_otel.ExecutionContext` stack, each layer
one module importing only the one below: ``_chain_state`` (state, readers) <-
``_chain_trips`` (denials, overrides) <- ``_chain_poll`` (``ensure_active``) <-
``_settlement`` <- ``_admission`` <- ``_wrap`` (the wrap API) <- ``_context``
(set-up, entering, children). Nothing here changes the ledger.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, TypedDict

from . import _agents
from ._agent_limits import AgentLevels, Lookup
from ._agents import HandoffCounter
from ._children import min_limit
from ._cm import AsyncFromSync
from ._config import ExecutionConfig
from ._errors import TripEvent
from ._gc_safe import drain, pending
from ._ledger import (
    Ledger,
    LedgerState,
    Level,
    LocalLedger,
    PoolLevel,
)
from ._options import ChainSnapshot
from ._policy import PolicyPipeline
from ._pools import BudgetPool, PoolRoom, apool_room, pool_room
from ._pricing import PriceTable
from ._timer import CancellationToken, TimerHandle
from ._units import nano_to_usd

__all__ = ["ChainState"]


class _PoolArgs(TypedDict, total=False):
    pools: tuple[PoolLevel, ...]


_NO_POOLS: _PoolArgs = {}
_monotonic = time.monotonic


class ChainState(AsyncFromSync):
    """What a chain holds, and what reading it takes: the bottom of the
    :class:`~veronica_otel.ExecutionContext` stack (``_context.py`` sets the
    state up; the layers above add trips, store polls, settlement, admission
    and the wrap API, each in its own module)."""

    config: ExecutionConfig
    pipeline: PolicyPipeline
    chain_id: str
    name: str
    depth: int
    # The agent levels of this chain tree: made at its first agent-bound call.
    _agent_tree: AgentLevels | None = None
    _agent_lookups: tuple[Lookup, ...]
    _has_policies: bool
    _ledger: Ledger
    # A ledger with coroutine operations (a shared store): async calls await it.
    _aledger: Any
    _pools: tuple[BudgetPool, ...]
    _prices: PriceTable | None
    _parent: ChainState | None
    _started: float
    _trip: TripEvent | None
    _partial: Any
    _token: CancellationToken
    _metrics: bool
    # The chain and its ancestors, root first: what every reservation is checked against.
    _path: tuple[Level, ...]
    _priced: bool
    _repeats_limited: bool
    _deadline: float | None
    _handoffs: HandoffCounter | None
    # A chain with a deadline sets its own; the rest share this default.
    _timer: TimerHandle | None = None
    # A deadline, handoffs or policies: what admission checks before the ledger
    # (fixed when the chain is built; the common chain tests this one flag).
    _checked: bool
    # An in-process root chain with no policies, pools or handoffs: (ledger,
    # level, live counters), the one-level ledger step of begin_priced_call and _finish.
    _fast: tuple[LocalLedger, Level, Any] | None
    # The live counters of every level of the path (in process): ensure_active reads them.
    _live: tuple[Any, ...] | None
    # Store polls for trips made elsewhere (ensure_active): chunks since, time, last ok.
    # Set by a store-backed chain only (an in-process one reads its live counters).
    _unpolled: int = 0
    _polled_at: float = 0.0
    _poll_ok: bool = True

    @property
    def tracks_handoffs(self) -> bool:
        """Whether the chain limits handoffs between agents (``max_handoffs``)."""
        return self._handoffs is not None

    @property
    def names_agents(self) -> bool:
        """Whether a call's span should name its agent (``gen_ai.agent.name``):
        the chain counts handoffs or some agent has limits of its own."""
        return self._handoffs is not None or bool(self._agent_lookups) or _agents._limited_in_code

    @property
    def tracks_repeats(self) -> bool:
        """Whether any level of the chain limits repeated call signatures."""
        return self._repeats_limited

    @property
    def awaits_store(self) -> bool:
        """Whether async calls await the ledger (a shared store; in process, never)."""
        return self._aledger is not None

    @property
    def has_cost_ceiling(self) -> bool:
        return self._priced

    @property
    def trip(self) -> TripEvent | None:
        """The sticky trip of this chain or the nearest tripped ancestor."""
        if self._trip is not None:
            return self._trip
        for level in reversed(self._path):
            trip = self._ledger.snapshot(level.chain_id).trip
            if trip is not None:
                return trip
        return None

    async def asnapshots(self) -> dict[str, LedgerState] | None:
        """The counters of every level with a cost, step or token ceiling, read
        without blocking; None with an in-process ledger (read it directly)."""
        aledger = self._aledger
        if aledger is None:
            return None
        states: dict[str, LedgerState] = {}
        for level in self._path:
            limits = level.limits
            if not (limits.cost_nano is None and limits.tokens is None and limits.steps is None):
                states[level.chain_id] = await aledger.asnapshot(level.chain_id)
        return states

    async def atrip(self) -> TripEvent | None:
        """:attr:`trip` for async code: a shared store is read without blocking."""
        aledger = self._aledger
        if self._trip is not None or aledger is None:
            return self.trip
        for level in reversed(self._path):
            found: TripEvent | None = (await aledger.asnapshot(level.chain_id)).trip
            if found is not None:
                return found
        return None

    @property
    def aborted(self) -> bool:
        return self.trip is not None

    def snapshot(self) -> ChainSnapshot:
        """A frozen view of this chain's counters."""
        if pending:
            drain()
        return self._snapshot_of(self._ledger.snapshot(self.chain_id), self.trip)

    async def asnapshot(self) -> ChainSnapshot:
        """:meth:`snapshot` for async code: a shared store is read without blocking."""
        aledger = self._aledger
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
            elapsed_ms=(_monotonic() - self._started) * 1000,
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
        fast = self._fast
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
        for level in self._path:
            limits = level.limits
            if limits.cost_nano is None and limits.steps is None:
                continue
            state = (
                self._ledger.snapshot(level.chain_id) if states is None else states[level.chain_id]
            )
            if limits.cost_nano is not None:
                left = max(0, limits.cost_nano - state.cost_nano - state.reserved_nano)
                cost_left = left if cost_left is None else min(cost_left, left)
            if limits.steps is not None:
                steps = max(0, limits.steps - state.steps)
                steps_left = steps if steps_left is None else min(steps_left, steps)
        if self._pools:
            if room is None:
                room = pool_room(self._pools)
            cost_left = min_limit(cost_left, room.cost_nano)
            steps_left = min_limit(steps_left, room.steps)
        return cost_left, steps_left

    def remaining_cost_nano(
        self, states: Mapping[str, LedgerState] | None = None, *, pools: bool = True
    ) -> int | None:
        """What the tightest cost ceiling on the path (and, with ``pools``, in the
        chain's pools) has left unreserved, or None (the path's counters from
        ``states``, :meth:`asnapshots`, when given)."""
        remaining = self._path_left(states, tokens=False)
        if pools and self._pools:
            remaining = min_limit(remaining, pool_room(self._pools).cost_nano)
        return remaining

    def remaining_tokens(
        self, states: Mapping[str, LedgerState] | None = None, *, pools: bool = True
    ) -> int | None:
        """What the tightest token ceiling on the path (and, with ``pools``, in the
        chain's pools) has left unreserved, or None (the path's counters from
        ``states``, :meth:`asnapshots`, when given)."""
        remaining = self._path_left(states, tokens=True)
        if pools and self._pools:
            remaining = min_limit(remaining, pool_room(self._pools).tokens)
        return remaining

    def _path_left(self, states: Mapping[str, LedgerState] | None, *, tokens: bool) -> int | None:
        """The tightest unreserved cost (or tokens) left over the path's levels."""
        remaining: int | None = None
        for level in self._path:
            limit = level.limits.tokens if tokens else level.limits.cost_nano
            if limit is None:
                continue
            state = (
                self._ledger.snapshot(level.chain_id) if states is None else states[level.chain_id]
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
        return pool_room(self._pools) if self._pools else None

    async def apool_room(self) -> PoolRoom | None:
        """:meth:`pool_room` for async code: a shared store is read without blocking."""
        return await apool_room(self._pools) if self._pools else None

    @property
    def pools(self) -> tuple[BudgetPool, ...]:
        """The budget pools every call of the chain is also reserved in."""
        return self._pools

    def _pool_args(self) -> _PoolArgs:
        """``pools=`` for a ledger reservation: each pool's current level (new
        limits apply from the next call). Empty for a chain with no pools, so
        a ledger that knows no pools is called as before."""
        if not self._pools:
            return _NO_POOLS
        return {"pools": tuple([pool.level for pool in self._pools])}

    def get_partial_result(self) -> Any:
        """The last result of a wrapped call, or text received before a cut."""
        return self._partial

    def set_partial_result(self, value: Any) -> None:
        """Keep ``value`` as the partial result (streams call this as they go)."""
        self._partial = value

    @property
    def cancellation(self) -> CancellationToken:
        return self._token

    def _elapsed_ms(self) -> float:
        return (_monotonic() - self._started) * 1000
