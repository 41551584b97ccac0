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
import threading
import time
from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import redis
from opentelemetry import context as otel_context
from redis.commands.core import Script

from veronica_otel._config import parse_env_bool
from veronica_otel._errors import TripEvent
from veronica_otel._fork import remake_locks_after_fork
from veronica_otel._ledger import (
    SIGNATURE_MEMORY,
    LedgerState,
    Level,
    Limits,
    LocalLedger,
    PoolLevel,
    PoolSnapshot,
    Reservation,
    step_count,
)

from . import _aledger, _scripts
from ._aio import MAX_CONNECTIONS, AsyncClients
from ._connect import connect
from ._errors import LedgerCorruptedError, LedgerLostError, LedgerUnavailableError
from ._ids import new_id as _new_id
from ._keys import KeySpace
from ._marks import Marks, check_persistence, lost_words, seed_local
from ._pools import Plan, PoolStore, drive, run_script
from ._store import LOCAL as _LOCAL
from ._store import POOL_NAMES as _POOL_NAMES
from ._store import POOL_SNAPSHOT as _POOL_SNAPSHOT
from ._store import SNAPSHOT_FIELDS as _SNAPSHOT_FIELDS
from ._store import TripCodec, check_seconds, corruption, describe, parse_int, quiet, text

__all__ = ["RedisLedger"]

_logger = logging.getLogger("veronica_otel.distributed")

# One amount a script is given: above STORE_MAX, any limit refuses it or trips.
_MAX_AMOUNT = _scripts.STORE_MAX + 1
# Longest TTL: server time (~1.8e15 us) plus it must stay below 2**53 us.
_MAX_TTL_S = 1e9
_MARKER_MIN_S = 60.0
_APPLIED_CAP = "100000"
_ON_LOSS = ("reseed", "fail")
_NO_RESERVATION = Reservation("", 0, 0)

_attach = otel_context.attach
_detach = otel_context.detach


class _Pending(NamedTuple):
    script: Script
    keys: list[str]
    args: list[str]
    path: Sequence[Level]
    cost_nano: int  # what a commit adds (0 for a release)
    tokens: int


class _ReserveOp(NamedTuple):
    """One reservation's script call, and what reading its reply needs."""

    path: Sequence[Level]
    keys: list[str]
    args: list[str]
    rid: str
    tree: tuple[str, str, str]  # (reservations, expiries, key base): the heartbeat's
    cost_nano: int
    tokens: int
    steps_held: int  # the steps counted (0 without a step)
    step: bool
    steps: int
    retry: bool
    signature: str | None
    # The pools it is also reserved in (held only with an id; without one
    # nothing was reserved, and a commit's usage is applied to them as spend).
    pools: tuple[PoolLevel, ...]


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
        self._fail_open = fail_open
        self.store = describe(client)
        self._rsv_ttl = str(round(reservation_ttl * 1_000_000))
        self._chain_ttl = str(round(chain_ttl * 1000))
        # A reaped reservation's marker lives as long as an applied id: its
        # late commit must find it, or it would be counted on top of the charge.
        marker_ttl = max(reservation_ttl, _MARKER_MIN_S, applied_ttl)
        self._marker_ttl = str(round(marker_ttl * 1_000_000))
        self._memory = str(SIGNATURE_MEMORY)
        self._on_loss = on_loss
        self._applied = [str(round(applied_ttl * 1_000_000)), _APPLIED_CAP]
        self._marks = Marks(self, reservation_ttl)
        self._pools = PoolStore(
            client,
            key_prefix,
            rsv_ttl_us=self._rsv_ttl,
            marker_ttl_us=self._marker_ttl,
            applied=self._applied,
            chain_ttl_ms=self._chain_ttl,
            new_id=_new_id,
        )
        self._reserve = client.register_script(_scripts.RESERVE)
        self._commit = client.register_script(_scripts.COMMIT)
        self._release = client.register_script(_scripts.RELEASE)
        self._trip = client.register_script(_scripts.TRIP)
        self._clear_trip = client.register_script(_scripts.CLEAR_TRIP)
        self._override = client.register_script(_scripts.OVERRIDE)
        self._heartbeat = client.register_script(_scripts.HEARTBEAT)
        self._codec = TripCodec()
        self._space = space
        self._pending: deque[_Pending] = deque()
        self._pending_lock = threading.Lock()
        self._state_lock = threading.Lock()
        # A parent thread may hold one at fork; the child's copy would never be released.
        remake_locks_after_fork(self, "_pending_lock", "_state_lock")
        self._local: LocalLedger | None = None
        self._down = False
        self._checked = False
        # The async operations' clients, one per loop.
        self._aio = AsyncClients(client, async_connections)
        self._kicks: set[Any] = set()  # replay tasks started by cancellations
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
        return self._shared_id if self._local is None else None

    @property
    def client(self) -> redis.Redis:
        """The Redis client (for tests and operations tooling)."""
        return self._client

    @property
    def pending(self) -> int:
        """Commits and releases waiting for the store to come back."""
        return len(self._pending)

    @property
    def is_local(self) -> bool:
        """True once the ledger failed open to its process-local fallback."""
        return self._local is not None

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
        flight fill the pool).

        Raises:
            LedgerUnavailableError: The store cannot be reached (or commits
                of calls that already ran are still waiting for it).
            LedgerCorruptedError: A key on the path holds a foreign value.
        """
        local = self._local
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
        op = self._reserve_op(path, cost_nano, tokens, step, steps, retry, signature, pools)
        token = _attach(quiet())
        sent = False
        try:
            if self._pending:
                self._flush()
            if not self._checked:
                self._checked = check_persistence(self._client, self.store)
            sent = True
            reply: Any = (
                drive(self._pool_plan(op), run_script)
                if op.pools
                else self._reserve(op.keys, op.args)
            )
        except redis.RedisError as exc:
            return self._reserve_error(exc, op, sent)
        finally:
            _detach(token)
        undo = self._pool_undo(op, reply)
        if undo is not None:
            self._settle(undo)
        return self._reserved(op, reply)

    # Shared by reserve and the async areserve (_aledger.py): all but the round trip.

    def _reserve_op(
        self,
        path: Sequence[Level],
        cost_nano: int,
        tokens: int,
        step: bool,
        steps: int,
        retry: bool,
        signature: str | None,
        pools: Sequence[PoolLevel] = (),
    ) -> _ReserveOp:
        """The RESERVE script's keys and arguments for one reservation."""
        count = step_count(steps) if step else 0
        cost_nano = _amount("cost_nano", cost_nano)
        tokens = _amount("tokens", tokens)
        n = len(path)
        if n == 1:
            ck = self._space.chain(path[0].chain_id)
            keys = [ck.chain, ck.signatures, ck.recency, ck.reservations, ck.expiries, ck.applied]
        else:
            cks = self._space.tree(path)
            ck = cks[0]
            keys = [k.chain for k in cks]
            keys += [k.signatures for k in cks]
            keys += [k.recency for k in cks]
            keys += [ck.reservations, ck.expiries, ck.applied]
        rid = _new_id() if (cost_nano or tokens or count or retry) else ""
        args = [
            str(n),
            str(cost_nano),
            str(tokens),
            str(count),
            "1" if retry else "0",
            "" if signature is None else "=" + signature,
            rid,
            self._rsv_ttl,
            self._chain_ttl,
            self._marker_ttl,
            self._memory,
            ck.base,
        ]
        marks = self._marks
        for level in path:
            args += self._space.level_args(level)
        for level in path:
            args += marks.of(level.chain_id)
        args += (rid or _new_id(), self._on_loss)
        tree = (ck.reservations, ck.expiries, ck.base)
        return _ReserveOp(
            path,
            keys,
            args,
            rid,
            tree,
            cost_nano,
            tokens,
            count,
            step,
            steps,
            retry,
            signature,
            tuple(pools),
        )

    def _pool_plan(self, op: _ReserveOp) -> Plan:
        """The pooled reserve's round trips (see ``_pools.py``)."""
        amounts = (op.cost_nano, op.tokens, op.steps_held)
        return self._pools.reserving(
            self._reserve, op.keys, op.args, len(op.path), op.pools, op.rid, amounts, op.path
        )

    def _pool_undo(self, op: _ReserveOp, reply: Any) -> _Pending | None:
        """The release of the pools' hold when the chain denied a call they held
        (cluster phase one): settled at once, queued if the store fails then."""
        if not op.pools or not op.rid or reply[0] in (1, 5):
            return None
        undo = self._pools.undo(op.pools, op.rid)
        return None if undo is None else _Pending(*undo, (), 0, 0)

    def _reserve_error(
        self, exc: redis.RedisError, op: _ReserveOp, sent: bool
    ) -> Reservation | TripEvent:
        # Only a reserve that went out may have been applied; one that
        # failed on the queue before it never did (so retries in an outage
        # add nothing to the queue).
        if sent and op.rid and corruption(exc) is None and not self._fail_open:
            self._cancel(op.path, Reservation(op.rid, 0, 0, op.steps_held, op.retry, op.pools))
        return self._reserve_failed(
            exc,
            op.path,
            op.cost_nano,
            op.tokens,
            op.step,
            op.steps,
            op.retry,
            op.signature,
            op.pools,
        )

    def _reserved(self, op: _ReserveOp, reply: Any) -> Reservation | TripEvent:
        """Read the RESERVE script's reply."""
        if self._down:
            self._back()
        path = op.path
        if op.pools and reply[0] == 5:
            return self._pool_denied(path, reply, op.pools)
        if reply[0] == 1:
            self._marks.remember(path, reply, 4)
            if reply[3]:
                self._reseeded(path)
            if op.rid:
                self._marks.hold(op.rid, op.tree)
            return Reservation(op.rid, op.cost_nano, op.tokens, op.steps_held, op.retry, op.pools)
        return self._denied(path, op.keys, reply)

    def _pool_denied(
        self, path: Sequence[Level], reply: Any, pools: Sequence[PoolLevel]
    ) -> TripEvent:
        """A pool's denial (nothing held anywhere) that the chain's own verdict
        did not beat; that verdict's report (after the denial's 8 fields)
        keeps this client's marks of the chain."""
        if len(reply) > 8:
            self._marks.remember(path, reply, 12)
            if reply[11]:
                self._reseeded(path)
        return self._pools.denial(reply, pools, path[-1].chain_id)

    def _denied(self, path: Sequence[Level], keys: list[str], reply: Any) -> TripEvent:
        code, at, marks = reply[0], int(reply[1]), self._marks
        if code == 4:
            start = 4 + (at - 1) * _scripts.MARKS
            chain = path[at - 1].chain_id
            lost = lost_words(marks.of(chain), reply[start : start + _scripts.MARKS])
            raise LedgerLostError.for_chain(self.store, chain, lost)
        marks.remember(path, reply, 4)
        if reply[3]:
            self._reseeded(path)
        denial = self._codec.decode(reply[2], keys[at - 1])
        return denial if code == 2 else replace(denial, sticky=False)

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
        local = self._local
        if local is not None:
            view = _local_view(reservation)
            return local.commit(path, view, cost_nano, tokens, release_steps=release_steps)
        op = self._commit_op(path, reservation, cost_nano, tokens, release_steps)
        if reservation.pools:
            plan = self._pooled_commit(op, reservation, release_steps)
            return self._committed(op, drive(plan, self._settle))
        return self._committed(op, self._settle(op))

    def _commit_op(
        self,
        path: Sequence[Level],
        reservation: Reservation,
        cost_nano: int,
        tokens: int,
        release_steps: int,
    ) -> _Pending:
        """The COMMIT script's call (shared with the async acommit)."""
        back = min(max(0, release_steps), reservation.step)
        # Usage too large for the store is counted as STORE_MAX + 1 (it trips
        # any limited level); raising here would leave the reservation held.
        cost_nano = _amount("cost_nano", cost_nano)
        tokens = _amount("tokens", tokens)
        keys = self._space.settle_keys(path)
        rid = reservation.id
        if rid:
            self._marks.live.pop(rid, None)
        else:  # a commit without a reservation gets an id too: a replay counts once
            rid = _new_id()
        args = [
            str(len(path)),
            rid,
            str(reservation.cost_nano),
            str(reservation.tokens),
            str(cost_nano),
            str(tokens),
            self._chain_ttl,
            str(back),
        ]
        for level in path:
            cached = self._space.level_args(level)
            args += (cached[0], cached[4], cached[3])
        self._settle_args(path, args, rid)
        return _Pending(self._commit, keys, args, path, cost_nano, tokens)

    def _committed(self, op: _Pending, reply: Any) -> TripEvent | None:
        """The trip a settled commit reports (None: queued, or within limits)."""
        if reply is None or not reply[0]:
            return None
        return self._codec.decode(reply[1], op.keys[int(reply[0]) - 1])

    def release(self, path: Sequence[Level], reservation: Reservation) -> None:
        """Give back a reservation whose call was never sent (its step too)."""
        local = self._local
        if local is not None:
            if not reservation.id:
                local.release(path, reservation)
            return
        op = self._release_op(path, reservation)
        if op is not None:
            if reservation.pools:
                drive(self._settle_pooled(op, reservation, (0, 0, 0), False), self._settle)
            else:
                self._settle(op)

    def _release_op(self, path: Sequence[Level], reservation: Reservation) -> _Pending | None:
        """The RELEASE script's call, or None when nothing was reserved."""
        if not reservation.id:
            return None  # nothing was reserved (no step, retry, cost or tokens)
        self._marks.live.pop(reservation.id, None)
        keys = self._space.settle_keys(path)
        args = [
            str(len(path)),
            reservation.id,
            str(reservation.cost_nano),
            str(reservation.tokens),
            str(int(reservation.step)),
            "1" if reservation.retry else "0",
            self._chain_ttl,
        ]
        self._settle_args(path, args, reservation.id)
        return _Pending(self._release, keys, args, path, 0, 0)

    def _pooled_commit(
        self, op: _Pending, reservation: Reservation, release_steps: int
    ) -> Generator[_Pending, Any, Any]:
        """:meth:`_settle_pooled` of a commit (its steps less those given back)."""
        back = min(max(0, release_steps), reservation.step)
        amounts = (op.cost_nano, op.tokens, reservation.step - back)
        return self._settle_pooled(op, reservation, amounts, True)

    def _settle_pooled(
        self, op: _Pending, reservation: Reservation, amounts: tuple[int, int, int], commit: bool
    ) -> Generator[_Pending, Any, Any]:
        """Settle in the chain and the reservation's pools: a plan yielding each
        settlement (sent its settled reply); returns the chain's reply."""
        ops = self._pools.settlement(op.keys, op.args, reservation, amounts, commit)
        reply = None
        for script, keys, args, chain in ops:
            if chain:
                pending = op if script is None else op._replace(script=script, keys=keys, args=args)
                reply = yield pending
                if script is not None:
                    self._pools.settled(reservation.pools, reply, 3 + _scripts.MARKS * len(op.path))
            else:
                pool_reply = yield _Pending(script, keys, args, (), 0, 0)
                self._pools.settled(reservation.pools, pool_reply, 4)
        return reply

    def _cancel(self, path: Sequence[Level], reservation: Reservation) -> None:
        """Queue the release of a reserve whose reply never came: the store may
        have applied it (the reply was lost), and its call is not sent. Replayed
        before the next operation; the release gives back what the record holds
        (amounts 0 here: with no record there is nothing to take from a ghost),
        and its id then refuses a late copy of the reserve."""
        keys = self._space.settle_keys(path)
        args = [
            str(len(path)),
            reservation.id,
            "0",
            "0",
            str(int(reservation.step)),
            "1" if reservation.retry else "0",
            self._chain_ttl,
        ]
        self._settle_args(path, args, reservation.id)
        op = _Pending(self._release, keys, args, path, 0, 0)
        ops = [op]
        if reservation.pools:
            ops = []
            for script, k, a, chain in self._pools.settlement(
                keys, args, reservation, (0, 0, 0), False
            ):
                if chain:
                    ops.append(op if script is None else op._replace(script=script, keys=k, args=a))
                else:
                    ops.append(_Pending(script, k, a, (), 0, 0))
        with self._pending_lock:
            self._pending.extend(ops)

    def trip(self, chain_id: str, event: TripEvent) -> TripEvent:
        """Make a trip sticky; the first trip wins and is returned.

        Raises:
            LedgerUnavailableError: The store cannot be reached.
        """
        local = self._local
        if local is not None:
            return local.trip(chain_id, event)
        key, args = self._trip_args(chain_id, event)
        reply = self._call(chain_id, self._trip, [key], args)
        if reply is _LOCAL:
            return self.trip(chain_id, event)
        return self._tripped(chain_id, key, event, reply)

    def _trip_args(self, chain_id: str, event: TripEvent) -> tuple[str, list[str]]:
        key = self._space.chain(chain_id).chain
        raw = self._codec.encode(event)
        return key, [raw, self._chain_ttl, *self._marks.of(chain_id), _new_id()]

    def _tripped(self, chain_id: str, key: str, event: TripEvent, reply: Any) -> TripEvent:
        self._remember_one(chain_id, reply, 2)
        if not text(reply[0]):
            return event
        return self._codec.decode(reply[0], key)

    def clear_trip(self, chain_id: str) -> TripEvent | None:
        """Remove a sticky trip (only the logged override path calls this).

        Returns the trip that was removed, or None.
        """
        local = self._local
        if local is not None:
            return local.clear_trip(chain_id)
        key = self._space.chain(chain_id).chain
        reply = self._call(chain_id, self._clear_trip, [key], [])
        if reply is _LOCAL:
            return self.clear_trip(chain_id)
        return None if reply is None else self._codec.decode(reply, key)

    def override(
        self, chain_id: str, *, expires_at: float, add_cost_nano: int = 0, add_steps: int = 0
    ) -> TripEvent | None:
        """Lift the chain's sticky trip and widen its ceilings until ``expires_at``.

        ``expires_at`` is wall time here; the store keeps it on its own clock
        (now + the remaining duration), so every process agrees when it ends.
        One round trip. Returns the lifted trip, or None.
        """
        local = self._local
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
        reply = self._call(chain_id, self._override, [key], args)
        if reply is _LOCAL:
            return self.override(
                chain_id, expires_at=expires_at, add_cost_nano=add_cost_nano, add_steps=add_steps
            )
        if len(reply) == 1:
            raise ValueError(
                f"chain {chain_id!r} does not exist in the ledger store {self.store} "
                f"(key {key!r}): nothing to override; check the chain id and the key prefix"
            )
        self._remember_one(chain_id, reply, 2)
        return self._codec.decode(reply[0], key) if text(reply[0]) else None

    def snapshot(self, chain_id: str) -> LedgerState:
        """The chain's counters in one ``HMGET`` (zero for an unknown chain).

        Raises:
            LedgerUnavailableError: The store cannot be reached.
            LedgerCorruptedError: A counter holds a foreign value.
        """
        local = self._local
        if local is not None:
            return local.snapshot(chain_id)
        key = self._space.chain(chain_id).chain
        values = self._call(chain_id, None, [key], [])
        if values is _LOCAL:
            return self.snapshot(chain_id)
        return self._state(chain_id, key, values)

    def _state(self, chain_id: str, key: str, values: Sequence[Any]) -> LedgerState:
        """A snapshot's ``HMGET`` values as counters (shared with asnapshot)."""
        c, rc, s, r, t, rt = (
            parse_int(key, field, value)
            for field, value in zip(_SNAPSHOT_FIELDS[:6], values[:6], strict=True)
        )
        trip = values[6]
        mark = self._marks.seen.get(chain_id)
        if mark is not None and self._lost(mark, values):
            # The store lost what we saw: report at least that (the next
            # write re-seeds it); never a lifted trip.
            c, s, t = max(c, int(mark[1])), max(s, int(mark[2])), max(t, int(mark[3]))
            if trip is None and text(mark[5]):
                trip = mark[5]
        return LedgerState(
            c, rc, s, r, t, rt, None if trip is None else self._codec.decode(trip, key)
        )

    def trip_lifted(self, chain_id: str) -> bool:
        """Whether an override (maybe by another process) lifted ``chain_id``'s trip.

        Only an explicit override record lifts it: the chain still in the
        epoch we saw, no trip, and its override generation past the one we
        saw with the trip. A chain the store lost is not lifted. One ``HMGET``.
        """
        local = self._local
        if local is not None:
            return local.snapshot(chain_id).trip is None
        key = self._space.chain(chain_id).chain
        values = self._call(chain_id, None, [key], [])
        if values is _LOCAL:
            return self.trip_lifted(chain_id)
        return self._lifted(chain_id, key, values)

    def _lifted(self, chain_id: str, key: str, values: Sequence[Any]) -> bool:
        epoch, trip, ov = values[7], values[6], parse_int(key, "ov", values[8])
        if trip is not None or epoch is None:
            return False
        mark = self._marks.seen.get(chain_id)
        if mark is None:
            return ov > 0
        if text(epoch) != text(mark[0]) or ov <= int(mark[4]):
            return False
        self._marks.seen[chain_id] = (*mark[:4], str(ov), "", *mark[6:])
        return True

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
            self, path, cost_nano, tokens, step, steps, retry, signature, pools
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
        return await _aledger.commit(self, path, reservation, cost_nano, tokens, release_steps)

    async def arelease(self, path: Sequence[Level], reservation: Reservation) -> None:
        """:meth:`release` without blocking the event loop."""
        await _aledger.release(self, path, reservation)

    async def atrip(self, chain_id: str, event: TripEvent) -> TripEvent:
        """:meth:`trip` without blocking the event loop."""
        return await _aledger.trip(self, chain_id, event)

    async def asnapshot(self, chain_id: str) -> LedgerState:
        """:meth:`snapshot` without blocking the event loop."""
        return await _aledger.snapshot(self, chain_id)

    async def atrip_lifted(self, chain_id: str) -> bool:
        """:meth:`trip_lifted` without blocking the event loop."""
        return await _aledger.trip_lifted(self, chain_id)

    async def apool_snapshot(self, pool: PoolLevel) -> PoolSnapshot:
        """:meth:`pool_snapshot` without blocking the event loop."""
        return await _aledger.pool_snapshot(self, pool)

    async def aflush(self) -> int:
        """:meth:`flush` on the running loop; returns how many are still queued."""
        return await _aledger.flush(self)

    async def aclose(self) -> None:
        """Close the running loop's asyncio client now (the loop's end closes it anyway)."""
        await _aledger.close(self)

    @property
    def async_clients(self) -> int:
        """How many event loops hold an asyncio client of this ledger."""
        return len(self._aio)

    def heartbeat(self) -> int:
        """Keep this process's running calls' reservations alive; returns how many.

        The heartbeat thread calls it every ``reservation_ttl_s / 3`` seconds.
        A store error is logged at DEBUG and left to the next beat.
        """
        if self._local is not None:
            return 0
        renewed = 0
        token = _attach(quiet())
        try:
            for (rh, rz, base), ids in self._marks.groups().items():
                try:
                    args = [self._rsv_ttl, self._chain_ttl, base, *ids]
                    renewed += int(self._heartbeat([rh, rz], args))
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
        local = self._local
        if local is not None:
            return local.pool_snapshot(pool)
        reply = self._call(f"(pool {pool.name})", _POOL_SNAPSHOT, [pool.name], [])
        if reply is _LOCAL:
            return self.pool_snapshot(pool)
        return reply  # type: ignore[no-any-return]

    def pool_names(self) -> list[str]:
        """The names of every pool in the store (a SCAN of the pool key space)."""
        reply = self._call("(pools)", _POOL_NAMES, [], [])
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
        if self._local is None and self._pending:
            token = _attach(quiet())
            try:
                self._flush()
            except redis.RedisError as exc:
                self._flush_failed(exc)
            finally:
                _detach(token)
        return len(self._pending)

    def _flush_failed(self, exc: redis.RedisError) -> None:
        found = corruption(exc)
        if found is not None:
            raise found from exc
        self._went_down(exc)

    # -- plumbing ------------------------------------------------------------

    def _settle(self, op: _Pending) -> Any:
        token = _attach(quiet())
        try:
            if self._pending:
                self._flush()
            reply = op.script(op.keys, op.args)
        except redis.RedisError as exc:
            return self._settle_failed(op, exc)
        finally:
            _detach(token)
        return self._settled(op, reply)

    def _settle_failed(self, op: _Pending, exc: redis.RedisError) -> None:
        """A commit or release the store did not answer: queued for replay."""
        found = corruption(exc)
        if found is not None:
            raise found from exc
        self._went_down(exc)
        with self._pending_lock:
            self._pending.append(op)
        if self._fail_open:
            self._go_local(exc)

    def _settled(self, op: _Pending, reply: Any) -> Any:
        if self._down:
            self._back()
        self._marks.remember(op.path, reply, 3)
        if reply[2]:
            self._reseeded(op.path)
        return reply

    def _call(self, chain_id: str, script: Script | None, keys: list[str], args: list[str]) -> Any:
        """One read or trip operation; raises LedgerUnavailableError on failure.

        Returns ``_LOCAL`` when the ledger just failed open (the caller retries
        on the local ledger).
        """
        token = _attach(quiet())
        try:
            if self._pending:
                self._flush()
            if script is None:
                reply: Any = self._client.hmget(keys[0], _SNAPSHOT_FIELDS)
            elif script is _POOL_SNAPSHOT:
                reply = self._pools.snapshot(keys[0])
            elif script is _POOL_NAMES:
                reply = self._pools.names()
            else:
                reply = script(keys, args)
        except redis.RedisError as exc:
            return self._call_failed(chain_id, keys, exc)
        finally:
            _detach(token)
        if self._down:
            self._back()
        return reply

    def _call_failed(self, chain_id: str, keys: list[str], exc: redis.RedisError) -> Any:
        """``_LOCAL`` when the ledger just failed open; else raises."""
        found = corruption(exc)
        if found is not None:
            if found.key == "(a ledger key)":
                found = LedgerCorruptedError(keys[0], found.field, found.value)
            raise found from exc
        self._went_down(exc)
        if self._fail_open:
            self._go_local(exc)
            return _LOCAL
        raise LedgerUnavailableError.for_store(self.store, chain_id, exc) from exc

    def _reserve_failed(
        self,
        exc: redis.RedisError,
        path: Sequence[Level],
        cost_nano: int,
        tokens: int,
        step: bool,
        steps: int,
        retry: bool,
        signature: str | None,
        pools: Sequence[PoolLevel] = (),
    ) -> Reservation | TripEvent:
        found = corruption(exc)
        if found is not None:
            raise found from exc
        self._went_down(exc)
        if self._fail_open:
            return self._go_local(exc).reserve(  # pools stay bounded there too
                path,
                cost_nano,
                tokens,
                step=step,
                steps=steps,
                retry=retry,
                signature=signature,
                pools=pools,
            )
        raise LedgerUnavailableError.for_store(self.store, path[-1].chain_id, exc) from exc

    def _flush(self) -> None:
        """Replay queued commits and releases in order (raises on store errors)."""
        with self._pending_lock:
            pending = self._pending
            replayed = 0
            while pending:
                op = pending[0]
                op.args[-4] = _new_id()  # a fresh epoch id per attempt (see _settle_args)
                reply: Any = op.script(op.keys, op.args)
                pending.popleft()
                replayed += 1
                self._replayed(op, reply)
        if replayed:
            _logger.info("ledger store %s: %d queued commits replayed", self.store, replayed)

    def _replayed(self, op: _Pending, reply: Any) -> None:
        self._marks.remember(op.path, reply, 3)
        if op.script is self._commit and reply[0]:
            _logger.warning(
                "a replayed commit overran a limit of chain %s; the chain is tripped",
                op.path[int(reply[0]) - 1].chain_id,
            )

    def _went_down(self, exc: BaseException) -> None:
        with self._state_lock:
            first = not self._down
            self._down = True
        if first and not self._fail_open:  # failing open logs once, in _go_local
            _logger.warning(
                "ledger store %s unreachable (%s: %s); failing closed: calls are denied "
                "until it answers",
                self.store,
                type(exc).__name__,
                exc,
            )
        pool = getattr(self._client, "connection_pool", None)
        if pool is not None:  # drop idle sockets to the old server at once
            pool.disconnect(inuse_connections=False)

    def _back(self) -> None:
        with self._state_lock:
            was_down, self._down = self._down, False
        if was_down:
            _logger.info("ledger store %s reachable again", self.store)

    def _go_local(self, exc: BaseException) -> LocalLedger:
        with self._state_lock:
            if self._local is not None:
                return self._local
            local = LocalLedger()
            seeded = seed_local(local, self._marks.seen, self._codec)
            with self._pending_lock:
                for op in self._pending:
                    if op.cost_nano or op.tokens:
                        local.commit(op.path, _NO_RESERVATION, op.cost_nano, op.tokens)
                self._pending.clear()
            self._local = local
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

    def _settle_args(self, path: Sequence[Level], args: list[str], rid: str) -> None:
        marks = self._marks
        for level in path:
            args += marks.of(level.chain_id)
        # A fresh epoch id of its own: the reservation's id may have named the
        # epoch its reserve created, and a lost chain must never come back under
        # the name it had (clients' marks of it would read as current).
        args += (_new_id(), *self._applied, self._rsv_ttl)

    def _remember_one(self, chain_id: str, reply: Any, start: int) -> None:
        self._marks.remember((Level(chain_id, _NO_LIMITS),), reply, start)
        if reply[1]:
            _logger.warning(_RESEEDED, chain_id, self.store)

    def _reseeded(self, path: Sequence[Level]) -> None:
        _logger.warning(_RESEEDED, " / ".join(lv.chain_id for lv in path), self.store)

    @staticmethod
    def _lost(mark: tuple[Any, ...], values: Sequence[Any]) -> bool:
        """The script's ``lost`` test, on a snapshot's ``HMGET`` values."""
        if not text(mark[0]):
            return False
        c = 0 if values[0] is None else int(values[0])
        t = 0 if values[4] is None else int(values[4])
        ov = 0 if values[8] is None else int(values[8])
        k = 0 if values[9] is None else int(values[9])
        kt = 0 if values[10] is None else int(values[10])
        return not (
            values[7] is not None
            and text(values[7]) == text(mark[0])
            and c + k >= int(mark[1])
            and t + kt >= int(mark[3])
            and (not text(mark[5]) or values[6] is not None or ov > int(mark[4]))
        )

    def __repr__(self) -> str:
        return f"RedisLedger({self.store!r}, key_prefix={self._prefix!r})"


_NO_LIMITS = Limits()
_RESEEDED = (
    "chain %s: ledger store %s had lost it (restart without persistence, flush, expiry, "
    "eviction or an older copy); re-seeded from this process's marks: committed spend, "
    "steps, tokens and trip are counted again"
)


def _shared_id(given: str | None, store: str, prefix: str) -> str:
    if given is None:
        digest = hashlib.sha256(f"{store}\n{prefix}".encode()).hexdigest()[:24]
        return f"redis:{digest}"
    if not isinstance(given, str) or not 0 < len(given) <= 128 or not given.isprintable():
        raise ValueError(f"shared_id must be 1-128 printable characters, got {given!r}")
    return given


def _amount(name: str, value: int) -> int:
    """``value`` for a script: at most ``_MAX_AMOUNT`` (ValueError if not an int >= 0)."""
    if type(value) is not int or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value if value <= _MAX_AMOUNT else _MAX_AMOUNT


def _local_view(reservation: Reservation) -> Reservation:
    # A reservation made in the store holds nothing in the local fallback.
    return reservation if not reservation.id else _NO_RESERVATION
