"""The shared ledger and breaker on a real three-node Redis Cluster.

The cluster (``redis_cluster``) is three ``valkey-server`` processes in
cluster mode, joined by the test itself. Chains are picked so their hash
tag lands on a chosen node: every script of a chain runs on the node that
serves its slot, and a chain tree (``root``, ``root.1``, ``root.1.1``) is one
slot. A key outside that slot would fail with CROSSSLOT, which the ledger
would report as the store being unavailable.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot
from redis.exceptions import MovedError

from tests._zero_code import UNCHANGED_AGENT, ScriptRuns, printed
from tests.e2e._frameworks import FrameworkApp
from tests.integration.test_fork import in_child
from veronica_otel import (
    Decision,
    ExecutionConfig,
    ExecutionContext,
    TripEvent,
)
from veronica_otel._breaker import CircuitState
from veronica_otel._ledger import Level, Limits, Reservation
from veronica_otel.distributed import LedgerUnavailableError, RedisCircuitBreaker, RedisLedger
from veronica_otel.distributed._connect import ClusterClient, connect, with_cluster_flag
from veronica_otel.testing import FakeLLMServer, RedisClusterProcess

U = 1_000_000  # one unit of cost in nano-USD


def chain_on(cluster: RedisClusterProcess, ledger: RedisLedger, node: int, stem: str) -> str:
    """A root chain id whose keys live on ``node``."""
    for i in itertools.count():
        chain_id = f"{stem}{i}"
        if key_slot(ledger.key(chain_id).encode()) in cluster.slots(node):
            return chain_id
    raise AssertionError("unreachable")


def holder(cluster: RedisClusterProcess, key: str) -> int:
    """Which node holds ``key`` (asked of every node directly; the others answer MOVED)."""
    found, moved = [], set()
    for index, port in enumerate(cluster.ports):
        with redis.Redis(port=port) as node:
            try:
                if node.exists(key):
                    found.append(index)
            except MovedError as exc:
                moved.add(exc.port)
    assert len(found) == 1, found
    assert moved == {cluster.ports[found[0]]}  # the two others point to it
    return found[0]


def _stub() -> None:
    return None


@pytest.fixture
def cluster_ledger(redis_cluster: RedisClusterProcess, redis_prefix: str) -> RedisLedger:
    return RedisLedger.from_url(redis_cluster.url, key_prefix=redis_prefix)


# -- one chain on each node ---------------------------------------------------------------


@pytest.mark.parametrize("node", [0, 1, 2])
def test_every_operation_on_a_chain_of_each_node(
    redis_cluster: RedisClusterProcess, cluster_ledger: RedisLedger, node: int
) -> None:
    ledger = cluster_ledger
    cid = chain_on(redis_cluster, ledger, node, "job-")
    path = [Level(cid, Limits(cost_nano=10 * U, steps=20))]

    first = ledger.reserve(path, 4 * U, 10)
    assert isinstance(first, Reservation)
    assert ledger.commit(path, first, 3 * U, 7) is None
    given_back = ledger.reserve(path, 4 * U, 0)
    assert isinstance(given_back, Reservation)
    ledger.release(path, given_back)
    second = ledger.reserve(path, 4 * U, 0)
    assert isinstance(second, Reservation)
    assert ledger.commit(path, second, 4 * U, 0) is None
    snap = ledger.snapshot(cid)
    assert (snap.cost_nano, snap.reserved_nano, snap.steps, snap.tokens) == (7 * U, 0, 2, 7)

    denied = ledger.reserve(path, 4 * U, 0)  # 7 + 4 > 10 on committed spend: sticky
    assert isinstance(denied, TripEvent) and denied.sticky and denied.reason == "cost"
    assert ledger.snapshot(cid).trip == denied
    again = ledger.reserve(path, 1, 0)
    assert isinstance(again, TripEvent) and again.message == denied.message

    lifted = ledger.override(cid, expires_at=time.time() + 600, add_cost_nano=10 * U)
    assert lifted == denied
    after = ledger.reserve(path, 4 * U, 0)
    assert isinstance(after, Reservation)
    ledger.release(path, after)

    event = TripEvent("steps", 20.0, 21.0, cid, f"chain {cid}: tripped by hand")
    assert ledger.trip(cid, event) == event
    assert ledger.trip(cid, TripEvent("cost", 1.0, 2.0, cid, "later")) == event  # first wins
    assert ledger.snapshot(cid).trip == event

    assert holder(redis_cluster, ledger.key(cid)) == node


def test_a_chain_tree_is_one_slot_on_a_node_other_than_the_first(
    redis_cluster: RedisClusterProcess, cluster_ledger: RedisLedger
) -> None:
    ledger = cluster_ledger
    root = chain_on(redis_cluster, ledger, 2, "tree-")
    config = ExecutionConfig(max_steps=10)
    with ExecutionContext(config, chain_id=root, ledger=ledger) as ctx:
        child = ctx.spawn_child(ExecutionConfig(max_steps=2))
        grandchild = child.spawn_child(ExecutionConfig(max_steps=1))
        assert (child.chain_id, grandchild.chain_id) == (f"{root}.1", f"{root}.1.1")
        slots = {key_slot(ledger.key(c).encode()) for c in (root, child.chain_id)}
        slots.add(key_slot(ledger.key(grandchild.chain_id).encode()))
        assert len(slots) == 1 and slots.pop() in redis_cluster.slots(2)

        assert grandchild.wrap_llm_call(_stub) is Decision.ALLOW  # three levels, one script
        assert grandchild.wrap_llm_call(_stub) is Decision.HALT  # its own max_steps=1
        assert child.wrap_llm_call(_stub) is Decision.ALLOW
        assert child.wrap_llm_call(_stub) is Decision.HALT  # 2 steps, one via the grandchild
        assert ctx.wrap_llm_call(_stub) is Decision.ALLOW
    assert ledger.snapshot(root).steps == 3
    assert ledger.snapshot(f"{root}.1").steps == 2
    assert ledger.snapshot(f"{root}.1.1").steps == 1
    assert holder(redis_cluster, ledger.key(f"{root}.1.1")) == 2


def test_an_abandoned_reservation_is_reclaimed_on_its_node(
    redis_cluster: RedisClusterProcess, redis_prefix: str
) -> None:
    """Reclaiming reads the chains a record names (keys the script builds itself):
    they share the tree's slot, so the node serves them."""
    ledger = RedisLedger.from_url(redis_cluster.url, key_prefix=redis_prefix, reservation_ttl_s=0.0)
    root = chain_on(redis_cluster, ledger, 1, "lost-")
    path = [Level(root, Limits(cost_nano=10 * U)), Level(f"{root}.1", Limits())]
    abandoned = ledger.reserve(path, 6 * U, 0)
    assert isinstance(abandoned, Reservation)
    fresh = ledger.reserve(path, 3 * U, 0)  # the first is charged (reaped) on every level
    assert isinstance(fresh, Reservation)
    for chain in (root, f"{root}.1"):
        state = ledger.snapshot(chain)
        assert (state.cost_nano, state.reserved_nano) == (6 * U, 3 * U)
    ledger.commit(path, abandoned, 2 * U, 0)  # the slow holder's late commit still counts
    ledger.commit(path, fresh, 3 * U, 0)
    assert ledger.snapshot(root).cost_nano == 5 * U
    assert ledger.snapshot(f"{root}.1").reserved_nano == 0


# -- exact under concurrency ----------------------------------------------------------------


def test_exact_bound_under_threads_on_the_third_node(
    redis_cluster: RedisClusterProcess, redis_prefix: str
) -> None:
    """Eight threads on two ledgers (two clients) race for 100 units: exactly 100 go out."""
    ledgers = [RedisLedger.from_url(redis_cluster.url, key_prefix=redis_prefix) for _ in "ab"]
    cid = chain_on(redis_cluster, ledgers[0], 2, "race-")
    path = [Level(cid, Limits(cost_nano=100 * U, steps=1000))]
    admitted = [0] * 8
    start = threading.Barrier(8)

    def worker(index: int) -> None:
        ledger = ledgers[index % 2]
        start.wait()
        for _ in range(1000):
            got = ledger.reserve(path, U, 1)
            if isinstance(got, TripEvent):
                if got.sticky:
                    return
                continue  # others' reservations in flight: try again
            admitted[index] += 1
            ledger.commit(path, got, U, 1)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    snap = ledgers[1].snapshot(cid)
    assert sum(admitted) == 100
    assert (snap.cost_nano, snap.steps, snap.tokens) == (100 * U, 100, 100)
    assert (snap.reserved_nano, snap.reserved_tokens) == (0, 0)
    assert snap.trip is not None and snap.trip.reason == "cost"


def test_a_forked_child_charges_the_same_chain_through_its_own_connections(
    redis_cluster: RedisClusterProcess, cluster_ledger: RedisLedger
) -> None:
    ledger = cluster_ledger
    cid = chain_on(redis_cluster, ledger, 1, "forked-")
    path = [Level(cid, Limits(steps=3))]
    held = ledger.reserve(path, U, 0)  # the parent's sockets are open at fork
    assert isinstance(held, Reservation)

    def child() -> list[bool]:
        got = [ledger.reserve(path, U, 0) for _ in range(3)]
        for r in got:
            if isinstance(r, Reservation):
                ledger.commit(path, r, U, 0)
        return [isinstance(r, Reservation) for r in got]

    assert in_child(child) == [True, True, False]  # 1 held by the parent + 2 = 3 steps
    ledger.commit(path, held, U, 0)
    snap = ledger.snapshot(cid)
    assert (snap.steps, snap.cost_nano, snap.reserved_nano) == (3, 3 * U, 0)


# -- the breaker ----------------------------------------------------------------------------


def test_breaker_state_is_shared_across_clients_on_the_cluster(
    redis_cluster: RedisClusterProcess, redis_prefix: str
) -> None:
    first, second = (
        RedisCircuitBreaker.from_url(
            redis_cluster.url, "openai/gpt-4o", 2, 3600.0, key_prefix=redis_prefix
        )
        for _ in "ab"
    )
    assert first.store.startswith("redis+cluster://127.0.0.1:")
    assert second.check().allowed
    first.record_failure()
    first.record_failure()
    denied = second.check()
    assert not denied.allowed and "circuit open after 2 failures" in denied.reason
    assert second.state is CircuitState.OPEN and second.failure_count == 2
    second.reset()
    assert first.check().allowed and first.state is CircuitState.CLOSED


# -- failing closed -------------------------------------------------------------------------


def _dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_an_unreachable_cluster_fails_closed_and_nothing_is_sent_at_construction() -> None:
    url = f"redis://:secret@127.0.0.1:{_dead_port()},127.0.0.1:{_dead_port()}"
    ledger = RedisLedger.from_url(url, fail_open=False)  # connects to nothing yet
    breaker = RedisCircuitBreaker.from_url(url, "anthropic/claude", fail_open=False)
    path = [Level("job-1", Limits(cost_nano=10 * U))]
    with pytest.raises(LedgerUnavailableError) as caught:
        ledger.reserve(path, U, 0)
    assert "secret" not in str(caught.value)
    assert "redis+cluster://127.0.0.1:" in str(caught.value)
    assert ledger.commit(path, Reservation("gone-1", U, 0, True), U, 0) is None
    assert ledger.pending == 2  # the failed reserve's cancel and the commit: queued, not dropped
    decision = breaker.check()
    assert not decision.allowed and "unreachable" in decision.reason


def test_a_node_down_fails_its_chains_closed_and_queued_commits_land_when_it_is_back(
    redis_binary: str, tmp_path: Path
) -> None:
    """A killed node (no replica): its chain's reserve fails closed, the commit of a
    call already sent is queued, and replayed once the node is back with its data."""
    with RedisClusterProcess(tmp_path, binary=redis_binary, durable=True) as cluster:
        ledger = RedisLedger.from_url(cluster.url, fail_open=False)
        try:
            cid = chain_on(cluster, ledger, 2, "outage-")
            path = [Level(cid, Limits(cost_nano=10 * U))]
            sent = ledger.reserve(path, 2 * U, 0)
            assert isinstance(sent, Reservation)
            cluster.nodes[2].kill()
            assert ledger.commit(path, sent, 2 * U, 0) is None  # never raises into the call
            assert ledger.pending == 1
            with pytest.raises(LedgerUnavailableError):
                ledger.reserve(path, U, 0)
            cluster.nodes[2].start()  # same port, same data and cluster identity
            cluster.wait_ok()
            assert ledger.flush() == 0
            snap = ledger.snapshot(cid)
            assert (snap.cost_nano, snap.reserved_nano, snap.steps) == (2 * U, 0, 1)
            assert isinstance(ledger.reserve(path, U, 0), Reservation)
        finally:
            # Its sockets closed here, not by a later test's garbage collection
            # (filterwarnings = error fails whatever test that runs in).
            ledger.close()


def test_an_unreachable_cluster_fails_open_to_a_local_ledger_when_asked() -> None:
    ledger = RedisLedger.from_url(f"redis://127.0.0.1:{_dead_port()}?cluster=true", fail_open=True)
    assert isinstance(ledger.reserve([Level("job-2", Limits())], U, 0), Reservation)
    assert ledger.is_local


# -- the URL forms --------------------------------------------------------------------------


def test_one_url_is_a_plain_client_with_the_ledger_policy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("VERONICA_REDIS_CLUSTER", raising=False)
    client = connect("redis://:pw@10.1.2.3:6380/4", 3.0, 0.5)
    assert type(client) is redis.Redis
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("10.1.2.3", 6380, 4)
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (3.0, 0.5)
    assert kwargs["retry"].get_retries() == 0
    assert type(connect("redis://h:1?cluster=false")) is redis.Redis
    assert type(connect("unix:///tmp/r.sock?db=2")) is redis.Redis


@pytest.mark.parametrize(
    ("url", "nodes"),
    [
        ("redis://a:7000,redis://b:7001", [("a", 7000), ("b", 7001)]),
        ("redis://a:7000, b:7001 ,c", [("a", 7000), ("b", 7001), ("c", 6379)]),
        ("rediss://u:pw@a:7000,b:7001/0", [("a", 7000), ("b", 7001)]),
        ("redis://a:7000?cluster=true", [("a", 7000)]),
        ("redis://a:7000,b:7001?cluster=yes&socket_keepalive=true", [("a", 7000), ("b", 7001)]),
    ],
)
def test_several_nodes_or_the_flag_make_a_cluster_client(
    url: str, nodes: list[tuple[str, int]]
) -> None:
    client = connect(url)
    assert isinstance(client, ClusterClient)
    assert client._nodes == nodes
    assert "pw" not in client.store_label and "cluster=" not in client._url


def test_the_cluster_variable_makes_a_cluster_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERONICA_REDIS_CLUSTER", "true")
    assert isinstance(connect("redis://a:7000"), ClusterClient)
    assert type(connect("redis://a:7000?cluster=false")) is redis.Redis  # the URL wins
    monkeypatch.setenv("VERONICA_REDIS_CLUSTER", "sometimes")
    with pytest.raises(ValueError, match="VERONICA_REDIS_CLUSTER='sometimes'"):
        connect("redis://a:7000")
    environ = {"VERONICA_REDIS_CLUSTER": "on"}
    assert with_cluster_flag("redis://a:1", environ) == "redis://a:1?cluster=true"
    assert with_cluster_flag("redis://a:1,b:2?x=1", environ) == "redis://a:1,b:2?x=1&cluster=true"
    assert with_cluster_flag("redis://a:1?cluster=false", environ) == "redis://a:1?cluster=false"
    assert with_cluster_flag("redis://a:1", {}) == "redis://a:1"
    with pytest.raises(ValueError, match="VERONICA_REDIS_CLUSTER='maybe'"):
        with_cluster_flag("redis://a:1", {"VERONICA_REDIS_CLUSTER": "maybe"})


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "non-empty"),
        ("http://:hunter2@a:1", "must start with redis://"),
        ("redis://:hunter2@a:1,,b:2", "empty node"),
        ("redis://:hunter2@a:1?cluster=maybe", "cluster='maybe' is not a boolean"),
        ("redis://:hunter2@a:1,b:2?cluster=false", "several nodes but cluster=false"),
        ("redis://:hunter2@a:1,redis://:other@b:2", "same scheme and credentials|first node's"),
        ("redis://:hunter2@a:1,rediss://:hunter2@b:2", "first node's scheme"),
        ("redis://:hunter2@a:1,b:port", "malformed port"),
        ("redis://:hunter2@a:1/3,b:2", "only database 0"),
        ("unix:///tmp/r.sock?cluster=true", "over TCP"),
    ],
)
def test_malformed_urls_are_named_without_their_password(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        connect(url)
    assert "hunter2" not in str(caught.value)


# -- zero code ------------------------------------------------------------------------------


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=5) as srv:
        yield srv


def test_two_unchanged_processes_share_a_chain_on_the_cluster(
    llm: FakeLLMServer,
    redis_cluster: RedisClusterProcess,
    redis_prefix: str,
    zero_code_scripts: FrameworkApp,
) -> None:
    """The first names every node; the second one node and VERONICA_REDIS_CLUSTER.

    Each a process of its own, forked from one zero-code process after openai's
    import, its default chain built from its own variables as start-up builds
    it (:func:`tests._zero_code.script_scenarios`, the worker's shared one)."""
    probe = RedisLedger.from_url(redis_cluster.url, key_prefix=redis_prefix)
    chain = chain_on(redis_cluster, probe, 2, "nightly-")
    shared = {
        "VERONICA_REDIS_PREFIX": redis_prefix,
        "VERONICA_CHAIN_ID": chain,
        "VERONICA_MAX_STEPS": "6",
    }
    agent = str(UNCHANGED_AGENT)
    agents = ScriptRuns(zero_code_scripts, llm)
    first, done = agents.run(agent, VERONICA_REDIS_URL=redis_cluster.url, **shared)
    assert first["raised"] is None and done.returncode == 0, (first, done.stderr[-2000:])
    assert len(printed(done)) == 5  # 5 steps of 6
    second, done = agents.run(
        agent,
        VERONICA_REDIS_URL=f"redis://127.0.0.1:{redis_cluster.ports[0]}",
        VERONICA_REDIS_CLUSTER="true",
        **shared,
    )
    assert printed(done) == ["step 0 ok"]  # the 6th step, then the trip
    assert second["raised"] == "BudgetExceededError", second
    assert "steps limit reached" in second["message"]
    assert llm.count("/v1/chat/completions") == 6
    snap = probe.snapshot(chain)
    assert snap.steps == 6 and snap.trip is not None and snap.trip.reason == "steps"
    assert holder(redis_cluster, probe.key(chain)) == 2


def test_the_cluster_client_keeps_the_ledger_policy(
    redis_cluster: RedisClusterProcess, cluster_ledger: RedisLedger
) -> None:
    """No client-side retries (a retried reservation could count twice), short timeouts."""
    client = cluster_ledger.client
    assert isinstance(client, ClusterClient)
    cluster = client.redis_cluster
    assert cluster.retry.get_retries() == 0
    for node in cluster.get_nodes():
        kwargs = node.redis_connection.connection_pool.connection_kwargs
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (2.0, 1.0)
    assert len(cluster.get_nodes()) == 3
