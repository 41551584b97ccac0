"""RedisLedger's link to its store: round trips, outages, the replay queue, failing open.

One job, shared by every operation of the ledger (chains, trips, pools) and
by its sync and async forms (``_aledger.py``): what happens when the store
does not answer. See ``_ledger.py`` ("Store unreachable", "Fail open") for the
behaviour: a reserve fails closed, a commit or release that already ran is
queued and replayed in order before the next operation, and with
``fail_open`` a process-local ledger, seeded from this client's marks, takes
over for the rest of the process lifetime.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import redis
from opentelemetry import context as otel_context
from redis.commands.core import Script

from veronica_otel._fork import remake_locks_after_fork
from veronica_otel._ledger import Level, LocalLedger, Reservation

from ._aio import AsyncClients
from ._errors import LedgerCorruptedError, LedgerUnavailableError
from ._ids import new_id
from ._marks import Marks, seed_local
from ._store import LOCAL, TripCodec, corruption, quiet

__all__ = ["NO_RESERVATION", "RESEEDED", "Pending", "StoreLink"]

_logger = logging.getLogger("veronica_otel.distributed")
_attach = otel_context.attach
_detach = otel_context.detach

NO_RESERVATION = Reservation("", 0, 0)


class Pending(NamedTuple):
    """A commit or release: its script call, and what a fail-open ledger counts of it."""

    script: Script
    keys: list[str]
    args: list[str]
    path: Sequence[Level]
    cost_nano: int  # what a commit adds (0 for a release)
    tokens: int


class StoreLink:
    """The store's client, its health, and the queue of settlements it owes.

    Args:
        client: The sync client (an async one per event loop is made from it).
        store: The store's description for messages (no password).
        fail_open: Whether a store failure hands over to a local ledger.
        marks: This client's marks (re-seeding, the local ledger's seed).
        codec: Reads the trips in the marks.
        commit: The COMMIT script (a replayed commit's overrun is logged).
        async_connections: Round trips one event loop runs at a time.
    """

    def __init__(
        self,
        client: redis.Redis,
        store: str,
        fail_open: bool,
        marks: Marks,
        codec: TripCodec,
        commit: Script,
        async_connections: int,
    ) -> None:
        self.client = client
        self.store = store
        self.fail_open = fail_open
        self.marks = marks
        self.codec = codec
        self.commit = commit
        self.pending: deque[Pending] = deque()
        self.pending_lock = threading.Lock()
        self.state_lock = threading.Lock()
        # A parent thread may hold one at fork; the child's copy would never be released.
        remake_locks_after_fork(self, "pending_lock", "state_lock")
        self.local: LocalLedger | None = None
        self.down = False
        self.checked = False  # the store's persistence was checked
        self.aio = AsyncClients(client, async_connections)  # the async clients, one per loop
        self.kicks: set[Any] = set()  # replay tasks started by cancellations

    # -- one round trip ------------------------------------------------------

    def settle(self, op: Pending) -> Any:
        """Send a commit or release (queued when the store does not answer)."""
        token = _attach(quiet())
        try:
            if self.pending:
                self.replay()
            reply = op.script(op.keys, op.args)
        except redis.RedisError as exc:
            return self.settle_failed(op, exc)
        finally:
            _detach(token)
        return self.settled(op, reply)

    def settle_failed(self, op: Pending, exc: redis.RedisError) -> None:
        """A commit or release the store did not answer: queued for replay."""
        found = corruption(exc)
        if found is not None:
            raise found from exc
        self.went_down(exc)
        with self.pending_lock:
            self.pending.append(op)
        if self.fail_open:
            self.go_local(exc)

    def settled(self, op: Pending, reply: Any) -> Any:
        if self.down:
            self.back()
        self.marks.remember(op.path, reply, 3)
        if reply[2]:
            self.reseeded(op.path)
        return reply

    def call(self, chain_id: str, keys: list[str], request: Callable[[], Any]) -> Any:
        """One read or trip operation (``request()``); raises
        LedgerUnavailableError on failure.

        Returns ``LOCAL`` when the ledger just failed open (the caller retries
        on the local ledger).
        """
        token = _attach(quiet())
        try:
            if self.pending:
                self.replay()
            reply = request()
        except redis.RedisError as exc:
            return self.call_failed(chain_id, keys, exc)
        finally:
            _detach(token)
        if self.down:
            self.back()
        return reply

    def call_failed(self, chain_id: str, keys: list[str], exc: redis.RedisError) -> Any:
        """``LOCAL`` when the ledger just failed open; else raises."""
        found = corruption(exc)
        if found is not None:
            if found.key == "(a ledger key)":
                found = LedgerCorruptedError(keys[0], found.field, found.value)
            raise found from exc
        self.went_down(exc)
        if self.fail_open:
            self.go_local(exc)
            return LOCAL
        raise LedgerUnavailableError.for_store(self.store, chain_id, exc) from exc

    def reserve_failed(self, exc: redis.RedisError, chain_id: str) -> LocalLedger:
        """The local ledger to reserve in after ``exc`` (failing open); else raises."""
        found = corruption(exc)
        if found is not None:
            raise found from exc
        self.went_down(exc)
        if self.fail_open:
            return self.go_local(exc)
        raise LedgerUnavailableError.for_store(self.store, chain_id, exc) from exc

    # -- the replay queue ----------------------------------------------------

    def queue(self, ops: Sequence[Pending]) -> None:
        with self.pending_lock:
            self.pending.extend(ops)

    def flush(self) -> int:
        """Try to replay queued commits now; returns how many are still queued."""
        if self.local is None and self.pending:
            token = _attach(quiet())
            try:
                self.replay()
            except redis.RedisError as exc:
                self.flush_failed(exc)
            finally:
                _detach(token)
        return len(self.pending)

    def flush_failed(self, exc: redis.RedisError) -> None:
        found = corruption(exc)
        if found is not None:
            raise found from exc
        self.went_down(exc)

    def replay(self) -> None:
        """Replay queued commits and releases in order (raises on store errors)."""
        with self.pending_lock:
            pending = self.pending
            replayed = 0
            while pending:
                op = pending[0]
                op.args[-4] = new_id()  # a fresh epoch id per attempt (see settle_args)
                reply: Any = op.script(op.keys, op.args)
                pending.popleft()
                replayed += 1
                self.replayed(op, reply)
        if replayed:
            _logger.info("ledger store %s: %d queued commits replayed", self.store, replayed)

    def replayed(self, op: Pending, reply: Any) -> None:
        self.marks.remember(op.path, reply, 3)
        if op.script is self.commit and reply[0]:
            _logger.warning(
                "a replayed commit overran a limit of chain %s; the chain is tripped",
                op.path[int(reply[0]) - 1].chain_id,
            )

    # -- the store's health --------------------------------------------------

    def went_down(self, exc: BaseException) -> None:
        with self.state_lock:
            first = not self.down
            self.down = True
        if first and not self.fail_open:  # failing open logs once, in go_local
            _logger.warning(
                "ledger store %s unreachable (%s: %s); failing closed: calls are denied "
                "until it answers",
                self.store,
                type(exc).__name__,
                exc,
            )
        pool = getattr(self.client, "connection_pool", None)
        if pool is not None:  # drop idle sockets to the old server at once
            pool.disconnect(inuse_connections=False)

    def back(self) -> None:
        with self.state_lock:
            was_down, self.down = self.down, False
        if was_down:
            _logger.info("ledger store %s reachable again", self.store)

    def go_local(self, exc: BaseException) -> LocalLedger:
        with self.state_lock:
            if self.local is not None:
                return self.local
            local = LocalLedger()
            seeded = seed_local(local, self.marks.seen, self.codec)
            with self.pending_lock:
                for op in self.pending:
                    if op.cost_nano or op.tokens:
                        local.commit(op.path, NO_RESERVATION, op.cost_nano, op.tokens)
                self.pending.clear()
            self.local = local
        _logger.warning(
            "VERONICA_FAIL_OPEN: ledger store %s failed (%s: %s); using a process-local "
            "ledger for the rest of this process (budgets are no longer shared), seeded "
            "with the %d chains this process saw",
            self.store,
            type(exc).__name__,
            exc,
            seeded,
        )
        return local

    def reseeded(self, path: Sequence[Level]) -> None:
        _logger.warning(RESEEDED, " / ".join(lv.chain_id for lv in path), self.store)


RESEEDED = (
    "chain %s: ledger store %s had lost it (restart without persistence, flush, expiry, "
    "eviction or an older copy); re-seeded from this process's marks: committed spend, "
    "steps, tokens and trip are counted again"
)
