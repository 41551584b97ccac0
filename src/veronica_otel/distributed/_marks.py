"""What a RedisLedger client remembers so the store can never forget a chain.

* **Marks** (``Marks.seen``): per chain, the last ``(e, c, s, t, ov, trip, rc, rt)``
  the store reported, as the reply gave them (bytes or str: they go back to
  the scripts as ARGV unchanged, no conversion on the hot path). The scripts
  re-seed a chain from them when the store lost it (``_scripts.py``).
  At most :data:`MARKS_LIMIT` chains; the oldest inserted is forgotten first.
* **Live reservations** and the heartbeat that keeps them alive in the store
  while their calls run (one HEARTBEAT script per chain tree every
  ``reservation_ttl_s / 3`` seconds), from one daemon thread per process,
  started at the first reservation; clients are held weakly.
* Seeding the process-local fallback from the marks (fail open).
* The persistence check of a store (``CONFIG GET``), once per store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

import redis

from veronica_otel._ledger import Level, LocalLedger

from ._scripts import MARKS
from ._store import TripCodec, text


class _Heartbeating(Protocol):
    """What the marks need of their ledger: a way to renew its reservations."""

    def heartbeat(self) -> object: ...


__all__ = [
    "MARKS_LIMIT",
    "NO_MARKS",
    "Marks",
    "acheck_persistence",
    "check_persistence",
    "lost_words",
    "seed_local",
]

_logger = logging.getLogger("veronica_otel.distributed")

MARKS_LIMIT = 65536
NO_MARKS: tuple[Any, ...] = ("", "0", "0", "0", "0", "", "0", "0", "")


class Marks:
    """A client's marks of each chain, and its live reservations."""

    __slots__ = ("__weakref__", "_due", "_ledger", "_period", "_stopped", "live", "seen")

    def __init__(self, ledger: _Heartbeating, reservation_ttl_s: float) -> None:
        self.seen: dict[str, tuple[Any, ...]] = {}
        self.live: dict[str, tuple[str, str, str]] = {}  # id -> (rh, rz, chain key base)
        self._ledger = weakref.ref(ledger)
        self._period = reservation_ttl_s / 3 if reservation_ttl_s > 0 else None
        self._due = 0.0  # next heartbeat (monotonic); 0: not scheduled
        self._stopped = False

    def of(self, chain_id: str) -> tuple[Any, ...]:
        return self.seen.get(chain_id, NO_MARKS)

    def remember(self, path: Sequence[Level], reply: Sequence[Any], start: int) -> None:
        """Keep the report that starts at ``reply[start]`` (MARKS values per level)."""
        seen = self.seen
        for level in path:
            chain = level.chain_id
            if chain not in seen and len(seen) >= MARKS_LIMIT:
                with contextlib.suppress(StopIteration, KeyError, RuntimeError):
                    del seen[next(iter(seen))]  # (another thread may have got there)
            seen[chain] = tuple(reply[start : start + MARKS])
            start += MARKS

    def hold(self, rid: str, tree: tuple[str, str, str]) -> None:
        """Track a live reservation (the heartbeat keeps it alive)."""
        self.live[rid] = tree
        if not self._due and self._period is not None and not self._stopped:
            self._due = time.monotonic() + self._period
            _Heartbeat.add(self)

    def stop(self) -> None:
        """No more heartbeats for this client."""
        self._stopped = True
        _Heartbeat.remove(self)

    def groups(self) -> dict[tuple[str, str, str], list[str]]:
        """Live reservation ids by chain tree."""
        out: dict[tuple[str, str, str], list[str]] = {}
        for rid, tree in list(self.live.items()):
            out.setdefault(tree, []).append(rid)
        return out

    def beat(self, now: float) -> float:
        """Heartbeat if due; returns when the next one is due."""
        period = self._period
        if period is None:
            return now + 3600.0
        if now >= self._due:
            ledger = self._ledger()
            if ledger is not None:
                try:
                    ledger.heartbeat()
                except Exception:  # never let the thread die; the next beat tries again
                    _logger.debug("ledger heartbeat failed", exc_info=True)
            self._due = now + period
        return self._due


class _Heartbeat:
    """One daemon thread for every client of the process: it wakes when the
    soonest heartbeat is due (clients are held weakly)."""

    clients: ClassVar[weakref.WeakSet[Marks]] = weakref.WeakSet()
    lock: ClassVar[threading.Lock] = threading.Lock()
    wake: ClassVar[threading.Event] = threading.Event()
    thread: ClassVar[threading.Thread | None] = None

    @classmethod
    def add(cls, marks: Marks) -> None:
        with cls.lock:
            cls.clients.add(marks)
            if cls.thread is None:
                cls.thread = threading.Thread(
                    target=cls.run, name="veronica-ledger-heartbeat", daemon=True
                )
                cls.thread.start()
        cls.wake.set()

    @classmethod
    def remove(cls, marks: Marks) -> None:
        with cls.lock:
            cls.clients.discard(marks)

    @classmethod
    def run(cls) -> None:
        while True:
            with cls.lock:
                clients = list(cls.clients)
            now = time.monotonic()
            soonest = now + 3600.0
            for marks in clients:
                soonest = min(soonest, marks.beat(now))
            del clients
            cls.wake.wait(max(0.01, soonest - time.monotonic()))
            cls.wake.clear()

    @classmethod
    def after_fork(cls) -> None:
        # The child has no heartbeat thread and holds none of the parent's calls.
        cls.lock = threading.Lock()
        cls.wake = threading.Event()
        cls.thread = None
        for marks in list(cls.clients):
            marks.live = {}
            marks._due = 0.0
        cls.clients = weakref.WeakSet()


os.register_at_fork(after_in_child=_Heartbeat.after_fork)


def seed_local(local: LocalLedger, seen: dict[str, tuple[Any, ...]], codec: TripCodec) -> int:
    """Give the local fallback every chain this client saw; returns how many."""
    seeded = 0
    with local._lock:
        for chain, mark in list(seen.items()):
            if not text(mark[0]):
                continue
            state = local._state(chain)
            state.cost_nano = max(state.cost_nano, int(mark[1]))
            state.steps = max(state.steps, int(mark[2]))
            state.tokens = max(state.tokens, int(mark[3]))
            raw = text(mark[5])
            if raw and state.trip is None:
                try:
                    state.trip = codec.decode(raw, chain)
                except Exception:  # a trip we cannot read still stops the chain
                    _logger.warning("chain %s: its stored trip could not be read", chain)
            seeded += 1
    return seeded


def lost_words(mark: tuple[Any, ...], found: Sequence[Any]) -> str:
    """What the store lost of a chain: its report ``found`` against ``mark``."""
    mine, now = text(mark[0]), text(found[0])
    words = []
    if not now:
        words.append("the chain is gone")
    elif now != mine:
        words.append(f"epoch {now} instead of {mine}")
    c0, c1 = int(mark[1]), int(found[1])
    if c1 < c0:
        words.append(f"committed {c0 / 1e9:g} USD -> {c1 / 1e9:g} USD")
    t0, t1 = int(mark[3]), int(found[3])
    if t1 < t0:
        words.append(f"tokens {t0} -> {t1}")
    if text(mark[5]) and not text(found[5]):
        words.append("its trip")
    return ", ".join(words) or "an older copy of the chain"


_checked: set[str] = set()
_checked_lock = threading.Lock()


def check_persistence(client: redis.Redis, store: str) -> bool:
    """Warn once per store when it can lose or evict the ledger's keys.

    Returns False when the store could not be asked (try again later).
    """
    with _checked_lock:
        if store in _checked:
            return True
    try:
        pipe = client.pipeline(transaction=False)
        for name in _PERSISTENCE:
            pipe.config_get(name)
        replies = pipe.execute()
    except Exception as exc:
        return _judge(store, None, exc)
    return _judge(store, replies, None)


async def acheck_persistence(client: Any, store: str) -> bool:
    """:func:`check_persistence` with an asyncio client (same checks, same warnings)."""
    with _checked_lock:
        if store in _checked:
            return True
    try:
        pipe = client.pipeline(transaction=False)
        for name in _PERSISTENCE:
            pipe.config_get(name)
        replies = await pipe.execute()
    except Exception as exc:
        return _judge(store, None, exc)
    return _judge(store, replies, None)


_PERSISTENCE = ("appendonly", "save", "maxmemory-policy")


def _judge(store: str, replies: Any, exc: Exception | None) -> bool:
    if isinstance(exc, redis.ResponseError):
        _logger.info(
            "ledger store %s: CONFIG is disabled (%s), so its persistence and eviction "
            "policy cannot be checked; it needs appendonly yes and maxmemory-policy noeviction",
            store,
            exc,
        )
    elif isinstance(exc, redis.RedisError):
        return False  # unreachable: the operation itself reports it; ask again later
    elif exc is not None:  # a client that cannot pipeline CONFIG (cluster, proxy)
        _logger.info("ledger store %s: persistence not checked (%r)", store, exc)
    with _checked_lock:
        if store in _checked:
            return True
        _checked.add(store)
    if replies is None:
        return True
    values = [{text(k): text(v) for k, v in reply.items()} for reply in replies]
    aof = values[0].get("appendonly", "")
    save = values[1].get("save", "")
    policy = values[2].get("maxmemory-policy", "")
    if aof == "no" and not save.strip():
        _logger.warning(
            "ledger store %s has no persistence (appendonly no, save ''): a restart empties "
            "it. Chains a live client saw are re-seeded from its marks, but a chain no live "
            "client knows starts again at zero; set appendonly yes",
            store,
        )
    if policy.startswith(("allkeys-", "volatile-")):
        _logger.warning(
            "ledger store %s has maxmemory-policy %s, which evicts keys under memory "
            "pressure: an evicted chain starts again at zero unless a live client re-seeds "
            "it; set maxmemory-policy noeviction",
            store,
            policy,
        )
    return True
