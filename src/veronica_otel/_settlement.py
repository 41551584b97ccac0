"""Settling a call: commit what it used (or release what it never sent), and usage reports.

The part of :class:`~veronica_otel.ExecutionContext` every
:class:`~._call.CallHandle` settles through (its ``context``): one commit or
release per call, per the G10 table.
"""

from __future__ import annotations

from . import _agents
from ._call import (
    ACTIVE_CALL,
    CallHandle,
    settled_amounts,
)
from ._chain_span import remaining_attributes
from ._chain_state import ChainState
from ._chain_trips import ChainTrips
from ._errors import BudgetExceededError, TripEvent
from ._ledger import (
    Reservation,
)
from ._pricing import default_price_table
from ._telemetry import record_call
from ._trips import emit_trip
from ._units import check_count, check_usd, nano_to_usd, usd_to_nano

__all__ = ["Settlement"]

_NO_RESERVATION = Reservation("", 0, 0)


class Settlement:
    """The settlement half of the kernel: one commit or release per call (DESIGN G10)."""

    __slots__ = ("_fast", "_ledger", "_path", "_pipeline", "_state", "_trips", "aledger")

    def __init__(self, state: ChainState, trips: ChainTrips) -> None:
        self._state = state
        self._trips = trips
        # Fixed when the chain is made: read per call without a hop through the state.
        self._ledger = state.ledger
        self._path = state.path
        self._fast = state.fast
        self._pipeline = state.pipeline
        # A shared store's coroutine ledger (CallHandle.afinish awaits it), or None.
        self.aledger = state.aledger

    def settle(self, call: CallHandle, error: BaseException | None, sent: bool) -> None:
        reservation = call.reservation
        if not sent:
            agents = call.agents
            try:
                self._ledger.release(self._path if agents is None else agents[0], reservation)
            finally:
                self._released(call)
            return
        cost = call.cost_nano
        tokens = call.tokens
        if cost < 0 and tokens < 0:  # no usage reported: its reservation (settled_amounts)
            cost = reservation.cost_nano
            tokens = reservation.tokens
        else:  # max(x, 0) each, without the calls
            cost, tokens = (cost if cost > 0 else 0), (tokens if tokens > 0 else 0)
        fast = self._fast
        agents = call.agents
        if fast is not None and agents is None:
            ledger, level, state = fast
            overrun = ledger.commit_one(level, state, reservation, cost, tokens)
        else:
            path = self._path if agents is None else agents[0]
            overrun = self._ledger.commit(path, reservation, cost, tokens)
        if overrun is not None or call.metrics or call.policy_context is not None:
            self._finished(call, error, cost, overrun)

    async def asettle(self, call: CallHandle, error: BaseException | None, sent: bool) -> None:
        """:meth:`settle` awaiting a shared store (``CallHandle.afinish``)."""
        aledger = self.aledger
        if aledger is None:
            self.settle(call, error, sent)
            return
        path = self._path if call.agents is None else call.agents[0]
        if not sent:
            try:
                await aledger.arelease(path, call.reservation)
            finally:
                self._released(call)
            return
        cost, tokens = settled_amounts(call)
        overrun: TripEvent | None = None
        try:
            overrun = await aledger.acommit(path, call.reservation, cost, tokens)
        finally:  # cancelled mid commit: the commit is queued, the call still settles
            self._finished(call, error, cost, overrun)

    def _released(self, call: CallHandle) -> None:
        if call.policy_context is not None:
            self._pipeline.abandon(call.policy_context)

    def _finished(
        self, call: CallHandle, error: BaseException | None, cost: int, overrun: TripEvent | None
    ) -> None:
        """What follows a commit: metrics, the pipeline's outcome, an overrun's trip
        (an agent's own level overran: that agent's, not the chain's)."""
        if call.metrics:
            record_call(call.kind, nano_to_usd(cost), error is not None, call.model)
        if call.policy_context is not None:
            call.policy_context.actual_cost_usd = nano_to_usd(cost)
            if error is None:
                self._pipeline.record_success(call.policy_context)
            elif isinstance(error, BudgetExceededError) or not isinstance(error, Exception):
                # Our own denial, a cancellation or KeyboardInterrupt says nothing
                # about the endpoint's health: free the probe, count no failure.
                self._pipeline.abandon(call.policy_context)
            else:
                self._pipeline.record_failure(call.policy_context, error)
        if overrun is not None and not (
            call.agents is not None and self._trips.agent_denied(overrun, raise_error=False)
        ):
            self._state.trip = overrun
            emit_trip(overrun, remaining=remaining_attributes(self._state))

    def record_usage(
        self,
        *,
        cost_usd: float | None = None,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cached_input_tokens: int = 0,
        reasoning_tokens: int = 0,
        model: str | None = None,
        provider: str | None = None,
    ) -> None:
        """``ExecutionContext.record_usage``: into the running call of this chain,
        else committed to the chain directly (priced from ``model`` when no
        ``cost_usd``; an unpriced model under a cost ceiling trips the chain)."""
        for name, value in (
            ("input_tokens", input_tokens),
            ("output_tokens", output_tokens),
            ("cached_input_tokens", cached_input_tokens),
            ("reasoning_tokens", reasoning_tokens),
        ):
            check_count(name, value)
        if cached_input_tokens > input_tokens:
            raise ValueError(
                f"cached_input_tokens ({cached_input_tokens}) cannot exceed "
                f"input_tokens ({input_tokens})"
            )
        if reasoning_tokens > output_tokens:
            raise ValueError(
                f"reasoning_tokens ({reasoning_tokens}) cannot exceed "
                f"output_tokens ({output_tokens})"
            )
        if cost_usd is not None:
            cost_nano = usd_to_nano(check_usd("cost_usd", cost_usd))
        elif model is not None:
            cost_nano = self._price_usage(
                provider, model, input_tokens, output_tokens, cached_input_tokens, reasoning_tokens
            )
        else:
            cost_nano = 0
        tokens = input_tokens + output_tokens
        call = ACTIVE_CALL.get()
        if call is not None and call.context is self:
            call.add_usage(cost_nano, tokens)
            return
        held = _NO_RESERVATION
        state = self._state
        if state.pools:  # the chain's pools count it too
            held = Reservation("", 0, 0, pools=state.pool_args()["pools"])
        agents = (
            self._trips.agent_path() if state.agent_lookups or _agents._limited_in_code else None
        )
        path = self._path if agents is None else agents[0]
        overrun = self._ledger.commit(path, held, cost_nano, tokens)
        if overrun is not None and not (
            agents is not None and self._trips.agent_denied(overrun, raise_error=False)
        ):
            self._trips.tripped(overrun, raise_error=False)

    def _price_usage(
        self,
        provider: str | None,
        model: str,
        input_tokens: int,
        output_tokens: int,
        cached: int,
        reasoning: int,
    ) -> int:
        state = self._state
        table = state.prices if state.prices is not None else default_price_table()
        prices = table.lookup(provider, model)
        if prices is not None:
            return prices.cost_nano(input_tokens, output_tokens, cached, reasoning)
        if state.priced:
            self._trips.deny(
                "cost",
                state.config.max_cost_usd or 0.0,
                float("inf"),
                f"usage reported for model {model!r} with no known price; the chain is "
                "stopped because its spend can no longer be counted",
                raise_error=False,
            )
        return 0
