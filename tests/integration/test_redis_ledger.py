"""RedisLedger against a real Redis / Valkey server.

* The same scenario table runs on LocalLedger and RedisLedger, and a seeded
  random run and the hypothesis state machine compare them step by step
  (trip messages included).
* Four processes share one chain and never exceed it, counted exactly.
* Each ledger operation is one round trip; a contained call is two.
* A crashed holder's reservation expires and is charged (fail closed); a late commit
  still counts once; a replayed commit never counts twice.
* The server killed mid-run: calls fail closed naming the store, commits of
  calls that ran wait and are replayed; restarted: the state is exactly what
  was committed.
* Corrupted or foreign values raise LedgerCorruptedError naming key and field.
* VERONICA_FAIL_OPEN=true falls back to a local ledger with one warning.
* Our own Redis traffic runs with instrumentation suppressed.
"""

from __future__ import annotations

import logging
import queue
import random
import socket
import uuid
from collections.abc import Callable, Iterator
from multiprocessing.context import ForkServerContext
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from opentelemetry import trace
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.sdk.trace import TracerProvider
from redis.crc import key_slot

from tests.integration import _redis_workers as workers
from tests.unit.test_ledger_properties import (
    HostileNamesLedgerMachine,
    LedgerMachine,
    LedgerMachineWithinReservations,
    LedgerMachineWithPool,
)
from veronica_otel import (
    BudgetExceededError,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    Ledger,
    LocalLedger,
    TripEvent,
    WrapOptions,
)
from veronica_otel._ledger import SIGNATURE_MEMORY, LedgerState, Level, Limits, Reservation
from veronica_otel._units import NANO_PER_USD, usd_to_nano
from veronica_otel.distributed import LedgerCorruptedError, LedgerUnavailableError, RedisLedger
from veronica_otel.distributed._connect import ClusterClient, connect
from veronica_otel.testing import RedisClusterProcess, RedisServerProcess

STATE_FIELDS = ("cost_nano", "reserved_nano", "steps", "retries", "tokens", "reserved_tokens")


class CountingRedis(redis.Redis):
    """A client that counts the commands it sends (one per round trip)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands: list[str] = []
        self.suppressed: list[bool] = []
        self.span_valid: list[bool] = []

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.commands.append(str(args[0]))
        self.suppressed.append(not is_instrumentation_enabled())
        self.span_valid.append(trace.get_current_span().get_span_context().is_valid)
        return super().execute_command(*args, **options)


def _stub() -> None:
    return None


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _spawn(
    body: Callable[..., Any],
    make_args: Callable[[ForkServerContext], list[tuple[Any, ...]]],
    timeout: float = 120.0,
) -> list[Any]:
    """Run ``body`` in spawned processes, one per argument tuple; their results."""
    ctx = workers.process_context()
    results_queue: Any = ctx.Queue()
    # Held until the end: Process.start() drops its args, and a barrier or event
    # collected in the parent is unlinked before a slow child has unpickled it.
    arguments = make_args(ctx)
    processes = [
        ctx.Process(target=workers.run_body, args=(results_queue, i, body, *args))
        for i, args in enumerate(arguments)
    ]
    for process in processes:
        process.start()
    results: dict[int, Any] = {}
    try:
        while len(results) < len(processes):
            try:
                index, result = results_queue.get(timeout=timeout)
            except queue.Empty:
                pytest.fail(f"workers did not finish within {timeout}s")
            if isinstance(result, str) and result.startswith("ERROR\n"):
                pytest.fail(f"worker {index} failed:\n{result}")
            results[index] = result
    finally:
        for process in processes:
            process.join(timeout=15)
            if process.is_alive():
                process.kill()
                process.join()
    del arguments
    return [results[i] for i in range(len(processes))]


@pytest.fixture
def client(redis_url: str) -> Iterator[CountingRedis]:
    counting = CountingRedis.from_url(redis_url)
    yield counting
    counting.close()


@pytest.fixture
def redis_ledger(client: CountingRedis, redis_prefix: str) -> RedisLedger:
    return RedisLedger(client, key_prefix=redis_prefix, fail_open=False)


@pytest.fixture(params=["local", "redis"])
def ledger(request: pytest.FixtureRequest) -> Ledger:
    """The same scenarios on both ledgers."""
    if request.param == "local":
        return LocalLedger()
    result: RedisLedger = request.getfixturevalue("redis_ledger")
    return result


@pytest.fixture
def family() -> dict[str, tuple[Level, ...]]:
    root = Level("root", Limits(cost_nano=10 * NANO_PER_USD, steps=100))
    child_a = Level("root.1", Limits(steps=50))
    child_b = Level("root.2", Limits(cost_nano=NANO_PER_USD))
    grandchild = Level("root.1.1", Limits())
    return {
        "root": (root,),
        "a": (root, child_a),
        "b": (root, child_b),
        "aa": (root, child_a, grandchild),
    }


# -- one scenario table, both ledgers ------------------------------------------


def test_parent_trip_denies_every_child_path(
    ledger: Ledger, family: dict[str, tuple[Level, ...]]
) -> None:
    assert isinstance(ledger.reserve(family["aa"], 5, 5), Reservation)
    event = TripEvent("timeout", 1.0, 2.0, "root", "deadline")
    assert ledger.trip("root", event) is event
    before = {cid: ledger.snapshot(cid) for cid in ("root", "root.1", "root.2", "root.1.1")}
    for name in ("root", "a", "b", "aa"):
        assert ledger.reserve(family[name], 0, 0) is event
        assert ledger.reserve(family[name], 0, 0, step=False, retry=True) is event
    for cid, snap in before.items():
        assert ledger.snapshot(cid) == snap
    assert ledger.snapshot("root.1").trip is None


def test_child_trip_does_not_stop_parent_or_sibling(
    ledger: Ledger, family: dict[str, tuple[Level, ...]]
) -> None:
    denied = ledger.reserve(family["b"], 2 * NANO_PER_USD, 0)
    assert isinstance(denied, TripEvent)
    assert (denied.reason, denied.chain_id) == ("cost", "root.2")
    assert denied.message == (
        "chain root.2: cost limit reached (limit 1 USD, this call would make it 2)"
    )
    assert ledger.reserve(family["b"], 0, 0) is denied
    assert isinstance(ledger.reserve(family["a"], NANO_PER_USD, 0), Reservation)
    assert isinstance(ledger.reserve(family["root"], NANO_PER_USD, 0), Reservation)


def test_steps_never_reach_limit_plus_one(ledger: Ledger) -> None:
    path = (Level("c", Limits(steps=3, retries=2)),)
    results = [ledger.reserve(path, 0, 0) for _ in range(5)]
    assert [isinstance(r, Reservation) for r in results] == [True, True, True, False, False]
    denied = results[3]
    assert isinstance(denied, TripEvent)
    assert (denied.reason, denied.limit, denied.observed) == ("steps", 3.0, 4.0)
    assert denied.message == "chain c: steps limit reached (limit 3, this call would make it 4)"
    assert results[4] is denied
    assert ledger.snapshot("c").steps == 3


def test_retries_never_reach_limit_plus_one(ledger: Ledger) -> None:
    path = (Level("c", Limits(retries=2)),)
    results = [ledger.reserve(path, 0, 0, step=False, retry=True) for _ in range(4)]
    assert [isinstance(r, Reservation) for r in results] == [True, True, False, False]
    snap = ledger.snapshot("c")
    assert (snap.retries, snap.steps) == (2, 0)
    assert results[2].reason == "retries"  # type: ignore[union-attr]


def test_tokens_limit_counts_reserved_and_committed(ledger: Ledger) -> None:
    path = (Level("c", Limits(tokens=100)),)
    first = ledger.reserve(path, 0, 60)
    assert isinstance(first, Reservation)
    denied = ledger.reserve(path, 0, 41)
    assert isinstance(denied, TripEvent)
    assert (denied.reason, denied.limit, denied.observed) == ("tokens", 100.0, 101.0)


def test_tenth_of_a_dollar_adds_up_exactly(ledger: Ledger) -> None:
    limit = usd_to_nano(0.3)
    path = (Level("c", Limits(cost_nano=limit)),)
    for _ in range(3):
        reservation = ledger.reserve(path, usd_to_nano(0.1), 0)
        assert isinstance(reservation, Reservation)
        assert ledger.commit(path, reservation, usd_to_nano(0.1), 0) is None
    snap = ledger.snapshot("c")
    assert snap.cost_nano == limit == 300_000_000
    assert type(snap.cost_nano) is int
    fourth = ledger.reserve(path, 1, 0)
    assert isinstance(fourth, TripEvent)
    assert fourth.reason == "cost"
    assert fourth.limit == 0.3
    assert fourth.observed == 300_000_001 / NANO_PER_USD


def test_commit_over_reservation_trips_once(ledger: Ledger) -> None:
    path = (Level("c", Limits(cost_nano=100, tokens=10)),)
    reservation = ledger.reserve(path, 50, 5)
    assert isinstance(reservation, Reservation)
    overrun = ledger.commit(path, reservation, 150, 5)
    assert overrun is not None
    assert overrun.reason == "cost"
    assert ledger.snapshot("c").trip is overrun
    assert ledger.reserve(path, 0, 0) is overrun


def test_release_gives_back_cost_tokens_and_the_step(ledger: Ledger) -> None:
    path = (Level("p", Limits(cost_nano=100, tokens=100)), Level("p.c", Limits()))
    reservations = [ledger.reserve(path, 30, 30) for _ in range(3)]
    assert all(isinstance(r, Reservation) for r in reservations)
    assert isinstance(ledger.reserve(path, 30, 0), TripEvent)  # 120 > 100: trips p
    for reservation in reservations:
        ledger.release(path, reservation)  # type: ignore[arg-type]
    for cid in ("p", "p.c"):
        snap = ledger.snapshot(cid)
        assert (snap.reserved_nano, snap.reserved_tokens, snap.cost_nano) == (0, 0, 0)
        assert snap.steps == 0


def test_release_gives_back_a_retry(ledger: Ledger) -> None:
    path = (Level("c", Limits(retries=1)),)
    reservation = ledger.reserve(path, 0, 0, step=True, retry=True)
    assert isinstance(reservation, Reservation)
    ledger.release(path, reservation)
    assert (ledger.snapshot("c").steps, ledger.snapshot("c").retries) == (0, 0)
    assert isinstance(ledger.reserve(path, 0, 0, retry=True), Reservation)


def test_repeat_limit_counts_per_signature(ledger: Ledger) -> None:
    path = (Level("c", Limits(repeats=2)),)
    assert isinstance(ledger.reserve(path, 0, 0, signature="x"), Reservation)
    assert isinstance(ledger.reserve(path, 0, 0, signature="y"), Reservation)
    assert isinstance(ledger.reserve(path, 0, 0, signature="x"), Reservation)
    denied = ledger.reserve(path, 0, 0, signature="x")
    assert isinstance(denied, TripEvent)
    assert (denied.reason, denied.limit, denied.observed) == ("loop", 2.0, 3.0)


def test_first_trip_wins_and_override_clears_it(ledger: Ledger) -> None:
    first = TripEvent("timeout", 5.0, 6.0, "c", "chain c: deadline")
    second = TripEvent("depth", 1.0, 2.0, "c", "chain c: too deep")
    assert ledger.trip("c", first) is first
    assert ledger.trip("c", second) is first
    assert ledger.snapshot("c").trip is first
    clear = ledger.clear_trip  # type: ignore[attr-defined]
    assert clear("c") == first
    assert ledger.snapshot("c").trip is None
    assert clear("c") is None
    assert isinstance(ledger.reserve((Level("c", Limits()),), 0, 0), Reservation)


def test_unknown_chain_snapshot_is_zero(ledger: Ledger) -> None:
    assert ledger.snapshot("nobody") == LedgerState()


def test_execution_context_counts_alike_on_both(ledger: Ledger) -> None:
    chain = f"ctx-{uuid.uuid4().hex[:6]}"
    config = ExecutionConfig(max_cost_usd=0.1, max_steps=20)
    options = WrapOptions(cost_estimate_hint=0.03)
    with ExecutionContext(config, chain_id=chain, ledger=ledger) as ctx:
        child = ctx.spawn_child(ExecutionConfig(max_steps=2))
        assert child.wrap_llm_call(_stub, options) is Decision.ALLOW
        decisions = [ctx.wrap_llm_call(_stub, options) for _ in range(4)]
        ctx.record_usage(cost_usd=0.001, input_tokens=3, output_tokens=4)
        snap = ctx.snapshot()
    assert decisions == [Decision.ALLOW, Decision.ALLOW, Decision.HALT, Decision.HALT]
    assert (snap.steps, snap.tokens) == (3, 7)
    assert snap.cost_usd == 0.091
    assert snap.trip is not None
    assert snap.trip.message == (
        f"chain {chain}: cost limit reached (limit 0.1 USD, this call would make it 0.12)"
    )


# -- RedisLedger behaves as LocalLedger, step by step ----------------------------


def test_matches_local_ledger_on_a_random_run(redis_ledger: RedisLedger) -> None:
    """Same operations, same answers: counters, trips and their messages."""
    rng = random.Random(20261130)
    local = LocalLedger()
    chains = ("r", "r.1", "r.2", "r.1.1")
    paths = [("r",), ("r", "r.1"), ("r", "r.2"), ("r", "r.1", "r.1.1")]
    limits = {
        cid: Limits(
            cost_nano=rng.choice([None, 20_000, 123_456_789, 3 * NANO_PER_USD // 10]),
            steps=rng.choice([None, 30, 60]),
            retries=rng.choice([None, 5]),
            tokens=rng.choice([None, 5_000]),
            repeats=rng.choice([None, 3]),
        )
        for cid in chains
    }
    held: list[tuple[tuple[Level, ...], Reservation, Reservation]] = []
    for _ in range(300):
        path = tuple(Level(cid, limits[cid]) for cid in rng.choice(paths))
        action = rng.random()
        if action < 0.55 or not held:
            args = (path, rng.randint(0, 30_000_000), rng.randint(0, 400))
            kwargs = {
                "step": rng.random() < 0.9,
                "retry": rng.random() < 0.2,
                "signature": rng.choice([None, "a", "b"]),
            }
            ours = redis_ledger.reserve(*args, **kwargs)  # type: ignore[arg-type]
            theirs = local.reserve(*args, **kwargs)  # type: ignore[arg-type]
            assert type(ours) is type(theirs)
            if isinstance(ours, Reservation):
                held.append((path, ours, theirs))  # type: ignore[arg-type]
            else:
                _same_trip(ours, theirs)  # type: ignore[arg-type]
        elif action < 0.85:
            p, ours_r, theirs_r = held.pop(rng.randrange(len(held)))
            cost = ours_r.cost_nano * rng.randint(0, 130) // 100
            tokens = ours_r.tokens * rng.randint(0, 130) // 100
            ours_t = redis_ledger.commit(p, ours_r, cost, tokens)
            theirs_t = local.commit(p, theirs_r, cost, tokens)
            assert (ours_t is None) == (theirs_t is None)
            if ours_t is not None and theirs_t is not None:
                _same_trip(ours_t, theirs_t)
        else:
            p, ours_r, theirs_r = held.pop(rng.randrange(len(held)))
            redis_ledger.release(p, ours_r)
            local.release(p, theirs_r)
        for cid in chains:
            ours_s, theirs_s = redis_ledger.snapshot(cid), local.snapshot(cid)
            for name in STATE_FIELDS:
                assert getattr(ours_s, name) == getattr(theirs_s, name), (cid, name)
            assert (ours_s.trip is None) == (theirs_s.trip is None)
            if ours_s.trip is not None and theirs_s.trip is not None:
                _same_trip(ours_s.trip, theirs_s.trip)


def _same_trip(ours: TripEvent, theirs: TripEvent) -> None:
    assert (ours.reason, ours.chain_id, ours.limit, ours.observed, ours.message) == (
        theirs.reason,
        theirs.chain_id,
        theirs.limit,
        theirs.observed,
        theirs.message,
    )


@pytest.mark.parametrize(
    "machine",
    [
        LedgerMachine,
        LedgerMachineWithinReservations,
        LedgerMachineWithPool,
        HostileNamesLedgerMachine,
    ],
)
def test_state_machine_matches_the_model_on_redis(
    machine: type[LedgerMachine], redis_url: str
) -> None:
    """The property suite's state machine (reserve / commit / raise / release / trip /
    settle), with a RedisLedger under test: nothing stays reserved once every call
    settled, spent is exactly the sum of the commits, limits hold."""
    shared = redis.Redis.from_url(redis_url)

    class RedisMachine(machine):  # type: ignore[valid-type,misc]
        def __init__(self) -> None:
            super().__init__()
            self.ledger = RedisLedger(shared, key_prefix=f"m{uuid.uuid4().hex[:12]}:")

    try:
        run_state_machine_as_test(
            RedisMachine,
            settings=settings(
                max_examples=50,
                stateful_step_count=30,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    finally:
        shared.close()


def test_pool_state_machine_matches_the_model_on_a_cluster(
    redis_cluster: RedisClusterProcess,
) -> None:
    """The pooled machine on Redis Cluster: the two-phase protocol (pools and
    chains on different nodes) reports and counts as the in-process ledger.
    One cluster client for every example, as the single-node test shares one
    client: redis-py's cluster client asks each node for its whole command
    table when it is built (a tenth of a CPU-second each)."""
    made: list[RedisLedger] = []
    shared = connect(redis_cluster.url)
    assert isinstance(shared, ClusterClient)

    class ClusterMachine(LedgerMachineWithPool):
        def __init__(self) -> None:
            super().__init__()
            self.ledger = RedisLedger(shared, key_prefix=f"m{uuid.uuid4().hex[:12]}:")
            made.append(self.ledger)

    try:
        run_state_machine_as_test(
            ClusterMachine,
            settings=settings(
                max_examples=30,
                stateful_step_count=30,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    finally:
        for ledger in made:
            ledger.close()  # its heartbeat (the client is not its own)
        shared.close()  # every node's connections


def close_ledger(ledger: RedisLedger) -> None:
    """Stop its heartbeat and close its client (every node's sockets on a cluster)."""
    ledger.close()
    client = ledger.client
    if isinstance(client, ClusterClient):  # RedisCluster.close leaves node sockets open
        for node in client.redis_cluster.get_nodes():
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect()
    client.close()


def test_signature_memory_is_bounded(redis_ledger: RedisLedger, client: CountingRedis) -> None:
    path = (Level("c", Limits(repeats=1)),)
    for i in range(SIGNATURE_MEMORY + 50):
        assert isinstance(redis_ledger.reserve(path, 0, 0, signature=f"s{i}"), Reservation)
    signatures = redis_ledger.key("c").replace(":c:c", ":s:c")
    assert client.hlen(signatures) == SIGNATURE_MEMORY
    assert client.hexists(signatures, f"=s{SIGNATURE_MEMORY + 49}")
    assert not client.hexists(signatures, "=s0")
    # A forgotten signature may run again; a remembered one may not.
    assert isinstance(redis_ledger.reserve(path, 0, 0, signature="s0"), Reservation)
    denied = redis_ledger.reserve(path, 0, 0, signature=f"s{SIGNATURE_MEMORY + 49}")
    assert isinstance(denied, TripEvent)
    assert denied.reason == "loop"


# -- round trips, keys, instrumentation --------------------------------------------


def test_each_operation_is_one_round_trip(redis_ledger: RedisLedger, client: CountingRedis) -> None:
    path = (Level("rt", Limits(cost_nano=NANO_PER_USD)), Level("rt.1", Limits(steps=9)))
    warm = redis_ledger.reserve(path, 1, 1)  # loads the scripts (NOSCRIPT once)
    assert isinstance(warm, Reservation)
    redis_ledger.commit(path, warm, 1, 1)
    warm = redis_ledger.reserve(path, 1, 1)
    assert isinstance(warm, Reservation)
    redis_ledger.release(path, warm)
    redis_ledger.trip("other", TripEvent("depth", 1.0, 2.0, "other", "x"))

    def sent(operation: Callable[[], object]) -> list[str]:
        client.commands.clear()
        operation()
        return list(client.commands)

    reservation = redis_ledger.reserve(path, 5, 5)
    assert isinstance(reservation, Reservation)
    assert sent(lambda: redis_ledger.reserve(path, 5, 5)) == ["EVALSHA"]
    assert sent(lambda: redis_ledger.commit(path, reservation, 5, 5)) == ["EVALSHA"]
    second = redis_ledger.reserve(path, 5, 5)
    assert isinstance(second, Reservation)
    assert sent(lambda: redis_ledger.release(path, second)) == ["EVALSHA"]
    event = TripEvent("depth", 1.0, 2.0, "rt.1", "x")
    assert sent(lambda: redis_ledger.trip("rt.1", event)) == ["EVALSHA"]
    assert sent(lambda: redis_ledger.snapshot("rt")) == ["HMGET"]


def test_contained_call_is_two_round_trips(
    redis_ledger: RedisLedger, client: CountingRedis
) -> None:
    options = WrapOptions(operation_name="rt", cost_estimate_hint=0.001)
    with ExecutionContext(
        ExecutionConfig(max_cost_usd=1.0, max_steps=100), chain_id="calls", ledger=redis_ledger
    ) as ctx:
        assert ctx.wrap_llm_call(_stub, options) is Decision.ALLOW  # warm-up
        before = _evalsha_calls(client)
        client.commands.clear()
        for _ in range(10):
            assert ctx.wrap_llm_call(_stub, options) is Decision.ALLOW
        assert client.commands == ["EVALSHA"] * 20
        assert _evalsha_calls(client) - before == 20  # server side: 2 per call


def _evalsha_calls(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return int(stats["cmdstat_evalsha"]["calls"])


def test_keys_share_the_tree_hash_tag_and_expire(client: CountingRedis, redis_prefix: str) -> None:
    ledger = RedisLedger(client, key_prefix=redis_prefix, chain_ttl_s=3600)
    path = (
        Level("tree", Limits(repeats=5)),
        Level("tree.1", Limits()),
        Level("tree.1.2", Limits()),
    )
    assert isinstance(ledger.reserve(path, 10, 10, signature="sig"), Reservation)
    keys = sorted(k.decode() for k in client.keys(f"{redis_prefix}*"))
    assert keys == sorted(
        [
            f"{redis_prefix}{{tree}}:c:tree",
            f"{redis_prefix}{{tree}}:c:tree.1",
            f"{redis_prefix}{{tree}}:c:tree.1.2",
            f"{redis_prefix}{{tree}}:s:tree",
            f"{redis_prefix}{{tree}}:o:tree",
            f"{redis_prefix}{{tree}}:rh",
            f"{redis_prefix}{{tree}}:rz",
        ]
    )
    slots = {key_slot(key.encode()) for key in keys}
    assert len(slots) == 1
    for key in keys:
        assert 0 < client.pttl(key) <= 3_600_000


def test_own_traffic_is_not_instrumented_or_traced(
    redis_ledger: RedisLedger, client: CountingRedis, tracer_provider: TracerProvider
) -> None:
    tracer = tracer_provider.get_tracer("test")
    path = (Level("quiet", Limits()),)
    with tracer.start_as_current_span("user span"):
        reservation = redis_ledger.reserve(path, 1, 1)
        assert isinstance(reservation, Reservation)
        redis_ledger.commit(path, reservation, 1, 1)
        redis_ledger.snapshot("quiet")
        redis_ledger.trip("quiet", TripEvent("depth", 1.0, 2.0, "quiet", "x"))
        assert is_instrumentation_enabled()  # only inside our calls
        assert trace.get_current_span().get_span_context().is_valid
    assert client.commands
    assert all(client.suppressed)
    assert not any(client.span_valid)


# -- many processes, one chain -------------------------------------------------------


def test_processes_share_one_cost_ceiling_exactly(redis_url: str, redis_prefix: str) -> None:
    """4 processes x 50 calls at $0.03 under $1.00: exactly 33 run, in total."""

    def make_args(ctx: ForkServerContext) -> list[tuple[Any, ...]]:
        start = ctx.Barrier(4)
        return [(redis_url, redis_prefix, "shared", 50, 0.03, 1.0, None, start)] * 4

    ran = _spawn(workers.shared_chain_calls, make_args)
    assert sum(ran) == 33
    snap = RedisLedger.from_url(redis_url, key_prefix=redis_prefix).snapshot("shared")
    assert snap.cost_nano == 33 * usd_to_nano(0.03) == 990_000_000
    assert (snap.steps, snap.reserved_nano) == (33, 0)
    assert snap.trip is not None
    assert snap.trip.reason == "cost"


def test_processes_share_one_step_ceiling_exactly(redis_url: str, redis_prefix: str) -> None:
    """4 processes x 30 calls under max_steps=50: exactly 50 run."""

    def make_args(ctx: ForkServerContext) -> list[tuple[Any, ...]]:
        start = ctx.Barrier(4)
        return [(redis_url, redis_prefix, "steps", 30, 0.0001, None, 50, start)] * 4

    ran = _spawn(workers.shared_chain_calls, make_args)
    assert sum(ran) == 50
    snap = RedisLedger.from_url(redis_url, key_prefix=redis_prefix).snapshot("steps")
    assert (snap.steps, snap.cost_nano, snap.reserved_nano) == (50, 50 * 100_000, 0)
    assert snap.trip is not None
    assert snap.trip.reason == "steps"


# -- crashed holders ---------------------------------------------------------------


def test_crashed_holders_reservation_expires_and_is_charged(
    client: CountingRedis, redis_prefix: str
) -> None:
    # reservation_ttl_s=0: every reservation is already expired at the next reserve.
    ledger = RedisLedger(client, key_prefix=redis_prefix, reservation_ttl_s=0)
    path = (Level("crash", Limits(cost_nano=NANO_PER_USD, tokens=1_000)),)
    held = ledger.reserve(path, usd_to_nano(0.5), 600)  # its process "dies" here
    assert isinstance(held, Reservation)
    second = ledger.reserve(path, usd_to_nano(0.4), 300)  # reaps the first, then fits
    assert isinstance(second, Reservation)
    snap = ledger.snapshot("crash")
    # The dead holder's call may have been sent: its reservation is spent, its step counts.
    assert (snap.cost_nano, snap.tokens) == (usd_to_nano(0.5), 600)
    assert (snap.reserved_nano, snap.reserved_tokens) == (usd_to_nano(0.4), 300)
    assert snap.steps == 2
    # Never handed out again: what is left after the charge is all that fits.
    third = ledger.reserve(path, usd_to_nano(0.4), 300)  # reaps (charges) the second
    assert isinstance(third, TripEvent) and third.sticky
    snap = ledger.snapshot("crash")
    assert (snap.cost_nano, snap.tokens, snap.reserved_nano) == (usd_to_nano(0.9), 900, 0)


def test_late_commit_after_expiry_counts_once(client: CountingRedis, redis_prefix: str) -> None:
    ledger = RedisLedger(client, key_prefix=redis_prefix, reservation_ttl_s=0)
    path = (Level("slow", Limits(cost_nano=NANO_PER_USD)),)
    slow = ledger.reserve(path, usd_to_nano(0.5), 10)
    assert isinstance(slow, Reservation)
    other = ledger.reserve(path, usd_to_nano(0.1), 0)  # reaps the slow one
    assert isinstance(other, Reservation)
    assert ledger.commit(path, slow, usd_to_nano(0.2), 7) is None  # it was only slow
    assert ledger.commit(path, slow, usd_to_nano(0.2), 7) is None  # a replay: no-op
    snap = ledger.snapshot("slow")
    assert (snap.cost_nano, snap.tokens) == (usd_to_nano(0.2), 7)
    assert (snap.reserved_nano, snap.reserved_tokens) == (usd_to_nano(0.1), 0)
    ledger.release(path, other)
    ledger.release(path, other)  # a replayed release gives nothing back twice
    snap = ledger.snapshot("slow")
    assert (snap.reserved_nano, snap.steps) == (0, 1)


def test_replayed_commit_counts_once(redis_ledger: RedisLedger) -> None:
    path = (Level("replay", Limits(cost_nano=NANO_PER_USD)),)
    reservation = redis_ledger.reserve(path, 100, 1)
    assert isinstance(reservation, Reservation)
    for _ in range(3):  # a commit whose reply was lost is sent again
        redis_ledger.commit(path, reservation, 80, 1)
    snap = redis_ledger.snapshot("replay")
    assert (snap.cost_nano, snap.reserved_nano, snap.tokens, snap.steps) == (80, 0, 1, 1)


# -- store unreachable -----------------------------------------------------------------


def test_unreachable_store_fails_closed_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VERONICA_FAIL_OPEN", raising=False)
    port = _closed_port()
    ledger = RedisLedger.from_url(f"redis://admin:s3cret@127.0.0.1:{port}/2")
    called: list[int] = []
    # Not entered: leaving a recording chain span reads the (unreachable) ledger.
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0), chain_id="down", ledger=ledger)
    with pytest.raises(LedgerUnavailableError) as info:
        ctx.begin_call("llm", WrapOptions(cost_estimate_hint=0.01))
    assert ctx.wrap_llm_call(lambda: called.append(1)) is Decision.HALT
    error = info.value
    assert called == []
    assert error.reason == "circuit_open"
    assert error.store == f"redis://admin:***@127.0.0.1:{port}/2"
    assert error.store in str(error)
    assert "s3cret" not in str(error)
    assert "unreachable" in str(error)
    with pytest.raises(LedgerUnavailableError):
        ledger.snapshot("down")
    with pytest.raises(LedgerUnavailableError):
        ledger.trip("down", TripEvent("depth", 1.0, 2.0, "down", "x"))
    # Never sticky: the ledger raised instead of returning a trip.
    assert ctx._state.trip is None


def test_server_killed_then_restarted(restartable_redis: RedisServerProcess) -> None:
    server = restartable_redis
    ledger = RedisLedger.from_url(server.url, socket_timeout=2.0)
    options = WrapOptions(operation_name="outage", cost_estimate_hint=0.03)
    ran: list[int] = []
    config = ExecutionConfig(max_cost_usd=1.0, max_steps=100)
    with ExecutionContext(config, chain_id="outage", ledger=ledger) as ctx:
        for _ in range(5):
            assert ctx.wrap_llm_call(lambda: ran.append(1), options) is Decision.ALLOW
        in_flight = ctx.begin_call("llm", options)  # reserved; now the server dies
        server.kill()
        ran.append(1)
        in_flight.finish()  # the call ran: its commit waits, nothing raised
        assert ledger.pending == 1
        with pytest.raises(LedgerUnavailableError) as info:
            ctx.begin_call("llm", options)
        assert server.url in str(info.value)
        assert ctx.wrap_llm_call(lambda: ran.append(1), options) is Decision.HALT
        with pytest.raises(LedgerUnavailableError):
            ledger.snapshot("outage")
        assert len(ran) == 6

        server.start()  # same port, same append-only file
        assert ctx.wrap_llm_call(lambda: ran.append(1), options) is Decision.ALLOW
        assert ledger.pending == 0
        snap = ledger.snapshot("outage")
        assert ctx.trip is None
    assert len(ran) == 7
    assert snap.cost_nano == 7 * usd_to_nano(0.03)
    assert (snap.steps, snap.reserved_nano, snap.trip) == (7, 0, None)


def test_server_killed_mid_run_under_four_processes(restartable_redis: RedisServerProcess) -> None:
    """Calls fail closed while the server is dead; afterwards the committed
    spend is exactly what ran: nothing lost, nothing counted twice."""
    server = restartable_redis
    prefix = "outage:"
    hint = 0.01
    events: dict[str, list[Any]] = {}
    stop: list[Any] = []

    def make_args(ctx: ForkServerContext) -> list[tuple[Any, ...]]:
        for name in ("ready", "down", "up"):
            events[name] = [ctx.Event() for _ in range(4)]
        stop.append(ctx.Event())
        return [
            (
                server.url,
                prefix,
                "mid-run",
                hint,
                1_000.0,
                events["ready"][i],
                events["down"][i],
                events["up"][i],
                stop[0],
                2_000_000,
            )
            for i in range(4)
        ]

    ctx = workers.process_context()
    results_queue: Any = ctx.Queue()
    processes = [
        ctx.Process(target=workers.run_body, args=(results_queue, i, workers.outage_calls, *a))
        for i, a in enumerate(make_args(ctx))
    ]
    for process in processes:
        process.start()
    results: list[Any] = []
    try:
        assert all(e.wait(60) for e in events["ready"]), "workers did not start calling"
        server.kill()
        assert all(e.wait(60) for e in events["down"]), "a worker never saw the outage"
        server.start()
        assert all(e.wait(60) for e in events["up"]), "a worker never recovered"
        stop[0].set()
        for _ in processes:
            _index, result = results_queue.get(timeout=60)
            assert not (isinstance(result, str) and result.startswith("ERROR")), result
            results.append(result)
    finally:
        stop[0].set()
        for process in processes:
            process.join(timeout=15)
            if process.is_alive():
                process.kill()
                process.join()
    ran = sum(r["ran"] for r in results)
    unavailable = sum(r["unavailable"] for r in results)
    assert all(r["pending_after_flush"] == 0 for r in results)
    assert all(server.url in r["message"] for r in results)
    assert all(r["other"] == 0 and r["trip"] is None for r in results)
    snap = RedisLedger.from_url(server.url, key_prefix=prefix).snapshot("mid-run")
    assert snap.cost_nano == ran * usd_to_nano(hint)  # exactly what ran
    # A reservation whose reply died with the server holds its amount until it
    # expires; it never turns into committed spend.
    assert snap.reserved_nano % usd_to_nano(hint) == 0
    assert snap.reserved_nano <= unavailable * usd_to_nano(hint)
    assert ran <= snap.steps <= ran + unavailable


# -- fail open -----------------------------------------------------------------------


def test_fail_open_falls_back_to_a_local_ledger_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("VERONICA_FAIL_OPEN", "true")
    ledger = RedisLedger.from_url(f"redis://127.0.0.1:{_closed_port()}/0")
    options = WrapOptions(cost_estimate_hint=0.03)
    with caplog.at_level(logging.WARNING, logger="veronica_otel.distributed"):
        config = ExecutionConfig(max_cost_usd=0.1)
        with ExecutionContext(config, chain_id="open", ledger=ledger) as ctx:
            decisions = [ctx.wrap_llm_call(_stub, options) for _ in range(5)]
            snap = ctx.snapshot()
    assert ledger.is_local
    assert decisions == [Decision.ALLOW] * 3 + [Decision.HALT] * 2  # still contained
    assert snap.cost_usd == 0.09
    warnings = [
        r
        for r in caplog.records
        if r.name == "veronica_otel.distributed" and r.levelno >= logging.WARNING
    ]
    assert len(warnings) == 1
    assert "VERONICA_FAIL_OPEN" in warnings[0].getMessage()
    assert "process-local" in warnings[0].getMessage()


def test_fail_open_variable_must_be_a_boolean(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERONICA_FAIL_OPEN", "maybe")
    with pytest.raises(ValueError, match="VERONICA_FAIL_OPEN"):
        RedisLedger.from_url("redis://127.0.0.1:1/0")
    assert RedisLedger.from_url("redis://127.0.0.1:1/0", fail_open=False).is_local is False


# -- corrupted and foreign values ----------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [("c", "abc"), ("rc", "1.5"), ("s", "007"), ("t", " 5"), ("rt", ""), ("r", "1e3")],
)
def test_corrupted_counter_is_an_error_never_zero(
    redis_ledger: RedisLedger, client: CountingRedis, field: str, value: str
) -> None:
    path = (Level("bad", Limits(cost_nano=NANO_PER_USD)),)
    first = redis_ledger.reserve(path, 5, 5)
    assert isinstance(first, Reservation)
    key = redis_ledger.key("bad")
    client.hset(key, field, value)
    before = client.hgetall(key)
    with pytest.raises(LedgerCorruptedError) as info:
        redis_ledger.reserve(path, 1, 1)
    assert (info.value.key, info.value.field) == (key, field)
    assert key in str(info.value)
    with pytest.raises(LedgerCorruptedError):
        redis_ledger.commit(path, first, 5, 5)
    with pytest.raises(LedgerCorruptedError):
        redis_ledger.release(path, first)
    with pytest.raises(LedgerCorruptedError) as snap_info:
        redis_ledger.snapshot("bad")
    assert (snap_info.value.key, snap_info.value.field) == (key, field)
    assert client.hgetall(key) == before  # nothing was written


def test_wrong_type_key_is_an_error(redis_ledger: RedisLedger, client: CountingRedis) -> None:
    key = redis_ledger.key("typed")
    client.set(key, "someone else's string")
    path = (Level("typed", Limits()),)
    with pytest.raises(LedgerCorruptedError) as info:
        redis_ledger.reserve(path, 1, 1)
    assert (info.value.key, info.value.field) == (key, "(type)")
    with pytest.raises(LedgerCorruptedError) as snap_info:
        redis_ledger.snapshot("typed")
    assert (snap_info.value.key, snap_info.value.field) == (key, "(type)")
    with pytest.raises(LedgerCorruptedError):
        redis_ledger.trip("typed", TripEvent("depth", 1.0, 2.0, "typed", "x"))
    assert client.get(key) == b"someone else's string"


def test_foreign_trip_value_is_an_error(redis_ledger: RedisLedger, client: CountingRedis) -> None:
    key = redis_ledger.key("tripped")
    client.hset(key, "trip", "not json")
    with pytest.raises(LedgerCorruptedError) as info:
        redis_ledger.reserve((Level("tripped", Limits()),), 0, 0)
    assert (info.value.key, info.value.field) == (key, "trip")
    with pytest.raises(LedgerCorruptedError):
        redis_ledger.snapshot("tripped")
    client.hset(key, "trip", '{"reason": "bogus", "limit": 1}')
    with pytest.raises(LedgerCorruptedError):
        redis_ledger.snapshot("tripped")


def test_corrupted_reservation_record_is_an_error(client: CountingRedis, redis_prefix: str) -> None:
    ledger = RedisLedger(client, key_prefix=redis_prefix, reservation_ttl_s=0)
    records = f"{redis_prefix}{{rec}}:rh"
    client.hset(records, "bogus", "zz")
    client.zadd(f"{redis_prefix}{{rec}}:rz", {"bogus": 0})
    with pytest.raises(LedgerCorruptedError) as info:
        ledger.reserve((Level("rec", Limits()),), 1, 1)
    assert (info.value.key, info.value.field) == (records, "bogus")


def test_corrupted_signature_count_is_an_error(
    redis_ledger: RedisLedger, client: CountingRedis
) -> None:
    path = (Level("sig", Limits(repeats=3)),)
    assert isinstance(redis_ledger.reserve(path, 0, 0, signature="x"), Reservation)
    signatures = redis_ledger.key("sig").replace(":c:sig", ":s:sig")
    client.hset(signatures, "=x", "lots")
    with pytest.raises(LedgerCorruptedError) as info:
        redis_ledger.reserve(path, 0, 0, signature="x")
    assert (info.value.key, info.value.field) == (signatures, "=x")


def test_corruption_surfaces_through_the_context(
    redis_ledger: RedisLedger, client: CountingRedis
) -> None:
    client.hset(redis_ledger.key("ctx-bad"), "c", "NaN")
    called: list[int] = []
    ctx = ExecutionContext(chain_id="ctx-bad", ledger=redis_ledger)
    with pytest.raises(LedgerCorruptedError):
        ctx.wrap_llm_call(lambda: called.append(1))
    assert called == []


# -- arguments -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"key_prefix": "a{b}:"},
        {"reservation_ttl_s": -1},
        {"reservation_ttl_s": float("nan")},
        {"chain_ttl_s": 0},
        {"reservation_ttl_s": 100, "chain_ttl_s": 10},
        {"fail_open": "yes"},
    ],
)
def test_bad_arguments_are_rejected(client: CountingRedis, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RedisLedger(client, **kwargs)


def test_bad_paths_and_amounts_are_rejected(redis_ledger: RedisLedger) -> None:
    with pytest.raises(ValueError, match="chain tree"):
        redis_ledger.reserve((Level("a", Limits()), Level("b", Limits())), 0, 0)
    with pytest.raises(ValueError, match="whitespace"):
        redis_ledger.reserve((Level("a b", Limits()),), 0, 0)
    with pytest.raises(ValueError, match="cost_nano"):
        redis_ledger.reserve((Level("a", Limits()),), -1, 0)
    with pytest.raises(ValueError, match="tokens"):
        redis_ledger.reserve((Level("a", Limits()),), 0, 1.5)  # type: ignore[arg-type]
    # Too large is not an error: it is counted as STORE_MAX + 1 (test_redis_numbers.py).


# -- the package -----------------------------------------------------------------------


def test_exported_names_and_kernel_independence() -> None:
    import subprocess
    import sys

    from veronica_otel import distributed

    assert distributed.__all__ == [
        "LedgerCorruptedError",
        "LedgerLostError",
        "LedgerUnavailableError",
        "RedisCircuitBreaker",
        "RedisLedger",
    ]
    assert issubclass(LedgerUnavailableError, BudgetExceededError)
    code = "import sys, veronica_otel; print('veronica_otel.distributed' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_threads_share_one_ledger_exactly(redis_ledger: RedisLedger) -> None:
    from concurrent.futures import ThreadPoolExecutor

    config = ExecutionConfig(max_cost_usd=1.0)
    options = WrapOptions(cost_estimate_hint=0.03)
    ctx = ExecutionContext(config, chain_id="threads", ledger=redis_ledger)

    def calls(_: int) -> int:
        return [ctx.wrap_llm_call(_stub, options) for _ in range(30)].count(Decision.ALLOW)

    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(calls, range(8))) == 33
    assert redis_ledger.snapshot("threads").cost_nano == 33 * usd_to_nano(0.03)


def test_errors_survive_pickling() -> None:
    import pickle

    unavailable = LedgerUnavailableError.for_store("redis://h:1/0", "c", ConnectionError("x"))
    copy = pickle.loads(pickle.dumps(unavailable))
    assert (copy.store, copy.reason, str(copy)) == (
        "redis://h:1/0",
        "circuit_open",
        str(unavailable),
    )
    corrupted = pickle.loads(pickle.dumps(LedgerCorruptedError("k", "f", "v")))
    assert (corrupted.key, corrupted.field, corrupted.value) == ("k", "f", "v")


def test_k_steps_are_reserved_released_and_given_back_at_once(ledger: Ledger) -> None:
    """A grant's carve holds k steps in one reservation (both ledgers alike):
    checked at every level before any is counted, a release gives back all k,
    a commit keeps them unless it gives some back."""
    path = (Level("kroot", Limits(steps=40)), Level("kroot.1", Limits(steps=10)))
    carve = ledger.reserve(path, 5, 3, steps=8)
    assert isinstance(carve, Reservation) and carve.step == 8
    denied = ledger.reserve(path, 0, 0, steps=3)  # 8 + 3 > 10 at the child
    assert isinstance(denied, TripEvent) and (denied.chain_id, denied.observed) == ("kroot.1", 11)
    assert [ledger.snapshot(c).steps for c in ("kroot", "kroot.1")] == [8, 8]
    ledger.release(path, carve)
    assert [ledger.snapshot(c).steps for c in ("kroot", "kroot.1")] == [0, 0]
    other = (Level("kroot", Limits(steps=40)), Level("kroot.2", Limits(steps=10)))
    carve = ledger.reserve(other, 5, 3, steps=10)
    assert isinstance(carve, Reservation)
    assert ledger.commit(other, carve, 2, 1, release_steps=7) is None  # 3 used, 7 back
    snap = ledger.snapshot("kroot.2")
    assert (snap.steps, snap.cost_nano, snap.reserved_nano, snap.tokens) == (3, 2, 0, 1)
    assert ledger.snapshot("kroot").steps == 3
    for bad in (0, 1001):
        with pytest.raises(ValueError, match="steps"):
            ledger.reserve(other, 0, 0, steps=bad)
    assert ledger.snapshot("kroot").steps == 3
