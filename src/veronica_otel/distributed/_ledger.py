"""RedisLedger: the kernel's ledger, shared by every process that uses one Redis.

Usage::

    from veronica_otel import ExecutionConfig, ExecutionContext
    from veronica_otel.distributed import RedisLedger

    ledger = RedisLedger.from_url("redis://localhost:6379/0")
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0), chain_id="job-42",
                          ledger=ledger) as ctx:
        ...

It behaves exactly as :class:`~veronica_otel.LocalLedger` (same limit checks,
same trip messages, first trip sticky), with each of ``reserve``, ``commit``,
``release`` and ``trip`` one ``EVALSHA`` round trip, so a contained call costs
two round trips. The scripts and keys are described in ``_scripts.py``.

With budget pools (``reserve(..., pools=...)``) the call is reserved in the
chain and every pool all or nothing: one script on one server (still two
round trips per call), a two-phase protocol on Redis Cluster (the pools'
keys are in their own slot); see ``_pools.py``.

What the store adds:

* **The store never forgets** (see the protocol in ``_scripts.py``). Each
  chain has an epoch; this client remembers, per chain, the last counters
  and trip the store reported (its *marks*, at most 65536 chains). A chain
  the store lost (restart without persistence, ``FLUSHALL``, expiry,
  eviction, an older copy restored) is re-seeded from those marks, in the
  same script as the operation: committed spend, steps, tokens and the trip
  come back, counted once across every client that saw them, what was
  reserved by calls then in flight is held again for one reservation TTL
  (their late commits settle it), and a WARNING names the chain.
  Re-seeding is the default because it keeps a chain running on what is
  known to be spent (it can only overcount, which denies
  earlier); ``on_loss="fail"`` denies calls with :class:`LedgerLostError`
  instead (settlements of calls that ran still re-seed: they always count).
  A client without marks (a new process) that finds no chain starts one.
  Keys expire ``chain_ttl_s`` (1 day) after the chain's last write, never
  under a running call (the heartbeat refreshes them); a chain that expired
  while a live client still knows it comes back from that client's marks.
* **Persistence check.** At the first reservation a store without
  persistence (``appendonly no`` and no ``save``) or with an evicting
  ``maxmemory-policy`` (``allkeys-*``, ``volatile-*``) is reported with a
  WARNING, once per store and process (INFO where ``CONFIG`` is disabled).
* **Late commits always count.** While a call runs, a heartbeat thread keeps
  its reservation alive (every ``reservation_ttl_s / 3`` seconds), so a call
  that outlives ``reservation_ttl_s`` (600 s x 3 attempts of an SDK) keeps
  its budget held. Only a dead or frozen holder's reservation expires: the
  next reservation in the same tree charges it (fail closed: its cost and
  tokens become spent, its step and retry stay counted, the call may have
  been sent), so its budget is never handed out again; a late commit then
  replaces the charge with the actual amounts, a late release gives it back,
  once. A commit that finds no reservation record (lost with the store) is
  applied as spend, not dropped. A reserve is idempotent (a duplicated
  request holds once), and one whose reply never came is cancelled by a
  queued release of its id. Every commit and release carries an id (a fresh one
  for a commit without a reservation); the store remembers applied ids for
  ``applied_ttl_s`` (1 day, at most 100000 per chain tree), so a replayed
  commit is counted once.
* **Store unreachable** (fail closed). ``reserve`` raises
  :class:`LedgerUnavailableError` (not a sticky trip: calls run again once
  the store answers). A ``commit`` or ``release`` for a call that already ran
  never raises into it: it is queued in this process and replayed, in order,
  before the next operation; until the queue is empty ``reserve`` keeps
  failing closed, so nothing is dispatched against an understated spend.
  Replays are idempotent (a settled reservation is a no-op), so a commit whose
  reply was lost is never counted twice. ``snapshot`` and ``trip`` raise
  :class:`LedgerUnavailableError`.
* **Fail open** (``fail_open=True`` or ``VERONICA_FAIL_OPEN=true``): at the
  first store error a WARNING is logged once and a process-local
  :class:`~veronica_otel.LocalLedger` takes over for the rest of the process
  lifetime, seeded from this client's marks (spend, steps, tokens, trips of
  every chain it saw), then the queued commits are counted in it. Staying local is the simplest
  predictable choice: budgets stop being shared, but never flap between two
  ledgers with different counts.
* **Corruption.** A value in our keys that the ledger did not write raises
  :class:`LedgerCorruptedError`; it is never read as zero.
* **Numbers at the edges.** The scripts count in Lua doubles, so nothing they
  add may reach 2**53 (see ``_scripts.py``). A cost ceiling above
  ``STORE_MAX`` nano-USD (2**50, about 1.13 million USD) counts as
  ``STORE_MAX``: the chain is denied earlier, never later. An amount above it
  (an absurd reservation, or usage of 1e26 tokens) is counted as
  ``STORE_MAX + 1``, which any limited level refuses or trips on; a commit
  never raises for it, so the caller gets its reply and the reservation is
  settled. Spent cost and tokens stop growing at 2**51.
* **Async code** (``areserve``, ``acommit``, ``arelease``, ``atrip``,
  ``asnapshot``, ``atrip_lifted``, ``apool_snapshot``): the same scripts and
  the same handling of every reply and failure (budget pools included),
  through a ``redis.asyncio`` client of the running event loop (``_aio.py``,
  ``_aledger.py``), so async calls never block the loop on a round trip.
* **Denials of in-flight calls.** A denial caused only by other calls'
  reservations (the call fits against committed spend alone) is returned with
  ``sticky=False`` and not stored, exactly as in the local ledger.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import redis
from opentelemetry import context as otel_context

from veronica_otel._config import parse_env_bool
from veronica_otel._errors import TripEvent
from veronica_otel._ledger import (
    SIGNATURE_MEMORY,
    LedgerState,
    Level,
    PoolLevel,
    PoolSnapshot,
    Reservation,
)

from . import _aledger, _scripts
from ._aio import MAX_CONNECTIONS
from ._chain_ops import ChainOps, Scripts
from ._connect import connect
from ._ids import new_id as _new_id
from ._keys import KeySpace
from ._link import NO_RESERVATION, StoreLink
from ._marks import Marks, check_persistence
from ._pools import PoolStore, drive, run_script
from ._store import LOCAL as _LOCAL
from ._store import SNAPSHOT_FIELDS as _SNAPSHOT_FIELDS
from ._store import TripCodec, check_seconds, describe, quiet, text

__all__ = ["RedisLedger"]

_logger = logging.getLogger("veronica_otel.distributed")

# Longest TTL: server time (~1.8e15 us) plus it must stay below 2**53 us.
_MAX_TTL_S = 1e9
_MARKER_MIN_S = 60.0
_APPLIED_CAP = "100000"
_ON_LOSS = ("reseed", "fail")

_attach = otel_context.attach
_detach = otel_context.detach


class RedisLedger:
    """A :class:`~veronica_otel.Ledger` kept in Redis or Valkey.

    Args:
        client: A ``redis.Redis`` client (``decode_responses`` either way).
            Prefer :meth:`from_url`, which sets short socket timeouts and no
            client-side retries (a retried reservation could count twice).
        key_prefix: Prefix of every key (no braces: the ledger adds a hash tag).
        reservation_ttl_s: How long a reservation may be held before it counts
            as abandoned (its holder crashed). Longer than any call you make.
        chain_ttl_s: Keys expire this long after their last write (a live
            client that saw the chain re-seeds it from its marks).
        fail_open: ``True`` to fall back to a process-local ledger when the
            store fails; ``None`` reads ``VERONICA_FAIL_OPEN``.
        shared_id: Names this ledger to other services (grants across
            services are charged directly when both sides have the same id);
            derived from the store's address and ``key_prefix`` when omitted.
        on_loss: ``"reseed"`` (default) re-seeds a chain the store lost from
            this client's marks; ``"fail"`` denies its calls with
            :class:`LedgerLostError`.
        applied_ttl_s: How long the store remembers a settled commit's id,
            so a replay within that time counts once.
        async_connections: Round trips one event loop's asyncio client runs
            at a time; more concurrent async calls queue for a connection
            in arrival order (a wait, never a denial).

    Raises:
        ValueError: A malformed argument or ``VERONICA_FAIL_OPEN`` value.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        key_prefix: str = "veronica:",
        reservation_ttl_s: float = 600.0,
        chain_ttl_s: float = 86400.0,
        fail_open: bool | None = None,
        shared_id: str | None = None,
        on_loss: str = "reseed",
        applied_ttl_s: float = 86400.0,
        async_connections: int = MAX_CONNECTIONS,
    ) -> None:
        space = KeySpace(key_prefix)  # validates the prefix
        if (
            isinstance(async_connections, bool)
            or not isinstance(async_connections, int)
            or async_connections < 1
        ):
            raise ValueError(f"async_connections must be an int >= 1, got {async_connections!r}")
        self._shared_id = _shared_id(shared_id, describe(client), key_prefix)
        if on_loss not in _ON_LOSS:
            raise ValueError(f"on_loss must be 'reseed' or 'fail', got {on_loss!r}")
        applied_ttl = check_seconds("applied_ttl_s", applied_ttl_s, minimum=1.0)
        reservation_ttl = check_seconds("reservation_ttl_s", reservation_ttl_s)
        chain_ttl = check_seconds("chain_ttl_s", chain_ttl_s, minimum=1.0)
        for name, ttl in (
            ("reservation_ttl_s", reservation_ttl),
            ("chain_ttl_s", chain_ttl),
            ("applied_ttl_s", applied_ttl),
        ):
            if ttl > _MAX_TTL_S:
                raise ValueError(
                    f"{name} must be <= {_MAX_TTL_S:g} seconds (the store counts time "
                    f"in exact microseconds), got {ttl!r}"
                )
        if chain_ttl < reservation_ttl:
            raise ValueError(
                f"chain_ttl_s ({chain_ttl_s!r}) must be >= reservation_ttl_s "
                f"({reservation_ttl_s!r}): a chain must outlive its reservations"
            )
        if fail_open is None:
            fail_open = parse_env_bool("VERONICA_FAIL_OPEN")
        elif not isinstance(fail_open, bool):
            raise ValueError(f"fail_open must be a bool or None, got {fail_open!r}")
        self._client = client
        self._prefix = key_prefix
        self.store = describe(client)
        rsv_ttl = str(round(reservation_ttl * 1_000_000))
        self._rsv_ttl, self._chain_ttl = rsv_ttl, str(round(chain_ttl * 1000))
        # A reaped reservation's marker lives as long as an applied id: its
        # late commit must find it, or it would be counted on top of the charge.
        marker_ttl = str(round(max(reservation_ttl, _MARKER_MIN_S, applied_ttl) * 1_000_000))
        applied = [str(round(applied_ttl * 1_000_000)), _APPLIED_CAP]
        self._marks = Marks(self, reservation_ttl)
        self._space = space
        self._pools = PoolStore(
            client,
            key_prefix,
            rsv_ttl_us=rsv_ttl,
            marker_ttl_us=marker_ttl,
            applied=applied,
            chain_ttl_ms=self._chain_ttl,
            new_id=_new_id,
        )
        scripts = Scripts(client)
        # The jobs: the store link (round trips, outages, replay, failing
        # open) and the chain operations' plan (scripts' calls and replies).
        self._link = StoreLink(
            client,
            self.store,
            fail_open,
            self._marks,
            TripCodec(),
            scripts.commit,
            async_connections,
        )
        self._plan = ChainOps(
            scripts,
            self._link,
            space,
            self._pools,
            (rsv_ttl, self._chain_ttl, marker_ttl),
            applied,
            str(SIGNATURE_MEMORY),
            on_loss,
        )
        self._aio = self._link.aio  # the async operations' clients, one per loop
        self._owns_client = False  # a client the caller passed stays theirs to close

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        socket_timeout: float = 2.0,
        socket_connect_timeout: float = 1.0,
        key_prefix: str = "veronica:",
        reservation_ttl_s: float = 600.0,
        chain_ttl_s: float = 86400.0,
        fail_open: bool | None = None,
        async_connections: int = MAX_CONNECTIONS,
    ) -> RedisLedger:
        """Connect to ``redis://``, ``rediss://`` or ``unix://`` ``url``.

        Nothing is sent until the first operation, so an unreachable store is
        reported by the first call (fail closed), not here.

        Args:
            url: The store; a password in it never appears in messages.
            socket_timeout: Seconds to wait for a reply before failing closed.
            socket_connect_timeout: Seconds to wait for a connection.
            key_prefix: See :class:`RedisLedger`.
            reservation_ttl_s: See :class:`RedisLedger`.
            chain_ttl_s: See :class:`RedisLedger`.
            fail_open: See :class:`RedisLedger`.
            async_connections: See :class:`RedisLedger`.
        """
        client = connect(url, socket_timeout, socket_connect_timeout)
        ledger = cls(
            client,
            key_prefix=key_prefix,
            reservation_ttl_s=reservation_ttl_s,
            chain_ttl_s=chain_ttl_s,
            fail_open=fail_open,
            async_connections=async_connections,
        )
        ledger._owns_client = True  # made here, so close() closes it
        return ledger

    @property
    def shared_id(self) -> str | None:
        """This ledger's name to other services; None once it failed open (not shared)."""
        return self._shared_id if self._link.local is None else None

    @property
    def client(self) -> redis.Redis:
        """The Redis client (for tests and operations tooling)."""
        return self._client

    @property
    def pending(self) -> int:
        """Commits and releases waiting for the store to come back."""
        return len(self._link.pending)

    @property
    def is_local(self) -> bool:
        """True once the ledger failed open to its process-local fallback."""
        return self._link.local is not None

    def key(self, chain_id: str) -> str:
        """The Redis key of ``chain_id``'s counters."""
        return self._space.chain(chain_id).chain

    # -- the Ledger protocol -------------------------------------------------

    def reserve(
        self,
        path: Sequence[Level],
        cost_nano: int,
        tokens: int,
        *,
        step: bool = True,
        steps: int = 1,
        retry: bool = False,
        signature: str | None = None,
        pools: Sequence[PoolLevel] = (),
    ) -> Reservation | TripEvent:
        """Check every level's limits, then charge every level; or trip.

        With ``pools``, the call is also reserved in each pool, all or nothing
        (see ``_pools.py``: one script on one server, two phases on a cluster);
        a pool's denial is returned with ``pool`` set (sticky unless only calls in
        flight fill the pool). Its plan (:class:`~._chain_ops.ChainOps`) is
        the async :meth:`areserve`'s too.

        Raises:
            LedgerUnavailableError: The store cannot be reached (or commits
                of calls that already ran are still waiting for it).
            LedgerCorruptedError: A key on the path holds a foreign value.
        """
        link = self._link
        local = link.local
        if local is not None:
            return local.reserve(
                path,
                cost_nano,
                tokens,
                step=step,
                steps=steps,
                retry=retry,
                signature=signature,
                pools=pools,
            )
        plan = self._plan
        op = plan.reserve_op(path, cost_nano, tokens, step, steps, retry, signature, pools)
        token = _attach(quiet())
        sent = False
        try:
            if link.pending:
                link.replay()
            if not link.checked:
                link.checked = check_persistence(self._client, self.store)
            sent = True
            reply: Any = (
                drive(plan.pool_plan(op), run_script)
                if op.pools
                else plan.scripts.reserve(op.keys, op.args)
            )
        except redis.RedisError as exc:
            return plan.reserve_error(exc, op, sent)
        finally:
            _detach(token)
        undo = plan.pool_undo(op, reply)
        if undo is not None:
            link.settle(undo)
        return plan.reserved(op, reply)

    def commit(
        self,
        path: Sequence[Level],
        reservation: Reservation,
        cost_nano: int,
        tokens: int,
        *,
        release_steps: int = 0,
    ) -> TripEvent | None:
        """Replace a reservation with the actual amounts (never raises for an
        unreachable store: the commit waits in this process instead)."""
        local = self._link.local
        if local is not None:
            view = _local_view(reservation)
            return local.commit(path, view, cost_nano, tokens, release_steps=release_steps)
        plan = self._plan
        op = plan.commit_op(path, reservation, cost_nano, tokens, release_steps)
        if reservation.pools:
            pooled = plan.pooled_commit(op, reservation, release_steps)
            return plan.committed(op, drive(pooled, self._link.settle))
        return plan.committed(op, self._link.settle(op))

    def release(self, path: Sequence[Level], reservation: Reservation) -> None:
        """Give back a reservation whose call was never sent (its step too)."""
        local = self._link.local
        if local is not None:
            if not reservation.id:
                local.release(path, reservation)
            return
        op = self._plan.release_op(path, reservation)
        if op is not None:
            if reservation.pools:
                pooled = self._plan.settle_pooled(op, reservation, (0, 0, 0), False)
                drive(pooled, self._link.settle)
            else:
                self._link.settle(op)

    def trip(self, chain_id: str, event: TripEvent) -> TripEvent:
        """Make a trip sticky; the first trip wins and is returned.

        Raises:
            LedgerUnavailableError: The store cannot be reached.
        """
        local = self._link.local
        if local is not None:
            return local.trip(chain_id, event)
        plan = self._plan
        key, args = plan.trip_args(chain_id, event)
        reply = self._script(chain_id, plan.scripts.trip, [key], args)
        if reply is _LOCAL:
            return self.trip(chain_id, event)
        return plan.tripped(chain_id, key, event, reply)

    def clear_trip(self, chain_id: str) -> TripEvent | None:
        """Remove a sticky trip (only the logged override path calls this).

        Returns the trip that was removed, or None.
        """
        local = self._link.local
        if local is not None:
            return local.clear_trip(chain_id)
        key = self._space.chain(chain_id).chain
        reply = self._script(chain_id, self._plan.scripts.clear_trip, [key], [])
        if reply is _LOCAL:
            return self.clear_trip(chain_id)
        return None if reply is None else self._plan.codec.decode(reply, key)

    def override(
        self, chain_id: str, *, expires_at: float, add_cost_nano: int = 0, add_steps: int = 0
    ) -> TripEvent | None:
        """Lift the chain's sticky trip and widen its ceilings until ``expires_at``.

        ``expires_at`` is wall time here; the store keeps it on its own clock
        (now + the remaining duration), so every process agrees when it ends.
        One round trip. Returns the lifted trip, or None.
        """
        local = self._link.local
        if local is not None:
            return local.override(
                chain_id, expires_at=expires_at, add_cost_nano=add_cost_nano, add_steps=add_steps
            )
        limit = _scripts.STORE_MAX  # keeps the widened ceilings exact in the script
        duration_us = min(limit, max(0, int((expires_at - time.time()) * 1_000_000)))
        key = self._space.chain(chain_id).chain
        extra = [min(limit, int(add_cost_nano)), min(limit, int(add_steps))]
        args = [str(duration_us), str(extra[0]), str(extra[1]), self._chain_ttl]
        args += (*self._marks.of(chain_id), _new_id())
        reply = self._script(chain_id, self._plan.scripts.override, [key], args)
        if reply is _LOCAL:
            return self.override(
                chain_id, expires_at=expires_at, add_cost_nano=add_cost_nano, add_steps=add_steps
            )
        if len(reply) == 1:
            raise ValueError(
                f"chain {chain_id!r} does not exist in the ledger store {self.store} "
                f"(key {key!r}): nothing to override; check the chain id and the key prefix"
            )
        self._plan.remember_one(chain_id, reply, 2)
        return self._plan.codec.decode(reply[0], key) if text(reply[0]) else None

    def snapshot(self, chain_id: str) -> LedgerState:
        """The chain's counters in one ``HMGET`` (zero for an unknown chain).

        Raises:
            LedgerUnavailableError: The store cannot be reached.
            LedgerCorruptedError: A counter holds a foreign value.
        """
        local = self._link.local
        if local is not None:
            return local.snapshot(chain_id)
        key, values = self._read(chain_id)
        if values is _LOCAL:
            return self.snapshot(chain_id)
        return self._plan.state(chain_id, key, values)

    def trip_lifted(self, chain_id: str) -> bool:
        """Whether an override (maybe by another process) lifted ``chain_id``'s trip.

        Only an explicit override record lifts it: the chain still in the
        epoch we saw, no trip, and its override generation past the one we
        saw with the trip. A chain the store lost is not lifted. One ``HMGET``.
        """
        local = self._link.local
        if local is not None:
            return local.snapshot(chain_id).trip is None
        key, values = self._read(chain_id)
        if values is _LOCAL:
            return self.trip_lifted(chain_id)
        return self._plan.lifted(chain_id, key, values)

    def _read(self, chain_id: str) -> tuple[str, Any]:
        """The chain's key and its snapshot fields (``_LOCAL``: just failed open)."""
        key = self._space.chain(chain_id).chain
        client = self._client
        return key, self._link.call(chain_id, [key], lambda: client.hmget(key, _SNAPSHOT_FIELDS))

    def _script(self, chain_id: str, script: Any, keys: list[str], args: list[str]) -> Any:
        """One script call through the link (``_LOCAL``: just failed open)."""
        return self._link.call(chain_id, keys, lambda: script(keys, args))

    # -- the same operations for async code (_aledger.py) --------------------

    async def areserve(
        self,
        path: Sequence[Level],
        cost_nano: int,
        tokens: int,
        *,
        step: bool = True,
        steps: int = 1,
        retry: bool = False,
        signature: str | None = None,
        pools: Sequence[PoolLevel] = (),
    ) -> Reservation | TripEvent:
        """:meth:`reserve` without blocking the event loop (same raises)."""
        return await _aledger.reserve(
            self, self._plan, path, cost_nano, tokens, step, steps, retry, signature, pools
        )

    async def acommit(
        self,
        path: Sequence[Level],
        reservation: Reservation,
        cost_nano: int,
        tokens: int,
        *,
        release_steps: int = 0,
    ) -> TripEvent | None:
        """:meth:`commit` without blocking the event loop (never raises for an outage)."""
        return await _aledger.commit(
            self, self._plan, path, reservation, cost_nano, tokens, release_steps
        )

    async def arelease(self, path: Sequence[Level], reservation: Reservation) -> None:
        """:meth:`release` without blocking the event loop."""
        await _aledger.release(self, self._plan, path, reservation)

    async def atrip(self, chain_id: str, event: TripEvent) -> TripEvent:
        """:meth:`trip` without blocking the event loop."""
        return await _aledger.trip(self, self._plan, chain_id, event)

    async def asnapshot(self, chain_id: str) -> LedgerState:
        """:meth:`snapshot` without blocking the event loop."""
        return await _aledger.snapshot(self, self._plan, chain_id)

    async def atrip_lifted(self, chain_id: str) -> bool:
        """:meth:`trip_lifted` without blocking the event loop."""
        return await _aledger.trip_lifted(self, self._plan, chain_id)

    async def apool_snapshot(self, pool: PoolLevel) -> PoolSnapshot:
        """:meth:`pool_snapshot` without blocking the event loop."""
        return await _aledger.pool_snapshot(self, self._plan, pool)

    async def aflush(self) -> int:
        """:meth:`flush` on the running loop; returns how many are still queued."""
        return await _aledger.flush(self._link)

    async def aclose(self) -> None:
        """Close the running loop's asyncio client now (the loop's end closes it anyway)."""
        await self._link.aio.close()

    @property
    def async_clients(self) -> int:
        """How many event loops hold an asyncio client of this ledger."""
        return len(self._link.aio)

    # -- pools, the heartbeat, the queue -------------------------------------

    def heartbeat(self) -> int:
        """Keep this process's running calls' reservations alive; returns how many.

        The heartbeat thread calls it every ``reservation_ttl_s / 3`` seconds.
        A store error is logged at DEBUG and left to the next beat.
        """
        if self._link.local is not None:
            return 0
        renewed = 0
        beat = self._plan.scripts.heartbeat
        token = _attach(quiet())
        try:
            for (rh, rz, base), ids in self._marks.groups().items():
                try:
                    args = [self._rsv_ttl, self._chain_ttl, base, *ids]
                    renewed += int(beat([rh, rz], args))
                except redis.RedisError as exc:
                    _logger.debug("ledger heartbeat to %s failed: %s", self.store, exc)
            try:
                renewed += self._pools.heartbeat()
            except redis.RedisError as exc:
                _logger.debug("pool heartbeat to %s failed: %s", self.store, exc)
        finally:
            _detach(token)
        return renewed

    def pool_snapshot(self, pool: PoolLevel) -> PoolSnapshot:
        """What ``pool`` holds now: spend within its window, reserved amounts,
        and when its oldest in-window spend leaves (one read-only script).

        Raises:
            LedgerUnavailableError: The store cannot be reached.
            LedgerCorruptedError: A pool field holds a foreign value.
        """
        local = self._link.local
        if local is not None:
            return local.pool_snapshot(pool)
        pools = self._pools
        reply = self._link.call(
            f"(pool {pool.name})", [pool.name], lambda: pools.snapshot(pool.name)
        )
        if reply is _LOCAL:
            return self.pool_snapshot(pool)
        return reply  # type: ignore[no-any-return]

    def pool_names(self) -> list[str]:
        """The names of every pool in the store (a SCAN of the pool key space)."""
        reply = self._link.call("(pools)", [], self._pools.names)
        return [] if reply is _LOCAL else list(reply)

    def close(self) -> None:
        """Stop the heartbeat thread; close the sync client if :meth:`from_url`
        made it (a client passed in stays open: it is the caller's). A later
        operation connects afresh. Asyncio clients close with their loop
        (or :meth:`aclose` on it)."""
        self._marks.stop()
        if self._owns_client:
            self._client.close()

    def flush(self) -> int:
        """Try to replay queued commits now; returns how many are still queued."""
        return self._link.flush()

    def __repr__(self) -> str:
        return f"RedisLedger({self.store!r}, key_prefix={self._prefix!r})"


def _shared_id(given: str | None, store: str, prefix: str) -> str:
    if given is None:
        digest = hashlib.sha256(f"{store}\n{prefix}".encode()).hexdigest()[:24]
        return f"redis:{digest}"
    if not isinstance(given, str) or not 0 < len(given) <= 128 or not given.isprintable():
        raise ValueError(f"shared_id must be 1-128 printable characters, got {given!r}")
    return given


def _local_view(reservation: Reservation) -> Reservation:
    # A reservation made in the store holds nothing in the local fallback.
    return reservation if not reservation.id else NO_RESERVATION
