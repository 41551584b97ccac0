"""RedisLedger's asyncio operations: the same scripts, the same semantics, no blocking.

``areserve`` / ``acommit`` / ``arelease`` / ``atrip`` / ``asnapshot`` /
``atrip_lifted`` are the coroutine versions of the sync operations, for code
running on an event loop (async instrumented calls, ``awrap_*``, async
``ToolCall``, the ASGI middleware). Each builds its script call and reads the
reply with the very helpers the sync operation uses (``_reserve_op`` /
``_reserved``, ``_commit_op`` / ``_committed``, ``_settle_failed`` /
``_settled``, ...); only the round trip differs, through the running loop's
``redis.asyncio`` client (``_aio.py``). Outage queue, fail-closed and
fail-open, marks and re-seeding, commit ids and the heartbeat are therefore
those of the sync path; a ledger that failed open answers from its local
ledger (in process, never blocking).

Cancellation (DESIGN G10: no leaked reservation at any await):

* A reserve cancelled after it was sent may have been applied: a release of
  its id is queued at once (it gives back whatever the store holds and
  refuses a late copy of the reserve) and replayed by a task on the loop,
  or before the next operation, whichever comes first. Nothing is sent.
* A commit or release cancelled mid round trip is queued (commit ids make a
  replay count once) and replayed the same way; then ``CancelledError``
  propagates.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis
from opentelemetry import context as otel_context

from veronica_otel._errors import TripEvent
from veronica_otel._ledger import LedgerState, Level, Reservation

from . import _ledger as _sync  # a cycle: RedisLedger's base is defined here
from ._aio import AsyncClients, LoopClient
from ._marks import acheck_persistence
from ._store import quiet

if TYPE_CHECKING:
    from ._ledger import RedisLedger, _Pending

__all__ = ["AsyncLedgerOps"]

_logger = logging.getLogger("veronica_otel.distributed")
_attach = otel_context.attach
_detach = otel_context.detach


class AsyncLedgerOps:
    """The coroutine operations of :class:`RedisLedger` (a mixin; see the module)."""

    _aio: AsyncClients
    _kicks: set[asyncio.Task[Any]]

    async def areserve(
        self: RedisLedger,
        path: Sequence[Level],
        cost_nano: int,
        tokens: int,
        *,
        step: bool = True,
        steps: int = 1,
        retry: bool = False,
        signature: str | None = None,
    ) -> Reservation | TripEvent:
        """:meth:`reserve` without blocking the event loop (same raises)."""
        if self._local is not None or not self._aio.supported:
            return self.reserve(
                path, cost_nano, tokens, step=step, steps=steps, retry=retry, signature=signature
            )
        op = self._reserve_op(path, cost_nano, tokens, step, steps, retry, signature)
        token = _attach(quiet())
        sent = False
        try:
            entry = await self._aio.get()
            if self._pending:
                await self._aflush(entry)
            if not self._checked:
                self._checked = await acheck_persistence(entry.client, self.store)
            sent = True
            reply: Any = await entry.script(self._reserve)(op.keys, op.args)
        except redis.RedisError as exc:
            return self._reserve_error(exc, op, sent)
        except asyncio.CancelledError:
            if sent and op.rid:  # it may have been applied: give it back, soon
                self._cancel(op.path, Reservation(op.rid, 0, 0, op.count, op.retry))
                self._kick()
            raise
        finally:
            _detach(token)
        return self._reserved(op, reply)

    async def acommit(
        self: RedisLedger,
        path: Sequence[Level],
        reservation: Reservation,
        cost_nano: int,
        tokens: int,
        *,
        release_steps: int = 0,
    ) -> TripEvent | None:
        """:meth:`commit` without blocking the event loop (never raises for an outage)."""
        if self._local is not None or not self._aio.supported:
            return self.commit(path, reservation, cost_nano, tokens, release_steps=release_steps)
        op = self._commit_op(path, reservation, cost_nano, tokens, release_steps)
        return self._committed(op, await self._asettle(op))

    async def arelease(self: RedisLedger, path: Sequence[Level], reservation: Reservation) -> None:
        """:meth:`release` without blocking the event loop."""
        if self._local is not None or not self._aio.supported:
            self.release(path, reservation)
            return
        op = self._release_op(path, reservation)
        if op is not None:
            await self._asettle(op)

    async def atrip(self: RedisLedger, chain_id: str, event: TripEvent) -> TripEvent:
        """:meth:`trip` without blocking the event loop."""
        if self._local is not None or not self._aio.supported:
            return self.trip(chain_id, event)
        key, args = self._trip_args(chain_id, event)
        reply = await self._acall(chain_id, self._trip, [key], args)
        if reply is _sync._LOCAL:
            return self.trip(chain_id, event)
        return self._tripped(chain_id, key, event, reply)

    async def asnapshot(self: RedisLedger, chain_id: str) -> LedgerState:
        """:meth:`snapshot` without blocking the event loop."""
        if self._local is not None or not self._aio.supported:
            return self.snapshot(chain_id)
        key = self._space.chain(chain_id).chain
        values = await self._acall(chain_id, None, [key], [])
        if values is _sync._LOCAL:
            return self.snapshot(chain_id)
        return self._state(chain_id, key, values)

    async def atrip_lifted(self: RedisLedger, chain_id: str) -> bool:
        """:meth:`trip_lifted` without blocking the event loop."""
        if self._local is not None or not self._aio.supported:
            return self.trip_lifted(chain_id)
        key = self._space.chain(chain_id).chain
        values = await self._acall(chain_id, None, [key], [])
        if values is _sync._LOCAL:
            return self.trip_lifted(chain_id)
        return self._lifted(chain_id, key, values)

    async def aflush(self: RedisLedger) -> int:
        """:meth:`flush` on the running loop; returns how many are still queued."""
        if self._local is None and self._pending and self._aio.supported:
            token = _attach(quiet())
            try:
                await self._aflush(await self._aio.get())
            except redis.RedisError as exc:
                self._flush_failed(exc)
            finally:
                _detach(token)
        return len(self._pending)

    async def aclose(self: RedisLedger) -> None:
        """Close the running loop's asyncio client now (the loop's end closes it anyway)."""
        await self._aio.close()

    @property
    def async_clients(self) -> int:
        """How many event loops hold an asyncio client of this ledger."""
        return len(self._aio)

    # -- plumbing ------------------------------------------------------------

    async def _asettle(self: RedisLedger, op: _Pending) -> Any:
        token = _attach(quiet())
        try:
            entry = await self._aio.get()
            if self._pending:
                await self._aflush(entry)
            reply: Any = await entry.script(op.script)(op.keys, op.args)
        except redis.RedisError as exc:
            return self._settle_failed(op, exc)
        except asyncio.CancelledError:
            # Maybe applied, maybe not: replayed by id, so it counts once.
            with self._pending_lock:
                self._pending.append(op)
            self._kick()
            raise
        finally:
            _detach(token)
        return self._settled(op, reply)

    async def _acall(
        self: RedisLedger, chain_id: str, script: Any, keys: list[str], args: list[str]
    ) -> Any:
        token = _attach(quiet())
        try:
            entry = await self._aio.get()
            if self._pending:
                await self._aflush(entry)
            if script is None:
                reply: Any = await entry.client.hmget(keys[0], _sync._SNAPSHOT_FIELDS)
            else:
                reply = await entry.script(script)(keys, args)
        except redis.RedisError as exc:
            return self._call_failed(chain_id, keys, exc)
        finally:
            _detach(token)
        if self._down:
            self._back()
        return reply

    async def _aflush(self: RedisLedger, entry: LoopClient) -> None:
        """Replay queued commits and releases in order (raises on store errors).

        The queue's lock is never held across an await (a task of the same
        thread would block on it): one task of the loop replays at a time,
        and an operation another thread replayed meanwhile replays as a no-op.
        """
        pending = self._pending
        replayed = 0
        async with entry.flushing:
            while True:
                with self._pending_lock:
                    if not pending:
                        break
                    op = pending[0]
                op.args[-4] = _sync._new_id()  # a fresh epoch id per attempt (see _settle_args)
                reply: Any = await entry.script(op.script)(op.keys, op.args)
                with self._pending_lock:
                    if pending and pending[0] is op:
                        pending.popleft()
                replayed += 1
                self._replayed(op, reply)
        if replayed:
            _logger.info("ledger store %s: %d queued commits replayed", self.store, replayed)

    def _kick(self: RedisLedger) -> None:
        """Replay the queue soon, from a task of the running loop (cancellation paths)."""
        try:
            task = asyncio.get_running_loop().create_task(self.aflush())
        except RuntimeError:
            return  # no loop: the next operation replays it
        self._kicks.add(task)
        task.add_done_callback(self._kicked)

    def _kicked(self, task: asyncio.Task[Any]) -> None:
        self._kicks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _logger.warning(
                "replaying queued ledger operations failed; the next operation retries",
                exc_info=task.exception(),
            )
