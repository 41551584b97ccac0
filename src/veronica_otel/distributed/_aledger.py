"""RedisLedger's asyncio operations: the same scripts, the same semantics, no blocking.

``RedisLedger.areserve`` / ``acommit`` / ``arelease`` / ``atrip`` /
``asnapshot`` / ``atrip_lifted`` / ``apool_snapshot`` (thin methods calling
the functions here) are the coroutine versions of the sync operations, for
code running on an event loop (async instrumented calls, ``awrap_*``, async
``ToolCall``, the ASGI middleware). Each builds its script call and reads
the reply with the very plan the sync operation uses (``ChainOps.reserve_op``
/ ``reserved``, ``commit_op`` / ``committed``, ``StoreLink.settle_failed`` /
``settled``, ...); only the round trip differs, through the running loop's
``redis.asyncio`` client (``_aio.py``). A reservation in budget pools, and
its settlement, are plans (generators yielding each round trip, see
``_pools.py``) that the sync path runs with ``drive`` and this module with
:func:`adrive`. Outage queue, fail-closed and fail-open, marks and
re-seeding, commit ids and the heartbeat (its thread keeps async
reservations alive too) are therefore those of the sync path; a ledger that
failed open answers from its local ledger (in process, never blocking).

Cancellation (DESIGN G10: no leaked reservation at any await):

* A reserve cancelled after it was sent may have been applied: a release of
  its id is queued at once (it gives back whatever the store holds and
  refuses a late copy of the reserve) and replayed by a task on the loop,
  or before the next operation, whichever comes first. Nothing is sent.
* A commit or release cancelled mid round trip is queued (commit ids make a
  replay count once) and replayed the same way; then ``CancelledError``
  propagates.
* A cancel that a library below drops (Python 3.11's ``wait_for`` in
  redis-py's send) is raised by the round trip once the reply is in
  (``_aio.LoopClient``), so it takes the same paths.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Generator, Sequence
from functools import partial
from typing import Any, Protocol, TypeVar

import redis
from opentelemetry import context as otel_context

from veronica_otel._errors import TripEvent
from veronica_otel._ledger import Ledger, LedgerState, Level, PoolLevel, PoolSnapshot, Reservation

from ._aio import LoopClient
from ._chain_ops import ChainOps
from ._ids import new_id
from ._link import Pending, StoreLink
from ._marks import acheck_persistence
from ._store import LOCAL, SNAPSHOT_FIELDS, quiet

__all__ = [
    "SyncLedger",
    "adrive",
    "commit",
    "flush",
    "pool_snapshot",
    "release",
    "reserve",
    "snapshot",
    "trip",
    "trip_lifted",
]

_logger = logging.getLogger("veronica_otel.distributed")
_attach = otel_context.attach
_detach = otel_context.detach
_S = TypeVar("_S")
_R = TypeVar("_R")


class SyncLedger(Ledger, Protocol):
    """The sync ledger an async operation falls back to (failed open, or no
    asyncio client for this store): :class:`RedisLedger`."""

    def trip_lifted(self, chain_id: str) -> bool: ...


async def reserve(
    ledger: SyncLedger,
    plan: ChainOps,
    path: Sequence[Level],
    cost_nano: int,
    tokens: int,
    step: bool,
    steps: int,
    retry: bool,
    signature: str | None,
    pools: Sequence[PoolLevel] = (),
) -> Reservation | TripEvent:
    """:meth:`reserve` without blocking the event loop (same raises).

    A call also reserved in budget pools runs the sync path's plan
    (``_pools.py``: one round trip on one server, two phases on a cluster)
    with each round trip awaited.
    """
    link = plan.link
    if link.local is not None or not link.aio.supported:
        return ledger.reserve(
            path,
            cost_nano,
            tokens,
            step=step,
            steps=steps,
            retry=retry,
            signature=signature,
            pools=pools,
        )
    op = plan.reserve_op(path, cost_nano, tokens, step, steps, retry, signature, pools)
    token = _attach(quiet())
    sent = False
    try:
        entry = await link.aio.get()
        if link.pending:
            await _flush(link, entry)
        if not link.checked:
            async with entry.slots:
                link.checked = await acheck_persistence(entry.client, link.store)
        sent = True
        reply: Any = await (
            adrive(plan.pool_plan(op), entry.run)
            if op.pools
            else entry.call(plan.scripts.reserve, op.keys, op.args)
        )
    except redis.RedisError as exc:
        await link.aio.drop_idle()
        return plan.reserve_error(exc, op, sent)
    except asyncio.CancelledError:
        if sent and op.rid:  # it may have been applied: give it back, soon
            plan.cancel(op.path, Reservation(op.rid, 0, 0, op.steps_held, op.retry, op.pools))
            _kick(link)
        raise
    finally:
        _detach(token)
    undo = plan.pool_undo(op, reply)
    if undo is not None:
        await _settle(link, undo)
    return plan.reserved(op, reply)


async def commit(
    ledger: SyncLedger,
    plan: ChainOps,
    path: Sequence[Level],
    reservation: Reservation,
    cost_nano: int,
    tokens: int,
    release_steps: int,
) -> TripEvent | None:
    """:meth:`commit` without blocking the event loop (never raises for an outage)."""
    link = plan.link
    if link.local is not None or not link.aio.supported:
        return ledger.commit(path, reservation, cost_nano, tokens, release_steps=release_steps)
    op = plan.commit_op(path, reservation, cost_nano, tokens, release_steps)
    if reservation.pools:
        pooled = plan.pooled_commit(op, reservation, release_steps)
        return plan.committed(op, await adrive(pooled, partial(_settle, link), link))
    return plan.committed(op, await _settle(link, op))


async def release(
    ledger: SyncLedger, plan: ChainOps, path: Sequence[Level], reservation: Reservation
) -> None:
    """:meth:`release` without blocking the event loop."""
    link = plan.link
    if link.local is not None or not link.aio.supported:
        ledger.release(path, reservation)
        return
    op = plan.release_op(path, reservation)
    if op is None:
        return
    if reservation.pools:
        pooled = plan.settle_pooled(op, reservation, (0, 0, 0), False)
        await adrive(pooled, partial(_settle, link), link)
    else:
        await _settle(link, op)


async def trip(ledger: SyncLedger, plan: ChainOps, chain_id: str, event: TripEvent) -> TripEvent:
    """:meth:`trip` without blocking the event loop."""
    link = plan.link
    if link.local is not None or not link.aio.supported:
        return ledger.trip(chain_id, event)
    key, args = plan.trip_args(chain_id, event)
    reply = await _call(link, chain_id, plan.scripts.trip, [key], args)
    if reply is LOCAL:
        return ledger.trip(chain_id, event)
    return plan.tripped(chain_id, key, event, reply)


async def snapshot(ledger: SyncLedger, plan: ChainOps, chain_id: str) -> LedgerState:
    """:meth:`snapshot` without blocking the event loop."""
    link = plan.link
    if link.local is not None or not link.aio.supported:
        return ledger.snapshot(chain_id)
    key = plan.space.chain(chain_id).chain
    values = await _call(link, chain_id, None, [key], [])
    if values is LOCAL:
        return ledger.snapshot(chain_id)
    return plan.state(chain_id, key, values)


async def trip_lifted(ledger: SyncLedger, plan: ChainOps, chain_id: str) -> bool:
    """:meth:`trip_lifted` without blocking the event loop."""
    link = plan.link
    if link.local is not None or not link.aio.supported:
        return ledger.trip_lifted(chain_id)
    key = plan.space.chain(chain_id).chain
    values = await _call(link, chain_id, None, [key], [])
    if values is LOCAL:
        return ledger.trip_lifted(chain_id)
    return plan.lifted(chain_id, key, values)


async def pool_snapshot(ledger: SyncLedger, plan: ChainOps, pool: PoolLevel) -> PoolSnapshot:
    """:meth:`pool_snapshot` without blocking the event loop."""
    link = plan.link
    if link.local is not None or not link.aio.supported:
        return ledger.pool_snapshot(pool)
    script, keys, args = plan.pools.snapshot_request(pool.name)
    reply = await _call(link, f"(pool {pool.name})", script, keys, args)
    if reply is LOCAL:
        return ledger.pool_snapshot(pool)
    return plan.pools.snapshot_of(pool.name, reply)


async def flush(link: StoreLink) -> int:
    """:meth:`flush` on the running loop; returns how many are still queued."""
    if link.local is None and link.pending and link.aio.supported:
        token = _attach(quiet())
        try:
            await _flush(link, await link.aio.get())
        except redis.RedisError as exc:
            await link.aio.drop_idle()
            link.flush_failed(exc)
        finally:
            _detach(token)
    return len(link.pending)


# -- plumbing ------------------------------------------------------------


async def _settle(link: StoreLink, op: Pending) -> Any:
    token = _attach(quiet())
    try:
        entry = await link.aio.get()
        if link.pending:
            await _flush(link, entry)
        reply: Any = await entry.call(op.script, op.keys, op.args)
    except redis.RedisError as exc:
        await link.aio.drop_idle()
        return link.settle_failed(op, exc)
    except asyncio.CancelledError:
        # Maybe applied, maybe not: replayed by id, so it counts once.
        with link.pending_lock:
            link.pending.append(op)
        _kick(link)
        raise
    finally:
        _detach(token)
    return link.settled(op, reply)


async def _call(
    link: StoreLink, chain_id: str, script: Any, keys: list[str], args: list[str]
) -> Any:
    token = _attach(quiet())
    try:
        entry = await link.aio.get()
        if link.pending:
            await _flush(link, entry)
        if script is None:
            reply: Any = await entry.hmget(keys[0], SNAPSHOT_FIELDS)
        else:
            reply = await entry.call(script, keys, args)
    except redis.RedisError as exc:
        await link.aio.drop_idle()
        return link.call_failed(chain_id, keys, exc)
    finally:
        _detach(token)
    if link.down:
        link.back()
    return reply


async def _flush(link: StoreLink, entry: LoopClient) -> None:
    """Replay queued commits and releases in order (raises on store errors).

    The queue's lock is never held across an await (a task of the same
    thread would block on it): one task of the loop replays at a time,
    and an operation another thread replayed meanwhile replays as a no-op.
    """
    pending = link.pending
    replayed = 0
    async with entry.flushing:
        while True:
            with link.pending_lock:
                if not pending:
                    break
                op = pending[0]
            op.args[-4] = new_id()  # a fresh epoch id per attempt (see ChainOps._settle_args)
            reply: Any = await entry.call(op.script, op.keys, op.args)
            with link.pending_lock:
                if pending and pending[0] is op:
                    pending.popleft()
            replayed += 1
            link.replayed(op, reply)
    if replayed:
        _logger.info("ledger store %s: %d queued commits replayed", link.store, replayed)


async def adrive(
    plan: Generator[_S, Any, _R],
    call: Callable[[_S], Awaitable[Any]],
    queue_rest: StoreLink | None = None,
) -> _R:
    """``_pools.drive`` with each request's reply awaited: the same plan, no blocking.

    ``queue_rest`` (a settlement's link): when a round trip is cancelled,
    the plan's later settlements are queued for replay (``_settle`` queued the
    one in flight), so a cancelled pooled commit still settles every pool.
    """
    try:
        request = next(plan)
        while True:
            try:
                reply = await call(request)
            except asyncio.CancelledError:
                if queue_rest is not None:
                    _queue_rest(queue_rest, plan)
                raise
            request = plan.send(reply)
    except StopIteration as done:
        result: _R = done.value
        return result


def _queue_rest(link: StoreLink, plan: Generator[Any, Any, Any]) -> None:
    """Queue what a settlement plan still had to send (no replies: none came)."""
    try:
        request = plan.send(None)  # the one in flight was queued by _settle
        while True:
            with link.pending_lock:
                link.pending.append(request)
            request = plan.send(None)
    except StopIteration:
        return


def _kick(link: StoreLink) -> None:
    """Replay the queue soon, from a task of the running loop (cancellation paths)."""
    try:
        task = asyncio.get_running_loop().create_task(flush(link))
    except RuntimeError:
        return  # no loop: the next operation replays it
    link.kicks.add(task)
    task.add_done_callback(lambda done: _kicked(link, done))


def _kicked(link: StoreLink, task: asyncio.Task[Any]) -> None:
    link.kicks.discard(task)
    if not task.cancelled() and task.exception() is not None:
        _logger.warning(
            "replaying queued ledger operations failed; the next operation retries",
            exc_info=task.exception(),
        )
