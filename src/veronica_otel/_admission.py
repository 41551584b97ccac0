"""Admitting a call: deadline, pipeline and one atomic reservation of its worst case.

The part of :class:`~veronica_otel.ExecutionContext` every door asks before a
call is sent: instrumentors describe an LLM call once (``admit_call``, in
``_llm_admission``), the wrap API, tools, middleware and remote joins reserve
through :meth:`Admission.begin_priced_call`. It reads the chain's state, denies
through its trips record and hands each admitted call to its settlement.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from . import _agents
from ._call import CallHandle, new_call
from ._chain_state import ChainState
from ._chain_trips import ChainTrips
from ._clamp import OutputClamp
from ._config import DEFAULT_RESERVATION_WAIT_S
from ._errors import BudgetExceededError, TripEvent
from ._gc_safe import drain, pending
from ._ledger import (
    Level,
    LocalLedger,
    Reservation,
)
from ._llm_admission import aadmit_call, admit_call
from ._options import WrapOptions
from ._policy import ALLOW, PolicyContext, PolicyDecision
from ._pricing import UnitPrices, default_price_table
from ._settlement import Settlement
from ._units import nano_to_usd

if TYPE_CHECKING:
    from ._pricing import PriceTable

__all__ = ["Admission", "RoomBusy"]

_DEFAULT_OPTIONS = WrapOptions()
_monotonic = time.monotonic
_running_loop = asyncio._get_running_loop

#: How often a call waiting for room reserves again: first, and at most.
ROOM_POLL_FIRST_S = 0.001
ROOM_POLL_MAX_S = 0.02


class RoomBusy(BudgetExceededError):
    """A call refused only by other calls' in-flight reservations, raised
    (instead of waiting) to an async caller that awaits the room itself and
    then admits the call again, until ``until`` (``time.monotonic``). Its
    policies were given back and nothing is held; no trip was announced."""

    def __init__(self, trip: TripEvent, until: float) -> None:
        super().__init__(trip)
        self.until = until


class Admission:
    """The admission half of the kernel: every door (instrumentors, the wrap API,
    tools, middleware, remote joins) asks here before a call is sent."""

    __slots__ = (
        "_agent_lookups",
        "_aledger",
        "_checked",
        "_deadline",
        "_fast",
        "_handoffs",
        "_has_policies",
        "_lane",
        "_ledger",
        "_path",
        "_pipeline",
        "_priced",
        "_prices",
        "_repeats_limited",
        "_settlement",
        "_state",
        "_token",
        "_trips",
    )

    def __init__(self, state: ChainState, trips: ChainTrips, settlement: Settlement) -> None:
        self._state = state
        self._trips = trips
        self._settlement = settlement  # every admitted call's handle settles there
        # Fixed when the chain is made: read per call without a hop through the state.
        self._ledger = state.ledger
        self._aledger: Any = state.aledger
        self._path = state.path
        self._fast = state.fast
        self._pipeline = state.pipeline
        self._token = state.token
        self._deadline = state.deadline
        self._handoffs = state.handoffs
        self._checked = state.checked
        self._has_policies = state.has_policies
        self._agent_lookups = state.agent_lookups
        self._prices: PriceTable | None = state.prices
        self._priced = state.priced
        self._repeats_limited = state.repeats_limited
        # The common chain, decided once: in process, a root with no deadline,
        # handoffs, policies, pools or repeat limit. admit_call reserves its
        # plain calls straight from the ledger (state.fast) with no
        # begin_priced_call frame: (its ledger, its live counters, its limits);
        # None: every call goes there.
        fast = state.fast
        self._lane = (
            (fast[0], fast[2], fast[1].limits)
            if fast is not None and not state.checked and not state.repeats_limited
            else None
        )

    # The LLM door (instrumentors): described once, answered once (_llm_admission).
    admit_call = admit_call
    aadmit_call = aadmit_call

    def begin_call(
        self,
        kind: str = "llm",
        options: WrapOptions | None = None,
        *,
        cost_nano: int | None = None,
    ) -> CallHandle:
        """Admit one call or raise :class:`BudgetExceededError`.

        Runs the deadline, the pipeline and one atomic ledger reservation.
        ``cost_nano`` overrides the reservation computed from ``options``
        (instrumentors pass their own worst case). The caller must call
        ``finish()`` on the returned handle.
        """
        if options is None:
            options = _DEFAULT_OPTIONS
        if cost_nano is None:
            cost_nano = options.hint_nano  # _cost_of, inline: every wrapped call comes here
            if cost_nano == 0 and options.model is not None and self._priced:
                cost_nano = self._worst_case(options)
        return self.begin_priced_call(
            kind,
            options.operation_name,
            options.provider,
            options.model,
            cost_nano,
            options.reserved_tokens,
            retry=options.retry,
            signature=options.signature,
        )

    def begin_priced_call(
        self,
        kind: str,
        operation_name: str,
        provider: str | None,
        model: str | None,
        cost_nano: int,
        tokens: int,
        retry: bool = False,
        signature: str | None = None,
        clamp: OutputClamp | None = None,
        step: bool = True,
        defer: bool = False,
    ) -> CallHandle:
        """:meth:`begin_call` for instrumentors that already priced the call.

        ``cost_nano`` and ``tokens`` are the call's worst case in ledger units
        (non-negative ints, validated by the caller): no options object is
        built on the hot path of every instrumented call. ``retry`` and
        ``signature`` may be passed by position (CPython 3.11 specialises no
        call to a function with keyword-only parameters; the wrap API calls
        this with positions). With ``clamp`` (an in-process ledger only, see
        :meth:`admit_call`) the ledger sizes the call under its lock instead,
        and ``cost_nano`` and ``tokens`` are ignored. ``step=False``: the call
        counts no step (it joined the wrapped call that holds one, see
        :func:`~._call.joins_wrapped_call`); all else is reserved as usual.

        A call refused only by other calls' in-flight reservations waits for
        room (:meth:`_wait_for_room`); with ``defer`` (an async caller on an
        event loop) it raises :class:`RoomBusy` instead, for the caller to
        await the room and admit the call again.
        """
        if pending:
            drain()  # settle what garbage collection left, outside any lock
        state = self._state
        if state.trip is not None and not self._trips.trip_lifted():
            raise BudgetExceededError(state.trip)
        if self._checked or self._token.cancelled:
            policy_context, decision = self._admit_checks(
                kind, operation_name, provider, model, cost_nano, signature, step
            )
        else:  # no deadline, handoffs or policies: nothing for _admit_checks to check
            policy_context, decision = None, ALLOW
        fast = self._fast
        agents = None
        try:
            if clamp is not None:
                if self._agent_lookups or _agents._limited_in_code:
                    agents = self._trips.agent_path()
                reservation = self._reserve_clamped(clamp, agents, signature, step)
            elif (
                fast is not None
                and signature is None
                and not retry
                and step
                and not _agents._limited_in_code
            ):
                # In process, a root with no policies (so no agent lookups) and
                # no pools: the ledger's one-level reservation.
                reservation = fast[0].plain_step(
                    fast[2], fast[1].limits, cost_nano, tokens
                ) or fast[0].reserve(self._path, cost_nano, tokens)
            else:
                if self._agent_lookups or _agents._limited_in_code:
                    agents = self._trips.agent_path()
                reservation = self._ledger.reserve(
                    self._path if agents is None else agents[0],
                    cost_nano,
                    tokens,
                    step=step,
                    retry=retry,
                    signature=signature,
                    **self._state.pool_args(),
                )
        except BaseException:  # the store failed: give back what policies took
            if policy_context is not None:
                self._pipeline.abandon(policy_context)
            raise
        if type(reservation) is Reservation and agents is None and not state.metrics:
            # the common case
            return new_call(CallHandle, self._settlement, reservation, policy_context, decision)
        if type(reservation) is TripEvent and not reservation.sticky:
            until = self._room_wait_until(reservation)
            if until is not None:
                if defer:
                    if policy_context is not None:
                        self._pipeline.abandon(policy_context)
                    raise RoomBusy(reservation, until)
                path = self._path if agents is None else agents[0]
                reservation = self._wait_for_room(
                    reservation, until, path, cost_nano, tokens, retry, signature, clamp, step
                )
        return self._admitted(reservation, policy_context, decision, kind, model, agents)

    # The refusal path: a call refused only by in-flight reservations.

    def _room_wait_until(self, denial: TripEvent) -> float | None:
        """When a call ``denial`` refused (not sticky) stops waiting for room;
        None: it does not wait (waiting off, a windowed pool's denial, the
        chain cancelled)."""
        if denial.retry_after_s is not None or self._token.cancelled:
            return None  # a pool's window frees it, not a settlement: retry_after_s says when
        wait = self._state.config.reservation_wait_s
        wait = DEFAULT_RESERVATION_WAIT_S if wait is None else wait
        if wait <= 0:
            return None
        until = _monotonic() + wait
        return until if self._deadline is None else min(until, self._deadline)

    def room_polls(self, until: float) -> Iterator[float]:
        """The pauses before each new ask for room: doubling from
        :data:`ROOM_POLL_FIRST_S` to :data:`ROOM_POLL_MAX_S`, until ``until``
        or the chain is cancelled."""
        delay = ROOM_POLL_FIRST_S
        while True:
            left = until - _monotonic()
            if left <= 0 or self._token.cancelled:
                return
            yield min(delay, left)
            delay = min(2 * delay, ROOM_POLL_MAX_S)

    def _wait_for_room(
        self,
        denial: TripEvent,
        until: float,
        path: tuple[Level, ...],
        cost_nano: int,
        tokens: int,
        retry: bool,
        signature: str | None,
        clamp: OutputClamp | None,
        step: bool,
    ) -> Reservation | TripEvent:
        """Reserve again as calls in flight settle, until it fits, it is refused
        on committed spend (a sticky trip), or ``until``. Not on an event
        loop's thread: sleeping there would stop the very calls it waits for
        (async callers await the room instead, see :class:`RoomBusy`)."""
        if _running_loop() is not None:
            return denial
        result: Reservation | TripEvent = denial
        for pause in self.room_polls(until):
            time.sleep(pause)
            if clamp is not None:
                clamp.reset()
                result = cast(LocalLedger, self._ledger).reserve(
                    path,
                    0,
                    0,
                    step=step,
                    signature=signature,
                    clamp=clamp,
                    **self._state.pool_args(),
                )
            else:
                result = self._ledger.reserve(
                    path,
                    cost_nano,
                    tokens,
                    step=step,
                    retry=retry,
                    signature=signature,
                    **self._state.pool_args(),
                )
            if type(result) is not TripEvent or result.sticky:
                break
        return result

    async def _await_room(
        self,
        denial: TripEvent,
        until: float,
        path: tuple[Level, ...],
        cost_nano: int,
        tokens: int,
        retry: bool,
        signature: str | None,
        step: bool,
    ) -> Reservation | TripEvent:
        """:meth:`_wait_for_room` on a shared store, awaited."""
        aledger = self._aledger
        result: Reservation | TripEvent = denial
        for pause in self.room_polls(until):
            await asyncio.sleep(pause)
            result = await aledger.areserve(
                path,
                cost_nano,
                tokens,
                step=step,
                retry=retry,
                signature=signature,
                **self._state.pool_args(),
            )
            if type(result) is not TripEvent or result.sticky:
                break
        return result

    def _reserve_clamped(
        self,
        clamp: OutputClamp,
        agents: tuple[tuple[Level, ...], str] | None,
        signature: str | None,
        step: bool,
    ) -> Reservation | TripEvent:
        """``begin_priced_call``'s reservation of a call the in-process ledger sizes."""
        ledger = cast(LocalLedger, self._ledger)
        path = self._path if agents is None else agents[0]
        return ledger.reserve(
            path, 0, 0, step=step, signature=signature, clamp=clamp, **self._state.pool_args()
        )

    # Shared by begin_priced_call and abegin_priced_call.

    def _admit_checks(
        self,
        kind: str,
        operation_name: str,
        provider: str | None,
        model: str | None,
        cost_nano: int,
        signature: str | None,
        step: bool = True,
    ) -> tuple[PolicyContext | None, PolicyDecision]:
        """Deadline, cancellation, handoffs and the pipeline, before the reservation."""
        if self._deadline is not None and _monotonic() >= self._deadline:
            self._trips.deny_timeout()
        if self._token.cancelled:
            self._trips.deny_timeout()
        if self._handoffs is not None:
            self._trips.check_handoff(self._handoffs)
        policy_context: PolicyContext | None = None
        decision = ALLOW
        if self._has_policies:
            policy_context = PolicyContext(
                chain_id=self._state.chain_id,
                kind=kind,
                operation_name=operation_name,
                provider=provider,
                model=model,
                estimated_cost_usd=nano_to_usd(cost_nano),
                signature=signature,
                step=step,
            )
            try:
                decision = self._pipeline.evaluate(policy_context)
            except BaseException:  # a policy raised: free the probes the earlier ones took
                self._pipeline.abandon(policy_context)
                raise
            if not decision.allowed:
                self._trips.deny_policy(decision)
        return policy_context, decision

    def _admitted(
        self,
        reservation: Reservation | TripEvent,
        policy_context: PolicyContext | None,
        decision: PolicyDecision,
        kind: str,
        model: str | None,
        agents: tuple[tuple[Level, ...], str] | None,
        stored: bool = False,
    ) -> CallHandle:
        """The call's handle, or the denial raised (its policy probes given back;
        an agent's own level denied it: that agent's denial, the chain goes on)."""
        if type(reservation) is not Reservation:
            if policy_context is not None:
                self._pipeline.abandon(policy_context)
            if agents is not None:
                self._trips.agent_denied(reservation)  # type: ignore[arg-type]
            self._trips.tripped(reservation, stored=stored)  # type: ignore[arg-type]
        call = new_call(CallHandle, self._settlement, reservation, policy_context, decision)  # type: ignore[arg-type]
        if agents is not None:
            call.agents = agents
        if self._state.metrics:
            call.metrics = True
            call.kind = kind
            call.model = model
        return call

    async def abegin_call(
        self, kind: str = "llm", options: WrapOptions | None = None, *, cost_nano: int | None = None
    ) -> CallHandle:
        """:meth:`begin_call` for async code: the reservation never blocks the
        event loop. Settle the handle with ``await handle.afinish(...)``."""
        if options is None:
            options = _DEFAULT_OPTIONS
        if cost_nano is None:
            cost_nano = self._cost_of(options)
        if self._aledger is None:  # in process: nothing to await but room, if it must wait
            return await self._abegin_local(kind, options, cost_nano)
        return await self.abegin_priced_call(
            kind,
            options.operation_name,
            options.provider,
            options.model,
            cost_nano,
            options.reserved_tokens,
            retry=options.retry,
            signature=options.signature,
        )

    async def _abegin_local(self, kind: str, options: WrapOptions, cost_nano: int) -> CallHandle:
        """:meth:`abegin_call` in process: a call refused only by in-flight
        reservations awaits their settlement (:class:`RoomBusy`), then asks again."""

        def ask(defer: bool) -> CallHandle:
            return self.begin_priced_call(
                kind,
                options.operation_name,
                options.provider,
                options.model,
                cost_nano,
                options.reserved_tokens,
                options.retry,
                options.signature,
                defer=defer,
            )

        try:
            return ask(True)
        except RoomBusy as busy:
            until = busy.until  # the first refusal's: each ask would start its own
        for pause in self.room_polls(until):
            await asyncio.sleep(pause)
            try:
                return ask(True)
            except RoomBusy:
                continue
        return ask(False)  # the last ask: refused (and announced) as any call

    async def abegin_priced_call(
        self,
        kind: str,
        operation_name: str,
        provider: str | None,
        model: str | None,
        cost_nano: int,
        tokens: int,
        *,
        retry: bool = False,
        signature: str | None = None,
        step: bool = True,
    ) -> CallHandle:
        """:meth:`begin_priced_call` for async code (same checks, same denials)."""
        aledger = self._aledger
        if aledger is None:
            return self.begin_priced_call(
                kind,
                operation_name,
                provider,
                model,
                cost_nano,
                tokens,
                retry=retry,
                signature=signature,
                step=step,
            )
        if pending:
            drain()
        if self._state.trip is not None and not await self._trips.atrip_lifted():
            raise BudgetExceededError(self._state.trip)
        policy_context, decision = self._admit_checks(
            kind, operation_name, provider, model, cost_nano, signature, step
        )
        agents = (
            self._trips.agent_path() if self._agent_lookups or _agents._limited_in_code else None
        )
        try:
            reservation = await aledger.areserve(
                self._path if agents is None else agents[0],
                cost_nano,
                tokens,
                step=step,
                retry=retry,
                signature=signature,
                **self._state.pool_args(),
            )
        except BaseException:  # the store failed, or we were cancelled: give back the probes
            if policy_context is not None:
                self._pipeline.abandon(policy_context)
            raise
        if type(reservation) is TripEvent and not reservation.sticky:
            until = self._room_wait_until(reservation)
            if until is not None:
                path = self._path if agents is None else agents[0]
                reservation = await self._await_room(
                    reservation, until, path, cost_nano, tokens, retry, signature, step
                )
        stored = type(reservation) is TripEvent and self._trips.pool_trip(reservation)
        if stored:  # the chain's trip, stored without blocking (the first trip wins)
            reservation = await aledger.atrip(self._state.chain_id, reservation)
        return self._admitted(reservation, policy_context, decision, kind, model, agents, stored)

    def consume_retry(self) -> None:
        """Draw one retry from ``max_retries_total`` or raise BudgetExceededError."""
        if self._state.trip is not None:
            raise BudgetExceededError(self._state.trip)
        agents = (
            self._trips.agent_path() if self._agent_lookups or _agents._limited_in_code else None
        )
        path = self._path if agents is None else agents[0]
        result = self._ledger.reserve(path, 0, 0, step=False, retry=True)
        if type(result) is not Reservation:
            if agents is not None:
                self._trips.agent_denied(result)  # type: ignore[arg-type]
            self._trips.tripped(result)  # type: ignore[arg-type]

    async def aconsume_retry(self) -> None:
        """:meth:`consume_retry` for async code: a shared store is awaited."""
        aledger = self._aledger
        if aledger is None:
            self.consume_retry()
            return
        if self._state.trip is not None:
            raise BudgetExceededError(self._state.trip)
        agents = (
            self._trips.agent_path() if self._agent_lookups or _agents._limited_in_code else None
        )
        path = self._path if agents is None else agents[0]
        result = await aledger.areserve(path, 0, 0, step=False, retry=True)
        if not isinstance(result, Reservation):
            if agents is not None:
                self._trips.agent_denied(result)  # an agent's own level: that agent's denial
            self._trips.tripped(result)

    def prices_for(self, provider: str | None, model: str) -> UnitPrices | None:
        """Unit prices for a model; denies (reason ``cost``) an unknown model under
        a cost ceiling. Returns None when the chain has no cost ceiling and the
        model has no price (usage is then counted in tokens only)."""
        table = self._prices if self._prices is not None else default_price_table()
        prices = table.lookup(provider, model)
        if prices is None and self._priced:
            self._lookup(provider, model)
        return prices

    def _cost_of(self, options: WrapOptions) -> int:
        """What a call described by ``options`` reserves (its hint, else its worst case)."""
        cost_nano = options.hint_nano
        if options.model is not None and self._priced and cost_nano == 0:
            cost_nano = self._worst_case(options)
        return cost_nano

    def _worst_case(self, options: WrapOptions) -> int:
        prices = self._lookup(options.provider, options.model)
        return prices.max_cost_nano(options.input_tokens or 0, options.max_tokens or 0)

    def _lookup(self, provider: str | None, model: str | None) -> UnitPrices:
        table = self._prices if self._prices is not None else default_price_table()
        prices = table.lookup(provider, model) if model is not None else None
        if prices is None:
            self._trips.deny(
                "cost",
                self._state.config.max_cost_usd or 0.0,
                float("inf"),
                f"no known price for model {model!r} (provider {provider!r}); a model "
                "with no price is never free: map the name to a priced model "
                '(VERONICA_MODEL_ALIASES="name=gpt-4o", or [models] "name" = "gpt-4o" '
                'in the policy file), price it ([prices."name"] in the policy file or '
                "a price_table), or set VERONICA_UNKNOWN_MODEL_PRICE",
                sticky=False,
            )
        return prices  # type: ignore[return-value]
