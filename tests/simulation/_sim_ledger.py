"""Deterministic fault simulation of the shared ledger (in the spirit of VOPR).

One seed fixes everything: how many clients, their calls, what the simulated
provider bills, and which faults strike where. Each client is a real
:class:`~veronica_otel.distributed.RedisLedger` (its own "process": own
pending queue, own clock skew) on a :class:`SimClient` of one
:class:`SimStore`, which runs the real Lua scripts. A seeded scheduler
interleaves the clients one ledger operation at a time and injects faults:

* at every store request (in the transport, so new scripts and commands
  need no change here): ``drop_request`` (never applied), ``lost_reply``
  (applied, then ``ConnectionError``), ``duplicate`` (applied twice);
* per client step: ``crash`` (the client and its in-memory state vanish
  mid-protocol); before a commit, ``late_commit`` (the call outlives the
  reservation TTL, sometimes the late-commit marker too: time passes for
  everyone, heartbeats fire) and ``freeze`` (the same, but this process is
  stopped dead meanwhile, its heartbeat too);
* per scheduler step: ``restart_persist`` (store down a few steps, data
  kept), ``restart_wipe`` (down, data lost), ``clock_jump`` (the store's
  clock steps past the reservation TTL: no client time passes, no heartbeat
  fires), ``expiry`` (the same past the chain TTL: keys expire or are evicted);
* per run: ``skew`` (each client's clock is off by up to 5 s; passed to the
  ledger as ``clock=`` when its constructor takes one).

A ledger with a ``heartbeat()`` method has it called every
``RESERVATION_TTL_S / 3`` of simulated time while its client is alive and not
frozen (its own heartbeat thread is kept from starting).

Each enabled fault class is switched on or off per run by the seed (swarm
testing), so runs with one fault class alone are common. Once the chaos
phase ends, the store comes back and the surviving clients finish their calls
and drain their queues; then the clock passes the reservation TTL and each
surviving client, then a new one, makes one zero-amount reserve: the store
reaps what crashed clients held, and a protocol whose clients remember the
chain may restore what the store lost. The invariants judge that state.

Invariants checked after each run (names as reported):

* ``billed_over_ceiling``: the provider billed more than the cost ceiling.
* ``committed_over_ceiling``: the chain's committed spend exceeds it.
* ``sent_over_steps``: more calls went out than the step limit allows.
* ``committed_lost`` / ``committed_extra``: committed spend is not what the
  provider billed, by the charging rule: a call with usage counts its usage,
  one sent without usage its reservation, an unbilled error reply and an
  unsent call 0; a call whose settlement a crash left unknown counts between
  what was billed and its reservation (the worst case the rule allows), and
  so does a reserve that failed (the store may have applied it) if the client
  crashed before its queued cancel reached the store.
* ``reserved_left``: reserved cost or tokens, or a live reservation record,
  remain once every client is done.
* ``trip_lifted``: a reservation was granted after a client saw a sticky trip
  (nothing here overrides); ``trip_lost``: that trip is gone at the end.
* ``stuck`` (clients never finished) and ``error:<Type>`` (an exception
  other than the ledger's documented ones escaped).

A store loss (``restart_wipe``, or ``expiry`` that removed the chain) is
judged by the guarantee in ``distributed/_scripts.py`` ("What no client can
know"), computed from what the store held at the loss (``_Loss``): the
ceilings may be passed by at most what the lost chain held (committed +
reserved + ``k``) and ``max_steps`` by its steps; committed spend may be
short by what no surviving client's marks saw and by the calls of clients
that crashed while in doubt, and over by the reservations of calls in doubt
at the loss (plus ``k``). ``trip_lifted`` stays strict for the client that
saw the trip (its marks must keep it) and for everyone while no loss
followed the trip; ``trip_lost`` is strict while a client that saw it survives.

``run(seed)`` reproduces a run exactly: the same seed gives the same trace,
the same store digest and the same violations.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import logging
import random
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import redis

from veronica_otel._errors import TripEvent
from veronica_otel._ledger import Level, Limits, Reservation
from veronica_otel.distributed import RedisLedger
from veronica_otel.distributed import _ids as _ids_module
from veronica_otel.distributed._errors import LedgerCorruptedError, LedgerUnavailableError
from veronica_otel.distributed._keys import KeySpace

from ._sim_store import NotEmulatedError, SimClient, SimStore

__all__ = [
    "FAULTS",
    "RunResult",
    "Simulation",
    "run",
    "run_many",
]

FAULTS = (
    "drop_request",
    "lost_reply",
    "duplicate",
    "crash",
    "late_commit",
    "freeze",
    "restart_persist",
    "restart_wipe",
    "clock_jump",
    "expiry",
    "skew",
)

# Per-event probabilities (see the module docstring for where each applies).
RATES = {
    "drop_request": 0.03,
    "lost_reply": 0.03,
    "duplicate": 0.02,
    "crash": 0.02,
    "late_commit": 0.15,
    "freeze": 0.1,
    "restart_persist": 0.02,
    "restart_wipe": 0.01,
    "clock_jump": 0.02,
    "expiry": 0.005,
}

CHAIN = "job"
CEILING = 1000  # nano-USD; calls reserve 50..400 each
RESERVATION_TTL_S = 30.0
CHAIN_TTL_S = 3600.0
MARKER_TTL_S = 60.0  # RedisLedger keeps a reaped reservation's marker max(ttl, 60) s
BEAT_US = int(RESERVATION_TTL_S / 3 * 1_000_000)  # a ledger's heartbeat period, if it has one
MAX_SKEW_US = 5_000_000
_CHAOS_STEPS = 60
_DRAIN_STEPS = 400
_GIVE_UP = 4  # reserve attempts per call before a client gives the call up

LedgerFactory = Callable[[SimClient, Callable[[], float]], Any]


def default_ledger(client: SimClient, clock: Callable[[], float]) -> Any:
    """A RedisLedger on ``client``; it gets ``clock`` if it takes one."""
    kwargs: dict[str, Any] = {}
    if _TAKES_CLOCK:
        kwargs["clock"] = clock
    ledger = RedisLedger(
        client,  # type: ignore[arg-type]
        reservation_ttl_s=RESERVATION_TTL_S,
        chain_ttl_s=CHAIN_TTL_S,
        fail_open=False,
        **kwargs,
    )
    # A ledger with a heartbeat thread beats on the wall clock, from another
    # thread: here it must beat on the simulated clock, from the scheduler
    # (Simulation._advance calls ledger.heartbeat()), so the thread never starts.
    marks = getattr(ledger, "_marks", None)
    if marks is not None and hasattr(marks, "_period"):
        marks._period = None
    return ledger


_TAKES_CLOCK = "clock" in inspect.signature(RedisLedger.__init__).parameters


@dataclass
class _Call:
    client: int
    reserved: int
    sent: bool = False
    billed: int = 0  # what the provider billed (the reservation for "no usage")
    committed: int = 0  # what the client commits (0 for a release)
    settled: bool = False  # commit or release issued
    confirmed: bool = False  # the store answered it (no queued replay left)
    lost: bool = False  # its client crashed before confirmation

    def bounds(self) -> tuple[int, int]:
        """What the store may hold for this call once everything settled."""
        if self.confirmed or not self.lost:
            return self.committed, self.committed
        return (self.billed if self.sent else 0), self.reserved


@dataclass
class _Client:
    idx: int
    ledger: Any
    calls_left: int
    skew_us: int
    next_beat: int = 0  # when its heartbeat fires next (store clock)
    paused: int = 0  # scheduler steps it waits (a long call) before going on
    frozen: bool = False  # while paused, its heartbeat is stopped too
    state: str = "idle"  # idle, reserved, sent, draining, done, crashed
    call: _Call | None = None
    reservation: Reservation | None = None
    attempts: int = 0
    unconfirmed: list[_Call] = field(default_factory=list)
    trip_seen: bool = False  # this client was told of a sticky trip


@dataclass
class _Loss:
    """What the store held of the chain when it lost it (wipe or expiry)."""

    committed: int
    reserved: int
    steps: int
    given_back: int  # k: what late settlements of reaped reservations gave back
    in_doubt: list[_Call]  # calls in flight, or whose settlement no reply confirmed yet
    marks: dict[int, int]  # client -> the committed spend its marks of that epoch saw


@dataclass
class RunResult:
    """The outcome of one seed."""

    seed: int
    faults: tuple[str, ...]  # the fault classes active in this run
    violations: dict[str, str]  # invariant -> detail
    digest: str  # hash of the trace and final store: equal for a reproduced run
    stats: dict[str, int]
    trace: list[str]

    @property
    def ok(self) -> bool:
        return not self.violations


class Simulation:
    """One seeded run. ``Simulation(seed).run()``.

    Args:
        seed: Fixes the whole run.
        faults: The fault classes that may be active (each is then on or off
            per run, chosen by the seed, unless ``swarm`` is False).
        swarm: Pick a random subset of ``faults`` per run.
        ledger_factory: Builds one client's ledger (the protocol under test).
    """

    def __init__(
        self,
        seed: int,
        faults: Iterable[str] = FAULTS,
        *,
        swarm: bool = True,
        ledger_factory: LedgerFactory = default_ledger,
    ) -> None:
        enabled = tuple(faults)
        unknown = sorted(set(enabled) - set(FAULTS))
        if unknown:
            raise ValueError(f"unknown fault classes {unknown}; known: {list(FAULTS)}")
        self.seed = seed
        self.rng = random.Random(seed)
        rng = self.rng
        self.active = frozenset(f for f in enabled if not swarm or rng.random() < 0.5)
        self.store = SimStore()
        self.factory = ledger_factory
        self.trace: list[str] = []
        self.chaos = True
        self.down_steps = 0
        steps = rng.choice([None, rng.randint(2, 10)])
        self.limits = Limits(cost_nano=CEILING, steps=steps)
        self.path = [Level(CHAIN, self.limits)]
        self.calls: list[_Call] = []
        self.trip_seen = False
        self.trip_losses = 0  # losses before the first trip was seen
        self.losses: list[_Loss] = []
        self.violations: dict[str, str] = {}
        self.stats = dict.fromkeys(
            ("sent", "billed", "committed", "faults", "reserves", "denied"), 0
        )
        n_clients = rng.randint(2, 4)
        self.clients = [
            _Client(
                i,
                None,
                rng.randint(1, 4),
                rng.randint(-MAX_SKEW_US, MAX_SKEW_US) if "skew" in self.active else 0,
            )
            for i in range(n_clients)
        ]
        for c in self.clients:
            c.ledger = self._new_ledger(c.skew_us, f"c{c.idx}")
            c.next_beat = self.store.now_us + rng.randint(1, BEAT_US)

    # -- the run ------------------------------------------------------------------

    def run(self) -> RunResult:
        with _deterministic_ids(self.seed), _quiet_logs():
            try:
                self._chaos()
                self._drain()
                self._janitor()
                self._check()
            except NotEmulatedError:
                raise
            except Exception as exc:  # a harness-level surprise is a finding too
                self._violate(f"error:{type(exc).__name__}", repr(exc)[:300])
        body = "\n".join(self.trace) + "\n" + self.store.digest()
        return RunResult(
            self.seed,
            tuple(sorted(self.active)),
            dict(sorted(self.violations.items())),
            hashlib.sha256(body.encode()).hexdigest()[:16],
            dict(self.stats),
            self.trace,
        )

    def _chaos(self) -> None:
        rng = self.rng
        for _ in range(_CHAOS_STEPS):
            live = [c for c in self.clients if c.state not in ("done", "crashed")]
            if not live:
                return
            self._world_faults()
            ready = [c for c in live if not c.paused]
            for c in live:
                if c.paused:
                    c.paused -= 1
                    c.frozen = c.frozen and c.paused > 0
            if ready:
                self._step(rng.choice(ready))
            self._advance(rng.randint(0, 200_000))

    def _drain(self) -> None:
        self.chaos = False
        self.down_steps = 0
        self.store.up = True
        for c in self.clients:
            c.paused, c.frozen = 0, False
        for _ in range(_DRAIN_STEPS):
            live = [c for c in self.clients if c.state not in ("done", "crashed")]
            if not live:
                return
            for client in live:
                self._step(client)
            self._advance(self.rng.randint(0, 200_000))
        self._violate("stuck", "clients still running after the drain")

    def _janitor(self) -> None:
        """Past the reservation TTL, every surviving client and then a new one
        make one zero-amount reserve: the store reaps what crashed clients
        held, and a client that remembers the chain may restore what it lost.
        The invariants judge the store as the clients see it next."""
        self.store.advance(int((RESERVATION_TTL_S + 1) * 1_000_000))
        survivors = [(f"c{c.idx}", c.ledger) for c in self.clients if c.state != "crashed"]
        janitor = self._new_ledger(0, "janitor")
        for name, ledger in [*survivors, ("janitor", janitor)]:
            self._final_reserve(name, ledger)
        # A re-seed in that pass may hold what the marks saw reserved again
        # (a ghost reservation, "g..."), for one reservation TTL: past it, the
        # store gives it back at the next reserve.
        keys = KeySpace("veronica:").chain(CHAIN)
        if any(
            str(k).startswith("g") for k in (self.store.command("HKEYS", [keys.reservations]) or [])
        ):
            self.store.advance(int((RESERVATION_TTL_S + 1) * 1_000_000))
            self._final_reserve("janitor", janitor)

    def _final_reserve(self, name: str, ledger: Any) -> None:
        try:
            got = ledger.reserve(self.path, 0, 0, step=False)
        except Exception as exc:  # a protocol may refuse (e.g. a lost chain)
            self._log(f"{name} final reserve refused: {type(exc).__name__}")
            return
        if isinstance(got, TripEvent) and got.sticky:
            self._saw_trip(None)

    # -- faults -------------------------------------------------------------------

    def _on(self, fault: str) -> bool:
        return self.chaos and fault in self.active and self.rng.random() < RATES[fault]

    def _world_faults(self) -> None:
        store = self.store
        if self.down_steps:
            self.down_steps -= 1
            if not self.down_steps:
                store.up = True
                self._log("store up")
            return
        for fault in ("restart_persist", "restart_wipe"):
            if self._on(fault):
                store.up = False
                self.down_steps = self.rng.randint(1, 4)
                if fault == "restart_wipe":
                    before = self._chain_now()
                    store.wipe()
                    self._lost(before)
                self._fault(f"{fault} for {self.down_steps} steps")
                return
        if self._on("clock_jump"):
            us = int(RESERVATION_TTL_S * 1_000_000) + self.rng.randint(0, 90_000_000)
            store.advance(us)
            self._fault(f"clock_jump +{us}us")
        if self._on("expiry"):
            us = int(CHAIN_TTL_S * 1_000_000) + 1
            before = self._chain_now()
            store.advance(us)
            self._lost(before)
            self._fault(f"expiry +{us}us")

    def _transport(self, client: SimClient, label: str, apply: Callable[[], Any]) -> Any:
        """Carries one request; drops it, doubles it or loses its reply at random."""
        if not self.store.up:
            raise redis.ConnectionError(f"simulated store down ({label})")
        if self._on("drop_request"):
            self._fault(f"{client.name} {label}: request lost")
            raise redis.ConnectionError(f"simulated: request lost ({label})")
        reply = apply()
        if self._on("duplicate"):
            self._fault(f"{client.name} {label}: delivered twice")
            with suppress(redis.ResponseError):
                apply()
        if self._on("lost_reply"):
            self._fault(f"{client.name} {label}: reply lost")
            raise redis.ConnectionError(f"simulated: reply lost ({label})")
        return reply

    # -- one client step ----------------------------------------------------------

    def _step(self, c: _Client) -> None:
        if self._on("crash"):
            self._crash(c)
            return
        state = c.state
        if state == "idle":
            self._reserve(c)
        elif state == "reserved":
            self._send_or_release(c)
        elif state == "sent":
            self._commit(c)
        elif state == "draining" and c.ledger.flush() == 0:
            c.state = "done"
            self._log(f"c{c.idx} done")
        if c.unconfirmed and c.ledger.pending == 0:
            for call in c.unconfirmed:
                call.confirmed = True
            c.unconfirmed.clear()

    def _reserve(self, c: _Client) -> None:
        if c.calls_left <= 0:
            c.state = "draining"
            return
        amount = self.rng.randint(50, 400)
        self.stats["reserves"] += 1
        try:
            got = c.ledger.reserve(self.path, amount, 0, step=True)
        except LedgerUnavailableError:
            self._log(f"c{c.idx} reserve {amount}: unavailable")
            # The store may have applied it (its reply was lost): the client
            # queues its cancel. Should the client crash first, the store sees
            # an abandoned reservation and charges it (the charging rule: its
            # call might have been sent), so it counts between 0 and amount.
            unknown = _Call(c.idx, amount, settled=True)
            self.calls.append(unknown)
            c.unconfirmed.append(unknown)
            self._gave_up(c)
            return
        except LedgerCorruptedError as exc:
            self._violate("corrupt", str(exc))
            c.state = "draining"
            return
        except (NotEmulatedError, AssertionError):
            raise
        except Exception as exc:  # another fail-closed refusal (a lost chain...)
            if not isinstance(exc, RuntimeError) and "Ledger" not in type(exc).__name__:
                raise
            self._log(f"c{c.idx} reserve refused: {type(exc).__name__}")
            c.state = "draining"
            return
        if isinstance(got, TripEvent):
            self.stats["denied"] += 1
            self._log(f"c{c.idx} reserve {amount}: denied sticky={got.sticky} {got.reason}")
            if got.sticky:
                self._saw_trip(c)
                c.state = "draining"
            else:
                self._gave_up(c)
            return
        if c.trip_seen or (self.trip_seen and len(self.losses) == self.trip_losses):
            self._violate("trip_lifted", f"c{c.idx} reserved {amount} after a sticky trip")
        c.attempts = 0
        c.calls_left -= 1
        c.reservation = got
        c.call = _Call(c.idx, amount)
        self.calls.append(c.call)
        c.state = "reserved"
        self._log(f"c{c.idx} reserved {amount}")

    def _gave_up(self, c: _Client) -> None:
        c.attempts += 1
        if c.attempts >= _GIVE_UP:
            c.attempts = 0
            c.calls_left -= 1

    def _send_or_release(self, c: _Client) -> None:
        call, rsv = c.call, c.reservation
        assert call is not None and rsv is not None
        roll = self.rng.random()
        if roll < 0.15:  # failed before any attempt was sent
            call.settled = True
            c.unconfirmed.append(call)
            c.state, c.call, c.reservation = "idle", None, None
            self._log(f"c{c.idx} release")
            c.ledger.release(self.path, rsv)
            return
        call.sent = True
        self.stats["sent"] += 1
        if roll < 0.70:  # a reply with usage
            call.billed = call.committed = self.rng.randint(0, call.reserved)
        elif roll < 0.85:  # sent, then no usage (timeout, cancel): the reservation
            call.billed = call.committed = call.reserved
        # else an error reply the provider does not bill: 0
        self.stats["billed"] += call.billed
        c.state = "sent"
        self._log(f"c{c.idx} sent, billed {call.billed}")

    def _commit(self, c: _Client) -> None:
        call, rsv = c.call, c.reservation
        assert call is not None and rsv is not None
        for fault in ("late_commit", "freeze"):
            if self._on(fault):
                # The call outlives the reservation TTL (sometimes the late
                # commit marker too) while the other clients go on: for
                # late_commit its process runs on (heartbeat included), for
                # freeze it is stopped dead. It commits once it resumes.
                us = int(RESERVATION_TTL_S * 1_000_000) + self.rng.randint(
                    0, int(2 * MARKER_TTL_S * 1_000_000)
                )
                c.paused, c.frozen = self.rng.randint(1, 6), fault == "freeze"
                self._fault(f"c{c.idx} {fault}: +{us}us, {c.paused} steps before its commit")
                self._advance(us)
                return
        call.settled = True
        c.unconfirmed.append(call)
        c.state, c.call, c.reservation = "idle", None, None
        trip = c.ledger.commit(self.path, rsv, call.committed, 0)
        self._log(f"c{c.idx} commit {call.committed} -> {trip is not None}")
        if trip is not None:
            self._saw_trip(c)

    def _crash(self, c: _Client) -> None:
        lost = list(c.unconfirmed)
        if c.call is not None:
            lost.append(c.call)
        for call in lost:
            call.lost = True
        c.state, c.call, c.reservation, c.unconfirmed = "crashed", None, None, []
        c.ledger = None
        self._fault(f"c{c.idx} crashed with {len(lost)} unsettled calls")

    def _advance(self, us: int) -> None:
        """Time passes for everyone: live clients' heartbeats fire when due."""
        store = self.store
        end = store.now_us + us
        while True:
            due = [
                c
                for c in self.clients
                if c.next_beat <= end
                and not c.frozen
                and c.state not in ("done", "crashed")
                and hasattr(c.ledger, "heartbeat")
            ]
            if not due:
                break
            first = min(c.next_beat for c in due)
            store.now_us = max(store.now_us, first)
            for c in due:
                if c.next_beat == first:
                    c.next_beat += BEAT_US
                    self._log(f"c{c.idx} heartbeat")
                    c.ledger.heartbeat()
        for c in self.clients:
            if c.frozen:  # a stopped thread beats again as soon as it resumes
                c.next_beat = max(c.next_beat, end)
        store.now_us = max(store.now_us, end)

    def _saw_trip(self, c: _Client | None) -> None:
        if not self.trip_seen:
            self.trip_losses = len(self.losses)
        self.trip_seen = True
        if c is not None:
            c.trip_seen = True

    def _chain_now(self) -> list[Any]:
        keys = KeySpace("veronica:").chain(CHAIN)
        return list(
            self.store.command("HMGET", [keys.chain, "e", "c", "rc", "s", "k"]) or [None] * 5
        )

    def _lost(self, before: list[Any]) -> None:
        """Record what the store held of the chain if it is gone now."""
        epoch = before[0]
        if epoch is None or self._chain_now()[0] == epoch:
            return
        marks: dict[int, int] = {}
        for c in self.clients:
            seen = getattr(getattr(c.ledger, "_marks", None), "seen", {}).get(CHAIN)
            if seen is not None and str(seen[0]) == str(epoch):
                marks[c.idx] = int(seen[1])
        doubt = [call for c in self.clients for call in c.unconfirmed]
        doubt += [c.call for c in self.clients if c.call is not None]
        doubt += [call for call in self.calls if call.lost and not call.confirmed]
        self.losses.append(
            _Loss(
                int(before[1] or 0),
                int(before[2] or 0),
                int(before[3] or 0),
                int(before[4] or 0),
                doubt,
                marks,
            )
        )
        self._log(f"chain lost: committed {before[1]}, reserved {before[2]}, steps {before[3]}")

    # -- invariants ---------------------------------------------------------------

    def _check(self) -> None:
        keys = KeySpace("veronica:").chain(CHAIN)
        c, rc, rt, trip = (
            self.store.command("HMGET", [keys.chain, "c", "rc", "rt", "trip"]) or [None] * 4
        )
        committed = int(c or 0)
        self.stats["committed"] = committed
        records = self.store.command("HGETALL", [keys.reservations]) or []
        # Markers of reaped reservations ("R" before, "C cost tokens" now) hold nothing.
        live = [
            records[i]
            for i in range(0, len(records), 2)
            if records[i + 1] != "R" and not records[i + 1].startswith("C ")
        ]
        billed = sum(call.billed for call in self.calls if call.sent)
        sent = sum(call.sent for call in self.calls)
        low = sum(call.bounds()[0] for call in self.calls)
        high = sum(call.bounds()[1] for call in self.calls)
        # What a store loss may cost (the guarantee documented in _scripts.py,
        # "What no client can know"): calls admitted before the clients that
        # saw the lost state come back (at most what it held), spend only a
        # crashed client had seen, and settlements in doubt at the loss
        # counted twice (at most what they reserved).
        losses = self.losses
        ceiling = CEILING + sum(loss.committed + loss.reserved + loss.given_back for loss in losses)
        survivors = {c.idx for c in self.clients if c.state != "crashed"}
        for loss in losses:
            seen = max([0, *(v for i, v in loss.marks.items() if i in survivors)])
            low -= max(0, loss.committed - seen)
            low -= sum(call.bounds()[0] for call in loss.in_doubt if call.lost)
            high += sum(call.reserved for call in loss.in_doubt) + loss.given_back
        if billed > ceiling:
            self._violate("billed_over_ceiling", f"billed {billed} > ceiling {ceiling}")
        if committed > ceiling:
            self._violate("committed_over_ceiling", f"committed {committed} > {ceiling}")
        steps = self.limits.steps
        if steps is not None and sent > steps + sum(loss.steps for loss in losses):
            self._violate("sent_over_steps", f"{sent} calls sent > max_steps {steps}")
        if committed < low:
            self._violate("committed_lost", f"committed {committed} < billed {low}")
        if committed > high:
            self._violate("committed_extra", f"committed {committed} > at most {high}")
        if int(rc or 0) or int(rt or 0) or live:
            self._violate(
                "reserved_left", f"reserved {rc} nano, {rt} tokens, {len(live)} live records"
            )
        # A trip survives a loss if a client that saw it survives (its marks).
        kept = len(losses) == self.trip_losses or any(
            c.trip_seen for c in self.clients if c.state != "crashed"
        )
        if self.trip_seen and trip is None and kept:
            self._violate("trip_lost", "a sticky trip was seen but the chain has none")

    # -- plumbing -----------------------------------------------------------------

    def _new_ledger(self, skew_us: int, name: str) -> Any:
        store = self.store
        client = SimClient(store, self._transport, name)
        return self.factory(client, lambda: (store.now_us + skew_us) / 1e6)

    def _violate(self, name: str, detail: str) -> None:
        self.violations.setdefault(name, detail)
        self._log(f"VIOLATION {name}: {detail}")

    def _fault(self, text: str) -> None:
        self.stats["faults"] += 1
        self._log("FAULT " + text)

    def _log(self, text: str) -> None:
        self.trace.append(f"{self.store.now_us} {text}")


@contextmanager
def _deterministic_ids(seed: int) -> Iterator[None]:
    """Reservation ids from a fixed token and counter, so a seed replays exactly."""
    mod: Any = _ids_module
    saved = (getattr(mod, "_process_token", None), getattr(mod, "_ids", None))
    if saved[0] is not None:
        mod._process_token = f"sim{seed:x}-"
    if saved[1] is not None:
        mod._ids = itertools.count(1)
    try:
        yield
    finally:
        if saved[0] is not None:
            mod._process_token = saved[0]
        if saved[1] is not None:
            mod._ids = saved[1]


@contextmanager
def _quiet_logs() -> Iterator[None]:
    """The ledger logs every outage; thousands of runs would drown the output."""
    logger = logging.getLogger("veronica_otel.distributed")
    was = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = was


def run(
    seed: int,
    faults: Iterable[str] = FAULTS,
    *,
    swarm: bool = True,
    ledger_factory: LedgerFactory = default_ledger,
) -> RunResult:
    """Run one seed (see :class:`Simulation`)."""
    return Simulation(seed, faults, swarm=swarm, ledger_factory=ledger_factory).run()


def run_many(
    seeds: Iterable[int],
    faults: Iterable[str] = FAULTS,
    *,
    swarm: bool = True,
    ledger_factory: LedgerFactory = default_ledger,
    stop_at_first: bool = False,
    examples: int = 5,
) -> dict[str, Any]:
    """Run ``seeds``; a summary of failures per invariant, with example seeds.

    Returns ``{"runs", "failed", "invariants": {name: {"count", "seeds",
    "faults": {fault: count}, "detail"}}, "stats": totals}``; ``faults``
    counts, over the failing runs, which fault classes were active.
    """
    enabled = tuple(faults)
    summary: dict[str, Any] = {"runs": 0, "failed": 0, "invariants": {}, "stats": {}}
    inv: dict[str, Any] = summary["invariants"]
    totals: dict[str, int] = summary["stats"]
    for seed in seeds:
        result = run(seed, enabled, swarm=swarm, ledger_factory=ledger_factory)
        summary["runs"] += 1
        for key, value in result.stats.items():
            totals[key] = totals.get(key, 0) + value
        if result.ok:
            continue
        summary["failed"] += 1
        for name, detail in result.violations.items():
            entry = inv.setdefault(name, {"count": 0, "seeds": [], "faults": {}, "detail": detail})
            entry["count"] += 1
            if len(entry["seeds"]) < examples:
                entry["seeds"].append(seed)
            for fault in result.faults:
                entry["faults"][fault] = entry["faults"].get(fault, 0) + 1
        if stop_at_first:
            break
    return summary
