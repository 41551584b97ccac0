"""Budget pools in the shared ledger, on a real Valkey and a real 3-node cluster.

Every test of ``store`` runs twice: on one server (chain and pools in one
script) and on a Redis Cluster whose chain keys are on another node than
the pools' slot (the two-phase protocol of ``distributed/_pools.py``).
Windows are checked against the server's own clock (``TIME``).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.context import ForkServerContext
from typing import Any

import pytest
from redis.crc import key_slot

from tests.integration import _pool_workers
from tests.integration import _redis_workers as workers
from tests.integration.test_redis_cluster import holder
from tests.integration.test_redis_ledger import CountingRedis
from tests.integration.test_redis_ledger import close_ledger as _close
from veronica_otel import LocalLedger
from veronica_otel._errors import TripEvent
from veronica_otel._ledger import Level, Limits, PoolLevel, Reservation
from veronica_otel._units import usd_to_nano as _nano
from veronica_otel.cli import main
from veronica_otel.distributed import LedgerCorruptedError, RedisLedger
from veronica_otel.testing import RedisClusterProcess

U = 1_000_000  # one unit of cost in nano-USD
W_US = 1_000_000  # the 1-second window of the sliding tests


def server_us(client: Any) -> int:
    """The store's clock in microseconds (what the scripts count windows by)."""
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


class Store:
    """A ledger on one server or on the cluster, and chain ids for it."""

    def __init__(self, ledger: RedisLedger, chains: Callable[[str], str], cluster: bool) -> None:
        self.ledger = ledger
        self.chain = chains
        self.cluster = cluster

    def pool_key(self, name: str) -> str:
        return self.ledger._pools.key(name)

    def pool_records(self) -> int:
        return int(self.ledger.client.hlen(self.pool_key("x").rpartition("p:")[0] + "rh"))


@pytest.fixture(params=["server", "cluster"])
def store(request: pytest.FixtureRequest, redis_prefix: str) -> Iterator[Store]:
    yield from open_store(request, redis_prefix)


def open_store(request: pytest.FixtureRequest, redis_prefix: str) -> Iterator[Store]:
    """The ``store`` fixture's body (other test modules parametrize their own)."""
    if request.param == "server":
        url = request.getfixturevalue("redis_url")
        ledger = RedisLedger.from_url(url, key_prefix=redis_prefix)
        yield Store(ledger, lambda stem: stem, cluster=False)
    else:
        cluster: RedisClusterProcess = request.getfixturevalue("redis_cluster")
        ledger = RedisLedger.from_url(cluster.url, key_prefix=redis_prefix)
        pool_slot = key_slot(ledger._pools.key("any").encode())
        pool_node = next(i for i in range(3) if pool_slot in cluster.slots(i))

        def elsewhere(stem: str) -> str:
            for i in itertools.count():
                chain_id = f"{stem}{i}"
                if key_slot(ledger.key(chain_id).encode()) not in cluster.slots(pool_node):
                    return chain_id
            raise AssertionError("unreachable")

        assert ledger._pools.cluster
        yield Store(ledger, elsewhere, cluster=True)
    _close(ledger)


@pytest.fixture
def open_ledger(redis_url: str, redis_prefix: str) -> Iterator[Callable[..., RedisLedger]]:
    """RedisLedger.from_url on the test's server and prefix, closed at teardown."""
    made: list[RedisLedger] = []

    def make(url: str = redis_url) -> RedisLedger:
        made.append(RedisLedger.from_url(url, key_prefix=redis_prefix))
        return made[-1]

    yield make
    for ledger in made:
        _close(ledger)


def lifetime(name: str, cost: int | None = None, steps: int | None = None) -> PoolLevel:
    return PoolLevel(name, Limits(cost_nano=cost, steps=steps))


def windowed(name: str, cost: int) -> PoolLevel:
    return PoolLevel(name, Limits(cost_nano=cost), window_s=W_US / 1e6, bucket_s=0.05)


# -- reserve, settle, deny ----------------------------------------------------------------


def test_reserve_and_commit_settle_every_pool(store: Store) -> None:
    ledger = store.ledger
    path = [Level(store.chain("a"), Limits(cost_nano=100 * U))]
    org, user = lifetime("org:x", cost=50 * U), lifetime("user:y", cost=5 * U, steps=3)
    got = ledger.reserve(path, 2 * U, 7, pools=[org, user])
    assert isinstance(got, Reservation)
    assert got.pools == (org, user)
    held = ledger.pool_snapshot(user)
    assert (_nano(held.reserved_cost_usd), held.reserved_steps, held.reserved_tokens) == (
        2 * U,
        1,
        7,
    )
    assert ledger.commit(path, got, U, 5) is None
    for pool in (org, user):
        snap = ledger.pool_snapshot(pool)
        assert (_nano(snap.cost_usd), snap.steps, snap.tokens) == (U, 1, 5)
        assert (_nano(snap.reserved_cost_usd), snap.reserved_steps, snap.reserved_tokens) == (
            0,
            0,
            0,
        )
        assert snap.window_s is None and snap.free_in_s is None
    assert ledger.snapshot(path[0].chain_id).cost_nano == U


def test_release_gives_every_pool_back(store: Store) -> None:
    ledger = store.ledger
    path = [Level(store.chain("b"), Limits())]
    pool = lifetime("p", cost=3 * U, steps=1)
    got = ledger.reserve(path, 3 * U, 0, pools=[pool])
    assert isinstance(got, Reservation)
    ledger.release(path, got)
    snap = ledger.pool_snapshot(pool)
    assert (
        _nano(snap.cost_usd),
        snap.steps,
        _nano(snap.reserved_cost_usd),
        snap.reserved_steps,
    ) == (0, 0, 0, 0)
    assert isinstance(ledger.reserve(path, 3 * U, 0, pools=[pool]), Reservation)


def test_usage_committed_without_a_held_reservation_counts_in_the_pools(store: Store) -> None:
    """A call that reserved nothing (no step, no amount) still spends what it reports."""
    ledger = store.ledger
    path = [Level(store.chain("c"), Limits())]
    pool = lifetime("spent-late", cost=10 * U)
    for cost, tokens in ((4 * U, 7), (U, 1)):  # each such commit has an id of its own
        held = ledger.reserve(path, 0, 0, step=False, pools=[pool])
        assert isinstance(held, Reservation) and not held.id
        assert ledger.commit(path, held, cost, tokens) is None
    snap = ledger.pool_snapshot(pool)
    assert (_nano(snap.cost_usd), snap.tokens, _nano(snap.reserved_cost_usd)) == (5 * U, 8, 0)


def test_fits_the_chain_not_the_pool_reserves_nothing_anywhere(store: Store) -> None:
    ledger = store.ledger
    chain = store.chain("c")
    path = [Level(chain, Limits(cost_nano=100 * U, steps=10))]
    roomy, tight = lifetime("roomy", cost=100 * U), lifetime("tight", cost=U, steps=5)
    denied = ledger.reserve(path, 2 * U, 0, pools=[roomy, tight])
    assert not isinstance(denied, Reservation)
    assert (denied.pool, denied.reason, denied.sticky) == (
        "tight",
        "cost",
        True,
    )  # over on committed spend alone: the chain stops, as in process
    assert (denied.limit, denied.observed, denied.chain_id) == (0.001, 0.002, chain)
    assert denied.retry_after_s is None  # a lifetime pool never frees
    state = ledger.snapshot(chain)
    assert (state.steps, state.reserved_nano, state.trip) == (0, 0, None)
    for pool in (roomy, tight):
        snap = ledger.pool_snapshot(pool)
        assert (_nano(snap.reserved_cost_usd), snap.reserved_steps, _nano(snap.cost_usd)) == (
            0,
            0,
            0,
        )
    assert store.pool_records() == 0


def test_fits_the_pool_not_the_chain_releases_the_pools(store: Store) -> None:
    ledger = store.ledger
    chain = store.chain("d")
    path = [Level(chain, Limits(cost_nano=U))]
    pool = lifetime("p", cost=100 * U)
    denied = ledger.reserve(path, 2 * U, 0, pools=[pool])
    assert not isinstance(denied, Reservation)
    assert (denied.pool, denied.reason, denied.sticky) == (None, "cost", True)
    snap = ledger.pool_snapshot(pool)
    assert (
        _nano(snap.reserved_cost_usd),
        snap.reserved_steps,
        _nano(snap.cost_usd),
        snap.steps,
    ) == (0, 0, 0, 0)
    assert store.pool_records() == 0
    # The pool is untouched for other chains.
    other = [Level(store.chain("e"), Limits())]
    assert isinstance(ledger.reserve(other, 100 * U, 0, pools=[pool]), Reservation)


def _denial(found: object) -> tuple[Any, ...]:
    assert isinstance(found, TripEvent), found
    return (found.pool, found.reason, found.sticky, found.chain_id, found.limit, found.observed)


def test_the_chains_own_trip_is_reported_before_a_pools_denial(store: Store) -> None:
    """Both refuse: the chain's own limits decide first, as on LocalLedger, so
    its trip is stored at this call (not at its next one); nothing is held."""
    ledger = store.ledger
    chain = store.chain("o")
    path = [Level(chain, Limits(cost_nano=U))]
    pool = lifetime("full", cost=U)
    denied = ledger.reserve(path, 2 * U, 0, pools=[pool])
    assert _denial(denied) == _denial(LocalLedger().reserve(path, 2 * U, 0, pools=[pool]))
    assert _denial(denied)[:4] == (None, "cost", True, chain)
    state = ledger.snapshot(chain)
    assert state.trip is not None and state.trip.reason == "cost"
    assert (state.steps, state.reserved_nano) == (0, 0)
    snap = ledger.pool_snapshot(pool)
    assert (_nano(snap.reserved_cost_usd), snap.reserved_steps) == (0, 0)
    assert store.pool_records() == 0


def test_a_pools_hard_denial_beats_the_chains_soft_one_and_not_the_reverse(
    store: Store,
) -> None:
    """Only calls in flight fill the chain (soft): a pool full of committed
    spend is reported; a pool only calls in flight fill is not (LocalLedger's order)."""
    ledger, local = store.ledger, LocalLedger()
    path = [Level(store.chain("s"), Limits(cost_nano=3 * U))]
    spent, busy = lifetime("spent", cost=3 * U), lifetime("busy", cost=3 * U)
    other = [Level(store.chain("x"), Limits())]
    for on in (ledger, local):
        assert isinstance(on.reserve(path, 2 * U, 0), Reservation)  # in flight on the chain
        filled = on.reserve(other, 2 * U, 0, pools=[spent])
        assert isinstance(filled, Reservation)
        on.commit(other, filled, 2 * U, 0)  # committed in "spent"
        assert isinstance(on.reserve(other, 2 * U, 0, pools=[busy]), Reservation)
    hard = ledger.reserve(path, 2 * U, 0, pools=[spent])
    assert _denial(hard) == _denial(local.reserve(path, 2 * U, 0, pools=[spent]))
    assert _denial(hard)[:3] == ("spent", "cost", True)
    soft = ledger.reserve(path, 2 * U, 0, pools=[busy])
    assert _denial(soft) == _denial(local.reserve(path, 2 * U, 0, pools=[busy]))
    assert _denial(soft)[:3] == (None, "cost", False)
    assert ledger.snapshot(path[0].chain_id).trip is None


def test_a_call_of_no_amount_is_denied_by_a_pool_already_over(store: Store) -> None:
    """As on LocalLedger: a pool whose committed spend passed its limit (usage
    reported above the reservation) refuses even a call that reserves nothing."""
    ledger, local = store.ledger, LocalLedger()
    path = [Level(store.chain("z"), Limits())]
    pool = lifetime("over", cost=U)
    for on in (ledger, local):
        held = on.reserve(path, U, 0, pools=[pool])
        assert isinstance(held, Reservation)
        on.commit(path, held, 2 * U, 0)
    denied = ledger.reserve(path, 0, 0, step=False, pools=[pool])
    assert _denial(denied) == _denial(local.reserve(path, 0, 0, step=False, pools=[pool]))
    assert _denial(denied)[:3] == ("over", "cost", True)


def test_a_denial_only_in_flight_calls_cause_is_soft(store: Store) -> None:
    ledger = store.ledger
    pool = lifetime("p", cost=3 * U)
    first = [Level(store.chain("f"), Limits())]
    held = ledger.reserve(first, 2 * U, 0, pools=[pool])
    assert isinstance(held, Reservation)
    denied = ledger.reserve([Level(store.chain("g"), Limits())], 2 * U, 0, pools=[pool])
    assert not isinstance(denied, Reservation)
    assert denied.pool == "p" and "in flight" in denied.message


def test_replayed_commit_counts_once(store: Store) -> None:
    ledger = store.ledger
    path = [Level(store.chain("h"), Limits())]
    pool = lifetime("p", cost=10 * U)
    got = ledger.reserve(path, 2 * U, 0, pools=[pool])
    assert isinstance(got, Reservation)
    ledger.commit(path, got, 2 * U, 0)
    ledger.commit(path, got, 2 * U, 0)  # delivered twice
    assert _nano(ledger.pool_snapshot(pool).cost_usd) == 2 * U
    assert ledger.snapshot(path[0].chain_id).cost_nano == 2 * U


def test_pools_are_listed_and_shown_by_the_cli(
    store: Store, redis_prefix: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    ledger = store.ledger
    path = [Level(store.chain("i"), Limits())]
    day = PoolLevel("tenant:acme", Limits(cost_nano=50 * U), window_s=86400.0)
    got = ledger.reserve(path, 3 * U, 0, pools=[day, lifetime("user:bo", cost=U * 9)])
    assert isinstance(got, Reservation)
    ledger.commit(path, got, 2 * U, 0)
    assert ledger.pool_names() == ["tenant:acme", "user:bo"]
    monkeypatch.setenv("VERONICA_REDIS_PREFIX", redis_prefix)
    url = ledger.store if not store.cluster else _cluster_url(ledger)
    assert main(["pools", "--redis", url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == (
        ["POOL", "WINDOW", "SPENT", "USD", "STEPS", "TOKENS", "RESERVED", "USD", "FREES", "IN"]
    )
    acme, bo = lines[1].split(), lines[2].split()
    assert acme[:5] == ["tenant:acme", "1.0d", "0.002000", "1", "0"]
    assert acme[5] == "0.000000" and acme[6].endswith("d")  # frees in about a day
    assert bo == ["user:bo", "lifetime", "0.002000", "1", "0", "0.000000", "-"]


def _cluster_url(ledger: RedisLedger) -> str:
    label = ledger.store  # redis+cluster://h:p,h:p,h:p
    return "redis://" + label.split("://", 1)[1]


# -- rolling windows, on the server's clock ---------------------------------------------


def test_window_refuses_then_admits_once_it_slides(store: Store) -> None:
    ledger, client = store.ledger, store.ledger.client
    pool = windowed("burst", cost=3 * U)
    path = [Level(store.chain("w"), Limits())]
    before = server_us(client)
    got = ledger.reserve(path, 3 * U, 0, pools=[pool])
    assert isinstance(got, Reservation)
    ledger.commit(path, got, 3 * U, 0)
    denied = ledger.reserve(path, U, 0, pools=[pool])
    assert not isinstance(denied, Reservation)
    assert denied.pool == "burst" and denied.retry_after_s is not None
    assert 0 < denied.retry_after_s <= 1.05  # the window plus one bucket at most
    deadline = time.monotonic() + 15
    while True:
        snap = ledger.pool_snapshot(pool)
        after = server_us(client)
        if _nano(snap.cost_usd) == 0:
            break
        # Never dropped early: every snapshot taken before the window ended holds it.
        assert _nano(snap.cost_usd) == 3 * U
        assert snap.free_in_s is not None and snap.free_in_s > 0
        assert time.monotonic() < deadline, "the window never slid"
        time.sleep(0.05)  # polling the store's clock
    assert after >= before + W_US  # gone only after the whole window
    assert isinstance(ledger.reserve(path, 3 * U, 0, pools=[pool]), Reservation)


def test_window_keeps_spend_per_bucket(open_ledger: Callable[..., RedisLedger]) -> None:
    """Spend made at different times leaves the window bucket by bucket."""
    ledger = open_ledger()
    client = ledger.client
    pool = PoolLevel("steady", Limits(cost_nano=10 * U), window_s=1.0, bucket_s=0.02)
    path = [Level("s", Limits())]
    times = []  # server time just before each commit: its spend is no older
    for amount in (U, 2 * U):
        times.append(server_us(client))
        got = ledger.reserve(path, amount, 0, pools=[pool])
        assert isinstance(got, Reservation)
        ledger.commit(path, got, amount, 0)
        while server_us(client) < times[-1] + 300_000:  # the second one 0.3 s later
            time.sleep(0.02)
    seen = set()
    deadline = time.monotonic() + 10
    while True:
        cost = _nano(ledger.pool_snapshot(pool).cost_usd)
        read_by = server_us(client)  # the snapshot was read no later than this
        seen.add(cost)
        if read_by < times[0] + 1_000_000:  # read inside the first spend's window
            assert cost == 3 * U
        if cost == 0:
            break
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert 2 * U in seen  # the first left before the second
    got = ledger.reserve(path, U, 0, pools=[pool])  # the next write drops old buckets
    assert isinstance(got, Reservation)
    ledger.release(path, got)
    fields = client.hkeys(ledger._pools.key("steady"))
    assert not [f for f in fields if f.decode().startswith(("c:", "s:", "t:"))]


# -- crashed holders, heartbeat, loss, corruption ---------------------------------------


def test_expired_pool_reservation_is_charged_then_replaced_by_its_late_commit(
    store: Store,
) -> None:
    url_ledger = store.ledger
    client = url_ledger.client
    dead = RedisLedger(client, key_prefix=url_ledger._prefix, reservation_ttl_s=0.3)
    dead.close()  # no heartbeat: its reservation will expire
    pool = lifetime("p", cost=10 * U)
    path = [Level(store.chain("x"), Limits())]
    held = dead.reserve(path, 4 * U, 0, pools=[pool])
    assert isinstance(held, Reservation)
    expiry = server_us(client) + 300_000
    while server_us(client) <= expiry:
        time.sleep(0.02)
    other = [Level(store.chain("y"), Limits())]
    got = url_ledger.reserve(other, U, 0, pools=[pool])  # reaps the expired one
    assert isinstance(got, Reservation)
    snap = url_ledger.pool_snapshot(pool)
    assert (_nano(snap.cost_usd), _nano(snap.reserved_cost_usd), snap.steps) == (4 * U, U, 1)
    dead.commit(path, held, 2 * U, 0)  # the late commit replaces the charge
    dead.commit(path, held, 2 * U, 0)  # and its replay counts once
    snap = url_ledger.pool_snapshot(pool)
    assert (_nano(snap.cost_usd), _nano(snap.reserved_cost_usd), snap.steps) == (2 * U, U, 1)


def test_heartbeat_keeps_pool_reservations_alive(open_ledger: Callable[..., RedisLedger]) -> None:
    ledger = open_ledger()
    ledger.close()  # the test beats by hand
    got = ledger.reserve([Level("hb", Limits())], U, 0, pools=[lifetime("p", cost=9 * U)])
    assert isinstance(got, Reservation)
    rz = ledger._pools.key("p").rpartition("p:")[0] + "rz"
    first = ledger.client.zscore(rz, got.id)
    assert first is not None
    now = server_us(ledger.client)
    while server_us(ledger.client) < now + 2000:
        pass
    assert ledger.heartbeat() == 2  # the chain's reservation and the pools'
    renewed = ledger.client.zscore(rz, got.id)
    assert renewed is not None and renewed > first
    ledger.commit([Level("hb", Limits())], got, U, 0)
    assert ledger.heartbeat() == 0


def test_pool_lost_with_the_store_is_reseeded_from_marks(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = store.ledger
    pool = lifetime("p", cost=3 * U)
    path = [Level(store.chain("l"), Limits())]
    got = ledger.reserve(path, 2 * U, 0, pools=[pool])
    assert isinstance(got, Reservation)
    ledger.commit(path, got, 2 * U, 0)
    ledger.client.delete(store.pool_key("p"))  # lost (flush, eviction, restart)
    with caplog.at_level(logging.WARNING, "veronica_otel.distributed"):
        held = ledger.reserve(path, 0, 0, pools=[pool])  # fits: re-seeded all the same
    assert isinstance(held, Reservation)
    assert "re-seeded" in caplog.text
    ledger.release(path, held)
    denied = ledger.reserve(path, 2 * U, 0, pools=[pool])  # 2 + 2 > 3: the spend came back
    assert not isinstance(denied, Reservation)
    assert denied.pool == "p"
    assert _nano(ledger.pool_snapshot(pool).cost_usd) == 2 * U


def test_a_foreign_value_in_a_pool_is_corruption(store: Store) -> None:
    store.ledger.client.hset(store.pool_key("p"), "c", "lots")
    with pytest.raises(LedgerCorruptedError, match="lots"):
        store.ledger.reserve([Level(store.chain("k"), Limits())], U, 0, pools=[lifetime("p")])


def test_bad_pool_names_and_windows_name_the_value(open_ledger: Callable[..., RedisLedger]) -> None:
    ledger = open_ledger()
    path = [Level("bad", Limits())]
    with pytest.raises(ValueError, match="pool name 'a b'"):
        ledger.reserve(path, U, 0, pools=[lifetime("a b")])
    with pytest.raises(ValueError, match="window_s"):
        ledger.reserve(path, U, 0, pools=[PoolLevel("p", Limits(), window_s=0.0)])
    assert ledger.snapshot("bad").steps == 0


# -- round trips and processes ----------------------------------------------------------


def test_one_round_trip_to_reserve_and_one_to_commit(redis_url: str, redis_prefix: str) -> None:
    counting = CountingRedis.from_url(redis_url)
    ledger = RedisLedger(counting, key_prefix=redis_prefix)
    path = [Level("rt", Limits())]
    pools = [lifetime(f"p{i}", cost=100 * U) for i in range(3)]
    warm = ledger.reserve(path, U, 0, pools=pools)  # loads scripts, checks persistence
    assert isinstance(warm, Reservation)
    ledger.commit(path, warm, U, 0)
    counting.commands.clear()
    got = ledger.reserve(path, U, 0, pools=pools)
    assert isinstance(got, Reservation)
    ledger.commit(path, got, U, 0)
    assert counting.commands == ["EVALSHA", "EVALSHA"]
    ledger.close()
    counting.close()


def _spawn(make_args: Callable[[ForkServerContext], list[tuple[Any, ...]]]) -> list[int]:
    ctx = workers.process_context()
    results: Any = ctx.Queue()
    arguments = make_args(ctx)
    processes = [
        ctx.Process(target=workers.run_body, args=(results, i, _pool_workers.pool_calls, *args))
        for i, args in enumerate(arguments)
    ]
    for process in processes:
        process.start()
    found: dict[int, int] = {}
    try:
        while len(found) < len(processes):
            try:
                index, result = results.get(timeout=120)
            except queue.Empty:
                pytest.fail("workers did not finish within 120s")
            if isinstance(result, str):
                pytest.fail(f"worker {index} failed:\n{result}")
            found[index] = result
    finally:
        for process in processes:
            process.join(timeout=15)
            if process.is_alive():
                process.kill()
                process.join()
    del arguments
    return [found[i] for i in range(len(processes))]


def test_four_processes_share_one_pool_exactly(
    redis_url: str, redis_prefix: str, open_ledger: Callable[..., RedisLedger]
) -> None:
    """4 processes, each its own chain, 20 calls of $0.003 under a $0.05 pool: 16 run."""
    pool = PoolLevel("tenant:shared", Limits(cost_nano=50 * U), window_s=3600.0)

    def make_args(ctx: ForkServerContext) -> list[tuple[Any, ...]]:
        start = ctx.Barrier(4)
        return [(redis_url, redis_prefix, f"proc{i}", 20, 3 * U, pool, start) for i in range(4)]

    ran = _spawn(make_args)
    assert sum(ran) == 16
    ledger = open_ledger()
    snap = ledger.pool_snapshot(pool)
    assert (_nano(snap.cost_usd), snap.steps, _nano(snap.reserved_cost_usd)) == (48 * U, 16, 0)
    assert sum(ledger.snapshot(f"proc{i}").steps for i in range(4)) == 16


def test_cluster_chain_on_another_node_than_the_pools(
    redis_cluster: RedisClusterProcess, open_ledger: Callable[..., RedisLedger]
) -> None:
    """The two phases really span two nodes: each node holds only its own keys."""
    ledger = open_ledger(redis_cluster.url)
    pool_key = ledger._pools.key("p")
    pool_node = next(i for i in range(3) if key_slot(pool_key.encode()) in redis_cluster.slots(i))
    chain = next(
        f"n{i}"
        for i in itertools.count()
        if key_slot(ledger.key(f"n{i}").encode()) not in redis_cluster.slots(pool_node)
    )
    path = [Level(chain, Limits(cost_nano=10 * U))]
    got = ledger.reserve(path, 2 * U, 0, pools=[lifetime("p", cost=3 * U)])
    assert isinstance(got, Reservation)
    assert holder(redis_cluster, pool_key) == pool_node
    assert holder(redis_cluster, ledger.key(chain)) != pool_node
    ledger.commit(path, got, 2 * U, 0)
    assert _nano(ledger.pool_snapshot(lifetime("p")).cost_usd) == 2 * U


# -- store down, hot reload, CLI usage ------------------------------------------------


def test_a_commit_queued_while_the_store_is_down_settles_the_pools_once(
    restartable_redis: Any, redis_prefix: str
) -> None:
    ledger = RedisLedger.from_url(restartable_redis.url, key_prefix=redis_prefix)
    pool = windowed("p", cost=10 * U)
    path = [Level("down", Limits())]
    got = ledger.reserve(path, 3 * U, 0, pools=[pool])
    assert isinstance(got, Reservation)
    restartable_redis.stop()
    ledger.commit(path, got, 2 * U, 0)  # never raises into the call that ran
    assert ledger.pending == 1  # one joined operation: chain and pools together
    restartable_redis.start()
    assert ledger.flush() == 0
    ledger.commit(path, got, 2 * U, 0)  # a replay of the same commit: counted once
    snap = ledger.pool_snapshot(pool)
    assert (_nano(snap.cost_usd), snap.steps, _nano(snap.reserved_cost_usd)) == (2 * U, 1, 0)
    assert ledger.snapshot("down").cost_nano == 2 * U
    _close(ledger)


def test_a_changed_window_keeps_what_was_spent(store: Store) -> None:
    """Hot reload of a pool's window: spend already made is never dropped by it."""
    ledger = store.ledger
    path = [Level(store.chain("r"), Limits())]
    hourly = PoolLevel("p", Limits(cost_nano=5 * U), window_s=3600.0)
    got = ledger.reserve(path, 4 * U, 0, pools=[hourly])
    assert isinstance(got, Reservation)
    ledger.commit(path, got, 4 * U, 0)
    daily = PoolLevel("p", Limits(cost_nano=5 * U), window_s=86400.0)
    denied = ledger.reserve(path, 2 * U, 0, pools=[daily])
    assert not isinstance(denied, Reservation) and denied.pool == "p"
    snap = ledger.pool_snapshot(daily)
    assert (_nano(snap.cost_usd), snap.window_s) == (4 * U, 86400.0)
    forever = PoolLevel("p", Limits(cost_nano=5 * U))
    assert not isinstance(ledger.reserve(path, 2 * U, 0, pools=[forever]), Reservation)
    assert _nano(ledger.pool_snapshot(forever).cost_usd) == 4 * U


def test_the_cli_needs_a_store(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.delenv("VERONICA_REDIS_URL", raising=False)
    assert main(["pools"]) == 2
    assert "VERONICA_REDIS_URL" in capsys.readouterr().err


def test_the_cli_says_when_there_are_no_pools(
    redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("VERONICA_REDIS_PREFIX", redis_prefix)
    assert main(["pools", "--redis", redis_url]) == 0
    assert "no pools" in capsys.readouterr().out


def test_a_lost_pool_that_denies_says_it_was_reseeded(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = store.ledger
    pool = windowed("p", cost=3 * U)
    path = [Level(store.chain("m"), Limits())]
    got = ledger.reserve(path, 2 * U, 0, pools=[pool])
    assert isinstance(got, Reservation)
    ledger.commit(path, got, 2 * U, 0)
    ledger.client.delete(store.pool_key("p"))
    with caplog.at_level(logging.WARNING, "veronica_otel.distributed"):
        denied = ledger.reserve(path, 2 * U, 0, pools=[pool])
    assert not isinstance(denied, Reservation) and denied.pool == "p"
    assert denied.retry_after_s is not None  # the re-seeded spend leaves with the window
    assert "re-seeded" in caplog.text


def test_threads_on_their_own_chains_share_one_pool_exactly(store: Store) -> None:
    """8 threads x 10 calls, each its own chain (a cluster: off the pools' node): 25 run."""
    ledger = store.ledger
    pool = PoolLevel("steps", Limits(steps=25), window_s=3600.0)
    start = threading.Barrier(8)
    ran = [0] * 8

    def body(index: int) -> None:
        path = [Level(store.chain(f"t{index}x"), Limits())]
        start.wait(timeout=30)
        for _ in range(10):
            got = ledger.reserve(path, U, 0, pools=[pool])
            if isinstance(got, Reservation):
                ran[index] += 1
                ledger.commit(path, got, U, 0)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sum(ran) == 25
    snap = ledger.pool_snapshot(pool)
    assert (
        snap.steps,
        _nano(snap.cost_usd),
        snap.reserved_steps,
        _nano(snap.reserved_cost_usd),
    ) == (
        25,
        25 * U,
        0,
        0,
    )
    assert store.pool_records() == 0
