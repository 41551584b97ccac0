"""RedisLedger's chain operations: each script's keys and arguments, and its reply read.

The plan of every chain operation (reserve, commit, release, trip, override,
snapshot), all but the round trip: the sync ledger (``_ledger.py``) and its
async form (``_aledger.py``) send what is built here through their own
client and hand the reply back, so both read every reply and failure the
same way. The scripts and the keys are described in ``_scripts.py``.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import redis

from veronica_otel._errors import TripEvent
from veronica_otel._ledger import (
    LedgerState,
    Level,
    Limits,
    PoolLevel,
    Reservation,
    step_count,
)

from . import _scripts
from ._errors import LedgerLostError
from ._ids import new_id
from ._keys import KeySpace
from ._link import Pending, StoreLink
from ._marks import Marks, lost_words
from ._pools import Plan, PoolStore
from ._store import SNAPSHOT_FIELDS, TripCodec, corruption, parse_int, text

__all__ = ["ChainOps", "ReserveOp", "Scripts"]

# One amount a script is given: above STORE_MAX, any limit refuses it or trips.
_MAX_AMOUNT = _scripts.STORE_MAX + 1
_NO_LIMITS = Limits()


class Scripts:
    """The chain scripts, registered on one client (``EVALSHA`` after the first)."""

    __slots__ = ("clear_trip", "commit", "heartbeat", "override", "release", "reserve", "trip")

    def __init__(self, client: redis.Redis) -> None:
        self.reserve = client.register_script(_scripts.RESERVE)
        self.commit = client.register_script(_scripts.COMMIT)
        self.release = client.register_script(_scripts.RELEASE)
        self.trip = client.register_script(_scripts.TRIP)
        self.clear_trip = client.register_script(_scripts.CLEAR_TRIP)
        self.override = client.register_script(_scripts.OVERRIDE)
        self.heartbeat = client.register_script(_scripts.HEARTBEAT)


class ReserveOp(NamedTuple):
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


class ChainOps:
    """Builds each chain operation's script call and reads its reply.

    Args:
        scripts: The registered chain scripts.
        link: The store link (queues, health, marks).
        space: The ledger's key space.
        pools: The pools' keys and scripts.
        ttls: ``(reservation_ttl_us, chain_ttl_ms, marker_ttl_us)`` as the
            scripts take them.
        applied: ``[applied_ttl_us, applied_cap]``.
        memory: Signatures remembered per chain.
        on_loss: ``"reseed"`` or ``"fail"``.
    """

    def __init__(
        self,
        scripts: Scripts,
        link: StoreLink,
        space: KeySpace,
        pools: PoolStore,
        ttls: tuple[str, str, str],
        applied: list[str],
        memory: str,
        on_loss: str,
    ) -> None:
        self.scripts = scripts
        self.link = link
        self.space = space
        self.pools = pools
        self.marks: Marks = link.marks
        self.codec: TripCodec = link.codec
        self.rsv_ttl, self.chain_ttl, self.marker_ttl = ttls
        self.applied = applied
        self.memory = memory
        self.on_loss = on_loss

    # -- reserve -------------------------------------------------------------

    def reserve_op(
        self,
        path: Sequence[Level],
        cost_nano: int,
        tokens: int,
        step: bool,
        steps: int,
        retry: bool,
        signature: str | None,
        pools: Sequence[PoolLevel] = (),
    ) -> ReserveOp:
        """The RESERVE script's keys and arguments for one reservation."""
        count = step_count(steps) if step else 0
        cost_nano = amount("cost_nano", cost_nano)
        tokens = amount("tokens", tokens)
        n = len(path)
        if n == 1:
            ck = self.space.chain(path[0].chain_id)
            keys = [ck.chain, ck.signatures, ck.recency, ck.reservations, ck.expiries, ck.applied]
        else:
            cks = self.space.tree(path)
            ck = cks[0]
            keys = [k.chain for k in cks]
            keys += [k.signatures for k in cks]
            keys += [k.recency for k in cks]
            keys += [ck.reservations, ck.expiries, ck.applied]
        rid = new_id() if (cost_nano or tokens or count or retry) else ""
        args = [
            str(n),
            str(cost_nano),
            str(tokens),
            str(count),
            "1" if retry else "0",
            "" if signature is None else "=" + signature,
            rid,
            self.rsv_ttl,
            self.chain_ttl,
            self.marker_ttl,
            self.memory,
            ck.base,
        ]
        marks = self.marks
        for level in path:
            args += self.space.level_args(level)
        for level in path:
            args += marks.of(level.chain_id)
        args += (rid or new_id(), self.on_loss)
        tree = (ck.reservations, ck.expiries, ck.base)
        return ReserveOp(
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

    def pool_plan(self, op: ReserveOp) -> Plan:
        """The pooled reserve's round trips (see ``_pools.py``)."""
        amounts = (op.cost_nano, op.tokens, op.steps_held)
        return self.pools.reserving(
            self.scripts.reserve,
            op.keys,
            op.args,
            len(op.path),
            op.pools,
            op.rid,
            amounts,
            op.path,
        )

    def pool_undo(self, op: ReserveOp, reply: Any) -> Pending | None:
        """The release of the pools' hold when the chain denied a call they held
        (cluster phase one): settled at once, queued if the store fails then."""
        if not op.pools or not op.rid or reply[0] in (1, 5):
            return None
        undo = self.pools.undo(op.pools, op.rid)
        return None if undo is None else Pending(*undo, (), 0, 0)

    def reserve_error(
        self, exc: redis.RedisError, op: ReserveOp, sent: bool
    ) -> Reservation | TripEvent:
        """A reserve the store did not answer: failed closed (raises), or
        reserved in the local ledger the link failed open to."""
        # Only a reserve that went out may have been applied; one that
        # failed on the queue before it never did (so retries in an outage
        # add nothing to the queue).
        if sent and op.rid and corruption(exc) is None and not self.link.fail_open:
            self.cancel(op.path, Reservation(op.rid, 0, 0, op.steps_held, op.retry, op.pools))
        local = self.link.reserve_failed(exc, op.path[-1].chain_id)
        return local.reserve(  # pools stay bounded there too
            op.path,
            op.cost_nano,
            op.tokens,
            step=op.step,
            steps=op.steps,
            retry=op.retry,
            signature=op.signature,
            pools=op.pools,
        )

    def reserved(self, op: ReserveOp, reply: Any) -> Reservation | TripEvent:
        """Read the RESERVE script's reply."""
        if self.link.down:
            self.link.back()
        path = op.path
        if op.pools and reply[0] == 5:
            return self._pool_denied(path, reply, op.pools)
        if reply[0] == 1:
            self.marks.remember(path, reply, 4)
            if reply[3]:
                self.link.reseeded(path)
            if op.rid:
                self.marks.hold(op.rid, op.tree)
            return Reservation(op.rid, op.cost_nano, op.tokens, op.steps_held, op.retry, op.pools)
        return self._denied(path, op.keys, reply)

    def _pool_denied(
        self, path: Sequence[Level], reply: Any, pools: Sequence[PoolLevel]
    ) -> TripEvent:
        """A pool's denial (nothing held anywhere) that the chain's own verdict
        did not beat; that verdict's report (after the denial's 8 fields)
        keeps this client's marks of the chain."""
        if len(reply) > 8:
            self.marks.remember(path, reply, 12)
            if reply[11]:
                self.link.reseeded(path)
        return self.pools.denial(reply, pools, path[-1].chain_id)

    def _denied(self, path: Sequence[Level], keys: list[str], reply: Any) -> TripEvent:
        code, at, marks = reply[0], int(reply[1]), self.marks
        if code == 4:
            start = 4 + (at - 1) * _scripts.MARKS
            chain = path[at - 1].chain_id
            lost = lost_words(marks.of(chain), reply[start : start + _scripts.MARKS])
            raise LedgerLostError.for_chain(self.link.store, chain, lost)
        marks.remember(path, reply, 4)
        if reply[3]:
            self.link.reseeded(path)
        denial = self.codec.decode(reply[2], keys[at - 1])
        return denial if code == 2 else replace(denial, sticky=False)

    # -- commit and release --------------------------------------------------

    def commit_op(
        self,
        path: Sequence[Level],
        reservation: Reservation,
        cost_nano: int,
        tokens: int,
        release_steps: int,
    ) -> Pending:
        """The COMMIT script's call."""
        back = min(max(0, release_steps), reservation.step)
        # Usage too large for the store is counted as STORE_MAX + 1 (it trips
        # any limited level); raising here would leave the reservation held.
        cost_nano = amount("cost_nano", cost_nano)
        tokens = amount("tokens", tokens)
        keys = self.space.settle_keys(path)
        rid = reservation.id
        if rid:
            self.marks.live.pop(rid, None)
        else:  # a commit without a reservation gets an id too: a replay counts once
            rid = new_id()
        args = [
            str(len(path)),
            rid,
            str(reservation.cost_nano),
            str(reservation.tokens),
            str(cost_nano),
            str(tokens),
            self.chain_ttl,
            str(back),
        ]
        for level in path:
            cached = self.space.level_args(level)
            args += (cached[0], cached[4], cached[3])
        self._settle_args(path, args, rid)
        return Pending(self.scripts.commit, keys, args, path, cost_nano, tokens)

    def committed(self, op: Pending, reply: Any) -> TripEvent | None:
        """The trip a settled commit reports (None: queued, or within limits)."""
        if reply is None or not reply[0]:
            return None
        return self.codec.decode(reply[1], op.keys[int(reply[0]) - 1])

    def release_op(self, path: Sequence[Level], reservation: Reservation) -> Pending | None:
        """The RELEASE script's call, or None when nothing was reserved."""
        if not reservation.id:
            return None  # nothing was reserved (no step, retry, cost or tokens)
        self.marks.live.pop(reservation.id, None)
        return self._release(path, reservation, reservation.cost_nano, reservation.tokens)

    def _release(
        self, path: Sequence[Level], reservation: Reservation, cost: int, tokens: int
    ) -> Pending:
        keys = self.space.settle_keys(path)
        args = [
            str(len(path)),
            reservation.id,
            str(cost),
            str(tokens),
            str(int(reservation.step)),
            "1" if reservation.retry else "0",
            self.chain_ttl,
        ]
        self._settle_args(path, args, reservation.id)
        return Pending(self.scripts.release, keys, args, path, 0, 0)

    def pooled_commit(
        self, op: Pending, reservation: Reservation, release_steps: int
    ) -> Generator[Pending, Any, Any]:
        """:meth:`settle_pooled` of a commit (its steps less those given back)."""
        back = min(max(0, release_steps), reservation.step)
        amounts = (op.cost_nano, op.tokens, reservation.step - back)
        return self.settle_pooled(op, reservation, amounts, True)

    def settle_pooled(
        self, op: Pending, reservation: Reservation, amounts: tuple[int, int, int], commit: bool
    ) -> Generator[Pending, Any, Any]:
        """Settle in the chain and the reservation's pools: a plan yielding each
        settlement (sent its settled reply); returns the chain's reply."""
        ops = self.pools.settlement(op.keys, op.args, reservation, amounts, commit)
        reply = None
        for script, keys, args, chain in ops:
            if chain:
                pending = op if script is None else op._replace(script=script, keys=keys, args=args)
                reply = yield pending
                if script is not None:
                    self.pools.settled(reservation.pools, reply, 3 + _scripts.MARKS * len(op.path))
            else:
                pool_reply = yield Pending(script, keys, args, (), 0, 0)
                self.pools.settled(reservation.pools, pool_reply, 4)
        return reply

    def cancel(self, path: Sequence[Level], reservation: Reservation) -> None:
        """Queue the release of a reserve whose reply never came: the store may
        have applied it (the reply was lost), and its call is not sent. Replayed
        before the next operation; the release gives back what the record holds
        (amounts 0 here: with no record there is nothing to take from a ghost),
        and its id then refuses a late copy of the reserve."""
        op = self._release(path, reservation, 0, 0)
        ops = [op]
        if reservation.pools:
            ops = []
            for script, k, a, chain in self.pools.settlement(
                op.keys, op.args, reservation, (0, 0, 0), False
            ):
                if chain:
                    ops.append(op if script is None else op._replace(script=script, keys=k, args=a))
                else:
                    ops.append(Pending(script, k, a, (), 0, 0))
        self.link.queue(ops)

    def _settle_args(self, path: Sequence[Level], args: list[str], rid: str) -> None:
        marks = self.marks
        for level in path:
            args += marks.of(level.chain_id)
        # A fresh epoch id of its own: the reservation's id may have named the
        # epoch its reserve created, and a lost chain must never come back under
        # the name it had (clients' marks of it would read as current).
        args += (new_id(), *self.applied, self.rsv_ttl)

    # -- trips and reads -----------------------------------------------------

    def trip_args(self, chain_id: str, event: TripEvent) -> tuple[str, list[str]]:
        key = self.space.chain(chain_id).chain
        raw = self.codec.encode(event)
        return key, [raw, self.chain_ttl, *self.marks.of(chain_id), new_id()]

    def tripped(self, chain_id: str, key: str, event: TripEvent, reply: Any) -> TripEvent:
        self.remember_one(chain_id, reply, 2)
        if not text(reply[0]):
            return event
        return self.codec.decode(reply[0], key)

    def state(self, chain_id: str, key: str, values: Sequence[Any]) -> LedgerState:
        """A snapshot's ``HMGET`` values as counters."""
        c, rc, s, r, t, rt = (
            parse_int(key, field, value)
            for field, value in zip(SNAPSHOT_FIELDS[:6], values[:6], strict=True)
        )
        trip = values[6]
        mark = self.marks.seen.get(chain_id)
        if mark is not None and _lost(mark, values):
            # The store lost what we saw: report at least that (the next
            # write re-seeds it); never a lifted trip.
            c, s, t = max(c, int(mark[1])), max(s, int(mark[2])), max(t, int(mark[3]))
            if trip is None and text(mark[5]):
                trip = mark[5]
        return LedgerState(
            c, rc, s, r, t, rt, None if trip is None else self.codec.decode(trip, key)
        )

    def lifted(self, chain_id: str, key: str, values: Sequence[Any]) -> bool:
        """Whether the ``HMGET`` values show an override lifted the trip we saw."""
        epoch, trip, ov = values[7], values[6], parse_int(key, "ov", values[8])
        if trip is not None or epoch is None:
            return False
        mark = self.marks.seen.get(chain_id)
        if mark is None:
            return ov > 0
        if text(epoch) != text(mark[0]) or ov <= int(mark[4]):
            return False
        self.marks.seen[chain_id] = (*mark[:4], str(ov), "", *mark[6:])
        return True

    def remember_one(self, chain_id: str, reply: Any, start: int) -> None:
        self.marks.remember((Level(chain_id, _NO_LIMITS),), reply, start)
        if reply[1]:
            self.link.reseeded((Level(chain_id, _NO_LIMITS),))


def amount(name: str, value: int) -> int:
    """``value`` for a script: at most ``_MAX_AMOUNT`` (ValueError if not an int >= 0)."""
    if type(value) is not int or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value if value <= _MAX_AMOUNT else _MAX_AMOUNT


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
