"""The coroutine side of :class:`ExecutionContext`: admission and settlement that await the store.

``ExecutionContext.abegin_call`` / ``abegin_priced_call`` / ``asnapshots`` and
``CallHandle.afinish`` call the functions here. With a ledger that has
coroutine operations (``RedisLedger``: ``areserve``, ``acommit``,
``arelease``, ``asnapshot``, ``atrip_lifted``), an async call's reservation,
settlement and store reads await them, so the event loop is never blocked on
a round trip. Everything around the ledger operation is the sync path's own
code (``_admit_checks`` / ``_admitted`` before and after a reservation,
``settled_amounts`` / ``_finished`` around a commit), so async and sync calls
are admitted and settled alike. With an in-process ledger, which never waits
on I/O, each function is its sync twin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _agents
from ._call import settled_amounts
from ._errors import BudgetExceededError, TripEvent
from ._gc_safe import drain, pending
from ._ledger import LedgerState, Reservation
from ._options import WrapOptions

if TYPE_CHECKING:
    from ._call import CallHandle
    from ._context import ExecutionContext

__all__ = ["begin_call", "begin_priced_call", "consume_retry", "finish", "snapshots", "trip"]

_DEFAULT_OPTIONS = WrapOptions()


async def begin_call(
    ctx: ExecutionContext,
    kind: str,
    options: WrapOptions | None,
    cost_nano: int | None,
) -> CallHandle:
    """:meth:`begin_call` for async code: the reservation never blocks the loop.

    Settle the handle with ``await handle.afinish(...)``.
    """
    if ctx._aledger is None:
        return ctx.begin_call(kind, options, cost_nano=cost_nano)
    if options is None:
        options = _DEFAULT_OPTIONS
    if cost_nano is None:
        cost_nano = ctx._cost_of(options)
    return await begin_priced_call(
        ctx,
        kind,
        options.operation_name,
        options.provider,
        options.model,
        cost_nano,
        options.reserved_tokens,
        retry=options.retry,
        signature=options.signature,
    )


async def begin_priced_call(
    ctx: ExecutionContext,
    kind: str,
    operation_name: str,
    provider: str | None,
    model: str | None,
    cost_nano: int,
    tokens: int,
    retry: bool,
    signature: str | None,
) -> CallHandle:
    """:meth:`begin_priced_call` for async code (same checks, same denials)."""
    aledger = ctx._aledger
    if aledger is None:
        return ctx.begin_priced_call(
            kind,
            operation_name,
            provider,
            model,
            cost_nano,
            tokens,
            retry=retry,
            signature=signature,
        )
    if pending:
        drain()
    if ctx._trip is not None and not await _trip_lifted(ctx):
        raise BudgetExceededError(ctx._trip)
    policy_context, decision = ctx._admit_checks(
        kind, operation_name, provider, model, cost_nano, signature
    )
    agents = ctx._agent_path() if ctx._agent_lookups or _agents._limited_in_code else None
    try:
        reservation = await aledger.areserve(
            ctx._path if agents is None else agents[0],
            cost_nano,
            tokens,
            retry=retry,
            signature=signature,
            **ctx._pool_args(),
        )
    except BaseException:  # the store failed, or we were cancelled: give back the probes
        if policy_context is not None:
            ctx.pipeline.abandon(policy_context)
        raise
    return ctx._admitted(reservation, policy_context, decision, kind, model, agents)


async def finish(
    ctx: ExecutionContext, call: CallHandle, error: BaseException | None, sent: bool
) -> None:
    aledger = ctx._aledger
    if aledger is None:
        ctx._finish(call, error, sent)
        return
    path = ctx._path if call.agents is None else call.agents[0]
    if not sent:
        try:
            await aledger.arelease(path, call.reservation)
        finally:
            ctx._released(call)
        return
    cost, tokens = settled_amounts(call)
    overrun: TripEvent | None = None
    try:
        overrun = await aledger.acommit(path, call.reservation, cost, tokens)
    finally:  # cancelled mid commit: the commit is queued, the call still settles
        ctx._finished(call, error, cost, overrun)


async def consume_retry(ctx: ExecutionContext) -> None:
    """:meth:`ExecutionContext.consume_retry`, the store awaited."""
    aledger = ctx._aledger
    if aledger is None:
        ctx.consume_retry()
        return
    if ctx._trip is not None:
        raise BudgetExceededError(ctx._trip)
    agents = ctx._agent_path() if ctx._agent_lookups or _agents._limited_in_code else None
    path = ctx._path if agents is None else agents[0]
    result = await aledger.areserve(path, 0, 0, step=False, retry=True)
    if not isinstance(result, Reservation):
        if agents is not None:
            ctx._agent_denied(result)  # an agent's own level: that agent's denial
        ctx._tripped(result)


async def _trip_lifted(ctx: ExecutionContext) -> bool:
    """:meth:`_trip_lifted` reading the store without blocking."""
    trip = ctx._trip
    if trip is None or trip.reason == "timeout" or ctx._aledger is None:
        return ctx._trip_lifted()
    if not await ctx._aledger.atrip_lifted(trip.chain_id):
        return False
    return ctx._lift(trip)


async def trip(ctx: ExecutionContext) -> TripEvent | None:
    """:attr:`ExecutionContext.trip`, each level read from the store without blocking."""
    aledger = ctx._aledger
    if ctx._trip is not None or aledger is None:
        return ctx.trip
    for level in reversed(ctx._path):
        found: TripEvent | None = (await aledger.asnapshot(level.chain_id)).trip
        if found is not None:
            return found
    return None


async def snapshots(ctx: ExecutionContext) -> dict[str, LedgerState] | None:
    """The counters of every level with a cost, step or token ceiling, read
    without blocking; None with an in-process ledger (read it directly)."""
    aledger = ctx._aledger
    if aledger is None:
        return None
    states: dict[str, LedgerState] = {}
    for level in ctx._path:
        limits = level.limits
        if not (limits.cost_nano is None and limits.tokens is None and limits.steps is None):
            states[level.chain_id] = await aledger.asnapshot(level.chain_id)
    return states
