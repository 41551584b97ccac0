"""Admitting one LLM call described once: the instrumentors' door to the kernel.

An instrumentor describes a call (:class:`~._call_spec.CallSpec`: provider,
model, input bound, requested cap, choices) and asks once; the answer
(:class:`~._call_spec.Admitted`) carries the reservation, the cap to send, the
clamp and the pool that set it, a policy's fallback model and the prices to
settle with. The reservation itself is :meth:`Admission.begin_priced_call`'s,
the one every door shares.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from . import _agents, _pricing
from ._breaker import CircuitBreaker, CircuitState
from ._call import ACTIVE_CALL, CallHandle, PlainCall, joins_wrapped_call
from ._call_spec import Admitted, CallSpec, call_signature
from ._clamp import OutputClamp
from ._gc_safe import pending
from ._ledger import LedgerState, LocalLedger
from ._policy import ALLOW
from ._pools import PoolRoom, pool_room
from ._pricing import _PER_MTOK, DEFAULT_MAX_OUTPUT_TOKENS, UnitPrices, default_price_table
from ._telemetry import _calls, metrics_live
from ._units import MAX_COUNT

if TYPE_CHECKING:
    from ._admission import Admission

__all__ = ["aadmit_call", "admit_call"]

_new = object.__new__
_answer = tuple.__new__  # an Admitted without a Python-level __new__ (once per call)
_CLOSED = CircuitState.CLOSED
_active_call = ACTIVE_CALL.get  # bound once: one C call per admission


# One frame for the common call by design (issue 26): the ledger's plain step, inline.
def admit_call(  # noqa: PLR0915
    self: Admission,
    spec: CallSpec,
    breaker: CircuitBreaker | None = None,
    probe: object = None,
    defer: bool = False,
) -> Admitted:
    """Admit one described LLM call, or raise :class:`BudgetExceededError`.

    The whole pre-call check, in order: the endpoint's ``breaker``
    (``probe`` names this call if it becomes the half-open probe; the
    caller frees it on any failure), the model's prices, the output clamp
    of an uncapped call, the deadline, policies and agents, one
    reservation of the call's worst case, then a policy's degradation (a
    lower cap; a fallback model, priced: one with no price denies and the
    reservation is released). In process the room the clamp reads and the
    reservation are one step under the ledger's lock; on a shared store
    the room is read just before the reservation script runs.

    Inside a ``wrap_llm_call`` of this chain, the first such call is the
    wrapped call and counts no step of its own (the wrap holds it); its
    worst case is reserved all the same (DESIGN G13,
    :func:`~._call.joins_wrapped_call`).

    A call refused only by other calls' in-flight reservations waits for
    them to settle; with ``defer`` it raises
    :class:`~._admission.RoomBusy` instead (an async caller awaits the
    room, then asks again).
    """
    # One read of the spec (a NamedTuple's fields are descriptors: one unpack
    # is cheaper than their reads).
    provider, operation, model, bound, cap, clampable, choices, _, _, parts, cache_writes = spec
    # _endpoint_prices without its three frames in the common case: a closed
    # breaker (check()'s own first test) and a model the table has priced
    # (its lookup cache, read as lookup reads it). Anything else goes there.
    table = self._prices
    if table is None:
        table = _pricing._default_table or default_price_table()
    prices = table._cache.get((provider, model))
    if prices is None or (
        breaker is not None
        and (type(breaker) is not CircuitBreaker or breaker._state is not _CLOSED)
    ):  # a shared (Redis) breaker, or a local one not closed: the full path
        prices = _endpoint_prices(self, spec, breaker, probe)
    clamp: OutputClamp | None = None
    pool: str | None = None
    if cap is None and clampable:
        clamp, clamped = _output_clamp(spec, prices), True
        if type(self._ledger) is LocalLedger and not self._has_policies:
            cost_nano = tokens = 0  # sized by the ledger, under its lock
        else:  # a store, or policies that judge the cost before it is reserved
            _read_room(self, clamp, None)
            cost_nano, tokens = clamp.size()
            cap, pool, clamp = clamp.cap, clamp.pool, None
    else:
        clamped = False
        output = 0 if cap is None else (cap * choices if choices > 1 else cap)
        if prices is None:
            cost_nano = 0
        else:
            worst = prices._untiered
            if (
                worst is not None
                and type(output) is int
                and 0 <= output <= MAX_COUNT
                and 0 <= bound <= MAX_COUNT
            ):  # UnitPrices.max_cost_nano of an untiered price, its checks first
                cost_nano = -(
                    -(bound * (worst[0] if cache_writes else worst[1]) + output * worst[2])
                    // _PER_MTOK
                )
            else:
                cost_nano = prices.max_cost_nano(bound, output, cache_writes)
        tokens = bound + output
        lane = self._lane
        if (
            lane is not None
            and not pending  # nothing left by garbage collection to settle first
            and self._state.trip is None
            and not self._token.cancelled
            and not _agents._limited_in_code
            # (A recording chain span, state.metrics, is no reason to leave: an
            # instrumented call's metric follows metrics_live() either way.)
            and _active_call() is None  # no wrapped call to join: a step of its own
        ):
            # begin_priced_call's common case, in this frame: the chain's one
            # ledger level stepped (None: anything unusual, asked the general
            # way). The lane's chain has no policies, agents or pools, so the
            # call settles there too (PlainCall.commit).
            ledger, live, limits = lane
            reservation = ledger.plain_step(live, limits, cost_nano, tokens)
            if reservation is not None:
                # new_call(PlainCall, settlement, reservation, None, ALLOW), its
                # model and metric flag, in this frame: every field
                # CallHandle.__new__ sets (once per call).
                handle: CallHandle = _new(PlainCall)
                handle.context, handle.reservation, handle.decision, handle.model = (
                    self._settlement,
                    reservation,
                    ALLOW,
                    model,
                )
                handle.policy_context = handle.agents = None
                handle.cost_nano = handle.tokens = -1
                # metrics_live(), inline: an instrumented call records its metric
                handle.metrics, handle._done, handle.kind = (
                    getattr(_calls, "_real_instrument", _calls) is not None,
                    False,
                    "llm",
                )
                return _answer(Admitted, (handle, cap, None, None, None, prices))
    signature = call_signature(model, parts) if self._repeats_limited else None
    handle = self.begin_priced_call(
        "llm",
        operation,
        provider,
        model,
        cost_nano,
        tokens,
        False,  # retry; by position, so CPython 3.11 specialises the call
        signature,
        clamp,
        # No wrapped call around it (one read): nothing to join, a step of its own.
        _active_call() is None or not joins_wrapped_call(self._settlement),
        defer,
    )
    # An instrumented call: telemetry is worth its cost here, once recorded.
    handle.metrics = metrics_live()
    handle.model = model
    if clamp is not None:
        cap, pool = clamp.cap, clamp.pool
    if handle.decision is ALLOW:  # no policy degraded it (the common case)
        return _answer(Admitted, (handle, cap, cap if clamped else None, pool, None, prices))
    try:
        return _degraded(self, spec, handle, prices, cap, pool, clamped)
    except BaseException as exc:  # a fallback with no price: denied, nothing sent
        handle.finish(exc, sent=False)
        raise


async def aadmit_call(
    self: Admission, spec: CallSpec, breaker: CircuitBreaker | None = None, probe: object = None
) -> Admitted:
    """:meth:`admit_call` for async code: a shared store is awaited (the room
    read for a clamp too), never blocked on. Settle with ``afinish``/``acommit``."""
    if self._aledger is None:  # in process: nothing to await
        return self.admit_call(spec, breaker, probe)
    prices = _endpoint_prices(self, spec, breaker, probe)
    signature = call_signature(spec.model, spec.input_parts) if self._repeats_limited else None
    cap = spec.requested_cap
    clamped = False
    pool: str | None = None
    if cap is None and spec.clampable:
        clamp = _output_clamp(spec, prices)
        _read_room(self, clamp, await self._state.asnapshots(), await self._state.apool_room())
        cost_nano, tokens = clamp.size()
        cap, pool, clamped = clamp.cap, clamp.pool, True
    else:
        output = 0 if cap is None else cap * (spec.choices if spec.choices > 1 else 1)
        cost_nano = (
            0
            if prices is None
            else prices.max_cost_nano(spec.input_bound, output, spec.cache_writes)
        )
        tokens = spec.input_bound + output
    handle = await self.abegin_priced_call(
        "llm",
        spec.operation,
        spec.provider,
        spec.model,
        cost_nano,
        tokens,
        signature=signature,
        step=not joins_wrapped_call(self._settlement),
    )
    handle.metrics = metrics_live()
    handle.model = spec.model
    try:
        return _degraded(self, spec, handle, prices, cap, pool, clamped)
    except BaseException as exc:
        await handle.afinish(exc, sent=False)
        raise


def _endpoint_prices(
    self: Admission, spec: CallSpec, breaker: CircuitBreaker | None, probe: object
) -> UnitPrices | None:
    """The endpoint's breaker, then the model's prices (either may deny)."""
    if breaker is not None:
        verdict = breaker.check(probe)
        if not verdict.allowed:
            self._trips.deny(
                "circuit_open",
                0.0,
                0.0,
                f"endpoint {spec.provider}/{spec.model} is failing; {verdict.reason}",
                sticky=False,
            )
    table = self._prices if self._prices is not None else default_price_table()
    prices = table.lookup(spec.provider, spec.model)
    if prices is None and self._priced:
        self._lookup(spec.provider, spec.model)  # denies: no price under a cost ceiling
    return prices


def _output_clamp(spec: CallSpec, prices: UnitPrices | None) -> OutputClamp:
    bound = spec.input_bound
    if prices is None:  # no cost ceiling and no price: only tokens bound it
        return OutputClamp(bound, 0, 0, False, spec.choices, DEFAULT_MAX_OUTPUT_TOKENS)
    input_price, output_price = prices._worst_prices(bound, spec.cache_writes)
    return OutputClamp(
        bound, input_price, output_price, True, spec.choices, prices.output_limit(bound)
    )


def _read_room(
    self: Admission,
    clamp: OutputClamp,
    states: Mapping[str, LedgerState] | None,
    room: PoolRoom | None = None,
) -> None:
    """Feed ``clamp`` the room the chain's levels and pools have (a shared
    store: read, one snapshot a level and a pool; ``states`` from
    :meth:`asnapshots` and ``room`` from :meth:`apool_room` when given)."""
    if states is None:  # one read a limited level, shared by both measures
        states = {
            level.chain_id: self._ledger.snapshot(level.chain_id)
            for level in self._path
            if level.limits.cost_nano is not None or level.limits.tokens is not None
        }
    clamp.room(
        self._state.path_left(states, tokens=False), self._state.path_left(states, tokens=True)
    )
    pools = self._state.pools
    if pools:
        if room is None:
            room = pool_room(pools)
        clamp.room(room.cost_nano, None, room.cost_pool)
        clamp.room(None, room.tokens, room.tokens_pool)


def _degraded(
    self: Admission,
    spec: CallSpec,
    handle: CallHandle,
    prices: UnitPrices | None,
    cap: int | None,
    pool: str | None,
    clamped: bool,
) -> Admitted:
    """The answer to an admitted call, with its policy's degradation applied
    (a lower cap; a fallback model and its prices: none denies)."""
    decision = handle.decision
    if decision.max_tokens is not None and spec.clampable:
        cap = decision.max_tokens if cap is None else min(cap, decision.max_tokens)
        clamped = True
    fallback = decision.fallback_model
    call_prices = prices
    if fallback is None or fallback == spec.model:
        fallback = None
    else:
        call_prices = self.prices_for(spec.provider, fallback) or prices  # None: denied
    return Admitted(handle, cap, cap if clamped else None, pool, fallback, call_prices)
