"""Budget pools in the shared ledger: the client side of ``_pool_scripts.py``.

A call's reservation is made in its chain path and in every pool it names,
all or nothing, and its settlement settles all of them.

Which denial is reported is LocalLedger's order: the chain's own limits
decide first (its trip is stored then, sticky), then a pool's sticky denial,
then the chain's soft denial (only calls in flight fill it), then the pool's.

* **One server** (Redis or Valkey, not a cluster): one script does both
  (``POOLED_RESERVE``: the pools are checked, then the chain's own RESERVE
  runs unchanged, then the pools are charged only if the chain was; when a
  pool denies, the chain's RESERVE runs checks only, charging nothing, and
  both verdicts come back: :meth:`PoolStore.first_denial` picks), so a
  contained call stays one round trip to reserve and one to commit.
* **Redis Cluster**: a chain tree's keys hash to its root's slot, the pools'
  to the one slot of the tag ``{:pools}`` (``POOLS_TAG``), so no script can touch both. The
  two-phase protocol, which cannot overspend:

  1. ``POOL_RESERVE`` in every pool at once (one slot, one script), under
     the call's reservation id, with an expiry the heartbeat renews, like
     the chain's reservations. A pool denial holds nothing; the chain's
     RESERVE then runs checks only (``RESERVE_CHECK``, one more round trip
     on this denial path alone), so its own trip is stored and reported first.
  2. The chain's RESERVE with the same id. If it denies, ``POOL_RELEASE``
     gives the pools back (queued and replayed if the store fails then).
  3. Only then is the call sent: it was held in every pool and the chain.
  4. Settlement: the chain's COMMIT / RELEASE, then the pools' (each queued
     and replayed in order when the store is unreachable; replays are no-ops
     by id). A client that dies between 1 and 4 leaves a pool reservation
     that expires after ``reservation_ttl_s`` and is then charged as spent
     (fail closed, as the chain's reaper does); a late settlement replaces
     the charge. So a pool is always held before the call goes out and
     released only once the call is known not to have run.

  Costs one more round trip to reserve and one more to settle than a call
  without pools.

A pool the store lost (restart without persistence, flush, eviction: its
hash comes back without the epoch this client saw) is re-seeded from this
client's marks of it, as chains are (issue 13): what the marks saw spent
beyond what the pool now holds is counted again, in the current bucket (so
it stays a whole window longer: it can only deny earlier), with a WARNING.
Reservations in flight at the loss are not held again (their commits are
applied as spend when they arrive).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, TypeVar

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script

from veronica_otel._errors import TripEvent
from veronica_otel._ledger import Level, PoolLevel, PoolSnapshot, Reservation
from veronica_otel._units import nano_to_usd

from . import _pool_scripts as scripts
from ._connect import ClusterClient
from ._keys import POOLS_TAG, _limit
from ._scripts import MARKS
from ._store import text

__all__ = ["Plan", "PoolStore", "Request", "drive", "run_script"]

_logger = logging.getLogger("veronica_otel.distributed")

_FORBIDDEN = "{} \t\r\n"
_MARKS_LIMIT = 4096
_NO_MARKS = ("", "0", "0", "0")
# Four values a pool-only script ignores (the ledger's replay queue renews
# the fourth from last of every queued operation: the chain's fresh epoch id).
_TAIL = ("", "", "", "")
_DENIAL = 8  # fields of a pool denial before the chain's verdict that follows it

_S = TypeVar("_S")
_R = TypeVar("_R")
Request = tuple[Script, list[str], list[str]]  # one script call: script, keys, args
# A protocol step by step: yields each round trip's request, is sent its reply.
Plan = Generator[Request, Any, Any]


def drive(plan: Generator[_S, Any, _R], call: Callable[[_S], Any]) -> _R:
    """Run ``plan`` to its end, answering each request it yields with
    ``call(request)`` (the async ledger's ``adrive`` awaits it instead)."""
    try:
        request = next(plan)
        while True:
            request = plan.send(call(request))
    except StopIteration as done:
        result: _R = done.value
        return result


def run_script(request: Request) -> Any:
    """One script call of a :data:`Plan` on the sync client."""
    script, keys, args = request
    return script(keys, args)


class PoolStore:
    """The pools' keys, scripts and marks of one :class:`RedisLedger`."""

    __slots__ = (
        "_ad",
        "_applied",
        "_base",
        "_chain_ttl",
        "_check",
        "_client",
        "_commit",
        "_heartbeat",
        "_marker_ttl",
        "_new_id",
        "_pattern",
        "_release",
        "_reserve",
        "_rh",
        "_rsv_ttl",
        "_rz",
        "_snapshot",
        "clock",
        "cluster",
        "joined_commit",
        "joined_release",
        "joined_reserve",
        "live",
        "marks",
    )

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        *,
        rsv_ttl_us: str,
        marker_ttl_us: str,
        applied: Sequence[str],
        chain_ttl_ms: str,
        new_id: Callable[[], str],
    ) -> None:
        base = f"{prefix}{{{POOLS_TAG}}}:"
        self._base = base + "p:"
        self._pattern = _glob_escape(self._base) + "*"
        self._rh, self._rz, self._ad = base + "rh", base + "rz", base + "ad"
        self._client = client
        self._rsv_ttl, self._marker_ttl, self._chain_ttl = rsv_ttl_us, marker_ttl_us, chain_ttl_ms
        self._applied = tuple(applied)
        self._new_id = new_id
        self.cluster = isinstance(client, (ClusterClient, RedisCluster))
        register = client.register_script
        self.joined_reserve = register(scripts.POOLED_RESERVE)
        self.joined_commit = register(scripts.POOLED_COMMIT)
        self.joined_release = register(scripts.POOLED_RELEASE)
        self._reserve = register(scripts.POOL_RESERVE)
        self._check = register(scripts.RESERVE_CHECK)
        self._commit = register(scripts.POOL_COMMIT)
        self._release = register(scripts.POOL_RELEASE)
        self._heartbeat = register(scripts.POOL_HEARTBEAT)
        self._snapshot = register(scripts.POOL_SNAPSHOT)
        self.marks: dict[str, tuple[Any, ...]] = {}
        self.live: dict[str, None] = {}  # reservation ids held in the pools
        # Tests only: microseconds the pool scripts use instead of the server's TIME.
        self.clock: Callable[[], int] | None = None

    def key(self, name: str) -> str:
        """The Redis key of pool ``name`` (ValueError for a name that cannot be stored)."""
        if not isinstance(name, str) or not name or any(c in name for c in _FORBIDDEN):
            raise ValueError(
                f"pool name {name!r} cannot be stored: it must be non-empty and contain "
                "no braces or whitespace"
            )
        return self._base + name

    # -- reserve ---------------------------------------------------------------

    def reserving(
        self,
        chain_script: Script,
        keys: list[str],
        args: list[str],
        n_levels: int,
        pools: Sequence[PoolLevel],
        rid: str,
        amounts: tuple[int, int, int],
        path: Sequence[Level],
    ) -> Plan:
        """Reserve in the chain (``chain_script(keys, args)``) and every pool:
        a plan that yields each script call ``(script, keys, args)`` and is
        sent its reply (the sync and the async ledger run the same plan, see
        :func:`drive`).

        Returns the chain script's reply, a pool denial (code 5, see
        :meth:`first_denial`) or the chain's own denial. A ``redis.RedisError``
        of a round trip ends the plan (the caller cancels ``rid`` in the chain
        and the pools).
        """
        pk, pa = self._section(pools, rid, amounts, path[-1].chain_id)
        if not self.cluster:
            reply = yield self.joined_reserve, keys + pk, [str(len(pa)), str(len(keys)), *pa, *args]
            if reply[0] == 5:
                return self.first_denial(reply, pools)
            self._remember(pools, reply, 4 + MARKS * n_levels)
            if reply[0] == 1 and rid:
                self.live[rid] = None
            return reply
        first = yield self._reserve, pk, [*pa, *_TAIL]
        if first[0] == 5:  # nothing held: the chain's own verdict decides first
            return self.first_denial([*first, *(yield self._check, keys, args)], pools)
        self._remember(pools, first, 3)
        if rid:  # a call of no amount (no id) is checked, holds nothing
            self.live[rid] = None
        return (yield chain_script, keys, args)

    def first_denial(self, reply: Sequence[Any], pools: Sequence[PoolLevel]) -> Sequence[Any]:
        """Of a pool's denial and the chain's verdict (``reply``: the denial's
        8 fields, then the chain's checked-only RESERVE reply), the one
        LocalLedger reports: the chain's trip (stored by the check), else a
        pool's sticky denial, else the chain's soft denial, else the pool's."""
        verdict = reply[_DENIAL:]
        code = verdict[0] if verdict else 1
        if code in (2, 4) or (code == 3 and int(reply[5]) == 1):
            if int(reply[7]):
                self._reseeded([pools[int(reply[1]) - 1].name])
            return verdict
        return reply

    def undo(
        self, pools: Sequence[PoolLevel], rid: str
    ) -> tuple[Script, list[str], list[str]] | None:
        """The pool-only release of ``rid`` when the chain denied after the
        pools held it (cluster phase one); None when no pool holds it."""
        if not self.cluster or rid not in self.live:
            return None
        self.live.pop(rid, None)
        pk, pa = self._section(pools, rid, (0, 0, 0), "")
        return self._release, pk, [*pa, *_TAIL]

    def denial(self, reply: Sequence[Any], pools: Sequence[PoolLevel], chain_id: str) -> TripEvent:
        """The TripEvent of a pool denial ``{5, j, reason, limit, observed, soft, retry_us}``."""
        pool = pools[int(reply[1]) - 1]
        reason = text(reply[2])
        limit, observed = int(text(reply[3])), int(text(reply[4]))
        soft = int(reply[5]) == 1
        retry_us = int(text(reply[6]))
        if int(reply[7]):
            self._reseeded([pool.name])
        unit = ""
        shown_limit, shown_observed = float(limit), float(observed)
        if reason == "cost":
            shown_limit, shown_observed, unit = nano_to_usd(limit), nano_to_usd(observed), " USD"
        window = "" if pool.window_s is None else f" per {pool.window_s:g}s window"
        message = (
            f"pool {pool.name}: {reason} limit reached (limit {shown_limit:g}{unit}{window}, "
            f"this call would make it {shown_observed:g})"
        )
        retry = retry_us / 1e6 if retry_us >= 0 else None
        if soft:
            message += "; calls in flight hold the rest, try again once they finish"
        elif retry is not None:
            message += f"; the window frees enough in {retry:.3g}s"
        return TripEvent(
            reason,  # type: ignore[arg-type]  # steps, tokens or cost: the script's own
            shown_limit,
            shown_observed,
            chain_id,
            message,
            # As on the in-process ledger: a pool full of committed spend
            # stops the chain (the pool itself never trips); one that only
            # calls in flight fill denies this call alone.
            sticky=not soft,
            pool=pool.name,
            retry_after_s=retry,
        )

    # -- settle ----------------------------------------------------------------

    def settlement(
        self,
        keys: list[str],
        args: list[str],
        reservation: Reservation,
        amounts: tuple[int, int, int],
        commit: bool,
    ) -> list[tuple[Any, list[str], list[str], bool]]:
        """The operations that settle ``reservation``: ``(script, keys, args,
        carries_the_chain)`` for each; one joined script on a single server,
        the chain's then the pools' on a cluster (the caller sends the chain's
        with its own script)."""
        self.live.pop(reservation.id, None)
        # The chain script's id (ARGV[2]): a commit of a reservation without
        # one has its own, so the pools count it once too.
        pk, pa = self._section(reservation.pools, args[1], amounts, "")
        if not self.cluster:
            joined = self.joined_commit if commit else self.joined_release
            return [(joined, keys + pk, [str(len(pa)), str(len(keys)), *pa, *args], True)]
        script = self._commit if commit else self._release
        return [(None, keys, args, True), (script, pk, [*pa, *_TAIL], False)]

    def settled(self, pools: Sequence[PoolLevel], reply: Any, start: int) -> None:
        """Keep the pools' marks from a settlement's reply (report at ``start``)."""
        if reply is not None and len(reply) >= start + 4 * len(pools):
            self._remember(pools, reply, start)

    # -- heartbeat, snapshot, discovery --------------------------------------------

    def heartbeat(self) -> int:
        """Renew this process's held pool reservations; returns how many."""
        ids = list(self.live)
        if not ids:
            return 0
        return int(self._heartbeat([self._rh, self._rz], [self._rsv_ttl, self._chain_ttl, *ids]))

    def snapshot(self, name: str) -> PoolSnapshot:
        """What pool ``name`` holds now (one read-only script; raises RedisError)."""
        return self.snapshot_of(name, run_script(self.snapshot_request(name)))

    def snapshot_request(self, name: str) -> Request:
        """The read-only script call of :meth:`snapshot` (awaited by the async ledger)."""
        clock = "" if self.clock is None else str(self.clock())
        return self._snapshot, [self.key(name)], [clock]

    def snapshot_of(self, name: str, reply: Sequence[Any]) -> PoolSnapshot:
        """Pool ``name``'s snapshot from its script's reply."""
        c, s, t, rc, rs, rt, wu, free = (int(text(v)) for v in reply)
        return PoolSnapshot(
            name=name,
            window_s=wu / 1e6 if wu else None,
            cost_usd=nano_to_usd(c),
            steps=s,
            tokens=t,
            reserved_cost_usd=nano_to_usd(rc),
            reserved_steps=rs,
            reserved_tokens=rt,
            free_in_s=free / 1e6 if free >= 0 else None,
        )

    def names(self) -> list[str]:
        """Every pool in the store, by a SCAN of the pool key space (sorted)."""
        found = {text(key)[len(self._base) :] for key in self._scan()}
        return sorted(found)

    # -- plumbing --------------------------------------------------------------

    def _scan(self) -> Iterator[Any]:
        client: Any = self._client
        if isinstance(client, ClusterClient):
            client = client.redis_cluster
        if isinstance(client, RedisCluster):
            # Every pool key is in the {:pools} slot: scan only its node.
            node = client.get_node_from_key(self._base)  # type: ignore[no-untyped-call]
            client = client.get_redis_connection(node)
        yield from client.scan_iter(match=self._pattern, count=500)

    def _section(
        self,
        pools: Sequence[PoolLevel],
        rid: str,
        amounts: tuple[int, int, int],
        chain_id: str,
    ) -> tuple[list[str], list[str]]:
        cost, tokens, steps = amounts
        keys = [self.key(pool.name) for pool in pools]
        keys += (self._rh, self._rz, self._ad)
        args = [
            str(len(pools)),
            rid,
            str(cost),
            str(tokens),
            str(steps),
            self._base,
            self._rsv_ttl,
            self._marker_ttl,
            *self._applied,
            self._new_id(),
            self._chain_ttl,
            chain_id,
            "" if self.clock is None else str(self.clock()),
        ]
        marks = self.marks
        for pool in pools:
            wu, bu = _window_us(pool)
            limits = pool.limits
            args += (
                pool.name,
                wu,
                bu,
                _limit(limits.cost_nano),
                _limit(limits.steps),
                _limit(limits.tokens),
                *marks.get(pool.name, _NO_MARKS),
            )
        return keys, args

    def _remember(self, pools: Sequence[PoolLevel], reply: Sequence[Any], start: int) -> None:
        marks = self.marks
        lost = []
        for pool in pools:
            old = marks.get(pool.name)
            if old is None and len(marks) >= _MARKS_LIMIT:
                with contextlib.suppress(StopIteration, KeyError, RuntimeError):
                    del marks[next(iter(marks))]
            new = tuple(reply[start : start + 4])
            # Another epoch than the one we saw: the store lost the pool and
            # this operation's script re-seeded it from our marks.
            if old is not None and text(old[0]) and text(new[0]) != text(old[0]):
                lost.append(pool.name)
            marks[pool.name] = new
            start += 4
        if lost:
            self._reseeded(lost)

    @staticmethod
    def _reseeded(names: Sequence[str]) -> None:
        _logger.warning(
            "pool %s: the ledger store had lost it; re-seeded from this process's marks "
            "(spend it saw is counted again in the current window bucket)",
            ", ".join(names),
        )


def _window_us(pool: PoolLevel) -> tuple[str, str]:
    """``(window, bucket)`` in microseconds as script arguments; ``0 0``: lifetime."""
    if pool.window_s is None:
        return "0", "0"
    window = round(pool.window_s * 1_000_000)
    bucket_s = pool.bucket_s if pool.bucket_s is not None else pool.window_s / 60
    bucket = max(1, min(window, round(bucket_s * 1_000_000)))
    if window <= 0 or window > 10**15:
        raise ValueError(f"pool {pool.name!r}: window_s must be > 0 seconds, got {pool.window_s!r}")
    return str(window), str(bucket)


def _glob_escape(value: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in value)
