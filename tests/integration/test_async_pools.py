"""Pooled reservations from async code: the asyncio client, the same plan as the sync path.

Every test of ``store`` runs on one real Valkey (chain and pools in one
script) and on a real 3-node cluster with the chain on another node than the
pools (the two-phase protocol). The event loop must keep running while a
pooled round trip is in flight: a second task counts the loop's turns
during it (no clocks, no sleeps).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest
import redis
from redis.crc import key_slot

from tests.integration.test_async_store import cancel_in_flight
from tests.integration.test_redis_pools import Store, U, _close, lifetime, open_store
from veronica_otel import LocalLedger
from veronica_otel._errors import TripEvent
from veronica_otel._ledger import Level, Limits, PoolSnapshot, Reservation
from veronica_otel._units import usd_to_nano as _nano
from veronica_otel.distributed import RedisLedger
from veronica_otel.testing import RedisClusterProcess

T = TypeVar("T")


@pytest.fixture(params=["server", "cluster"])
def store(request: pytest.FixtureRequest, redis_prefix: str) -> Iterator[Store]:
    yield from open_store(request, redis_prefix)


async def turns_during(operation: Awaitable[T]) -> tuple[T, int]:
    """``operation``'s result, and how many times another task ran while it was awaited."""
    in_flight, turns, done = False, 0, False

    async def other_task() -> None:
        nonlocal turns
        while not done:
            turns += in_flight
            await asyncio.sleep(0)

    ticker = asyncio.create_task(other_task())
    await asyncio.sleep(0)  # the ticker has started
    in_flight = True
    try:
        result = await operation
    finally:
        in_flight, done = False, True
    await ticker
    return result, turns


def run(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(make())


def test_async_pooled_calls_settle_the_chain_and_every_pool(store: Store) -> None:
    ledger = store.ledger
    path = [Level(store.chain("a"), Limits(cost_nano=10 * U, steps=5))]
    pools = [lifetime("p1", cost=10 * U), lifetime("p2", steps=5)]

    async def calls() -> list[PoolSnapshot]:
        kept = await ledger.areserve(path, 3 * U, 40, pools=pools)
        dropped = await ledger.areserve(path, 2 * U, 10, pools=pools)
        assert isinstance(kept, Reservation) and isinstance(dropped, Reservation)
        assert _nano(ledger.pool_snapshot(pools[0]).reserved_cost_usd) == 5 * U
        assert await ledger.acommit(path, kept, 2 * U, 30) is None
        await ledger.arelease(path, dropped)
        # Reserved nothing (no step, no amount), committed anyway: counted once each.
        for _ in range(2):
            empty = await ledger.areserve(path, 0, 0, step=False, pools=pools)
            assert isinstance(empty, Reservation) and not empty.id
            await ledger.acommit(path, empty, U, 1)
        return [await ledger.apool_snapshot(pool) for pool in pools]

    read_async = run(calls)
    assert read_async == [ledger.pool_snapshot(pool) for pool in pools]
    chain = ledger.snapshot(path[0].chain_id)
    assert (chain.cost_nano, chain.tokens, chain.steps, chain.reserved_nano) == (4 * U, 32, 1, 0)
    first, second = (ledger.pool_snapshot(pool) for pool in pools)
    assert (_nano(first.cost_usd), first.tokens, first.steps) == (4 * U, 32, 1)
    assert (_nano(first.reserved_cost_usd), first.reserved_steps, second.reserved_steps) == (
        0,
        0,
        0,
    )
    assert second.steps == 1
    assert store.pool_records() == 0
    assert ledger.async_clients == 0  # closed with its loop


def test_async_pooled_denials_report_the_chains_own_first(store: Store) -> None:
    """As the sync path and LocalLedger: the chain's trip first (stored at once),
    and a chain denial after the pools held the call gives the pools back."""
    ledger = store.ledger
    tripping = [Level(store.chain("t"), Limits(cost_nano=U))]
    denying = [Level(store.chain("d"), Limits(cost_nano=U))]
    full, roomy = lifetime("full", cost=U), lifetime("roomy", cost=100 * U)

    async def calls() -> tuple[Any, Any]:
        both = await ledger.areserve(tripping, 2 * U, 0, pools=[full])
        chain_only = await ledger.areserve(denying, 2 * U, 0, pools=[roomy])
        return both, chain_only

    both, chain_only = run(calls)
    local = LocalLedger().reserve(tripping, 2 * U, 0, pools=[full])
    assert isinstance(both, TripEvent) and isinstance(local, TripEvent)
    assert (both.pool, both.reason, both.sticky, both.chain_id) == (
        local.pool,
        local.reason,
        local.sticky,
        local.chain_id,
    )
    assert both.pool is None
    trip = ledger.snapshot(tripping[0].chain_id).trip
    assert trip is not None and trip.reason == "cost"
    assert isinstance(chain_only, TripEvent) and chain_only.pool is None
    snap = ledger.pool_snapshot(roomy)
    assert (_nano(snap.reserved_cost_usd), _nano(snap.cost_usd)) == (0, 0)
    assert store.pool_records() == 0


def test_the_loop_runs_while_a_pooled_round_trip_is_in_flight(store: Store) -> None:
    ledger = store.ledger
    path = [Level(store.chain("l"), Limits())]
    pools = [lifetime("loop", cost=100 * U)]

    async def calls() -> list[int]:
        warm = await ledger.areserve(path, U, 0, pools=pools)  # loads the scripts
        assert isinstance(warm, Reservation)
        await ledger.acommit(path, warm, U, 0)
        held, reserving = await turns_during(ledger.areserve(path, U, 0, pools=pools))
        assert isinstance(held, Reservation)
        _, committing = await turns_during(ledger.acommit(path, held, U, 0))
        again = await ledger.areserve(path, U, 0, pools=pools)
        assert isinstance(again, Reservation)
        _, releasing = await turns_during(ledger.arelease(path, again))
        return [reserving, committing, releasing]

    turns = run(calls)
    # A blocking round trip would let no other task run while it lasts.
    assert all(n > 0 for n in turns), turns
    snap = ledger.pool_snapshot(pools[0])
    assert (_nano(snap.cost_usd), _nano(snap.reserved_cost_usd)) == (2 * U, 0)


@pytest.fixture
def paused_ledger(redis_url: str, redis_prefix: str) -> Iterator[RedisLedger]:
    # Replies may wait out the pause (a busy machine): never a timeout here.
    ledger = RedisLedger.from_url(redis_url, key_prefix=redis_prefix, socket_timeout=15.0)
    yield ledger
    _close(ledger)


@pytest.mark.asyncio
async def test_a_pooled_reserve_cancelled_in_flight_leaks_nothing(
    paused_ledger: RedisLedger, redis_url: str
) -> None:
    ledger = paused_ledger
    path = [Level("cancelled", Limits())]
    pools = [lifetime("cancel", cost=100 * U, steps=10)]
    warm = await ledger.areserve(path, U, 0, pools=pools)
    assert isinstance(warm, Reservation)
    await ledger.arelease(path, warm)
    admin = redis.Redis.from_url(redis_url)
    admin.execute_command("CLIENT", "PAUSE", "10000", "WRITE")
    try:
        task = asyncio.create_task(ledger.areserve(path, 5 * U, 0, pools=pools))
        await cancel_in_flight(task, redis_url)  # the pooled reserve's reply not back
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ledger.pending == 1  # the joined release of its id, queued at once
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
        admin.close()
    assert await ledger.aflush() == 0
    snap = ledger.pool_snapshot(pools[0])
    assert (_nano(snap.reserved_cost_usd), snap.reserved_steps, _nano(snap.cost_usd)) == (0, 0, 0)
    state = ledger.snapshot("cancelled")
    assert (state.reserved_nano, state.cost_nano) == (0, 0)


@pytest.mark.asyncio
async def test_a_pooled_commit_cancelled_on_a_cluster_still_settles_every_pool(
    redis_cluster: RedisClusterProcess, redis_prefix: str
) -> None:
    """Two-phase settlement: the chain's commit is cancelled in flight (its node
    paused); the pools' commit, not yet sent, is queued with it, so both count once."""
    ledger = RedisLedger.from_url(redis_cluster.url, key_prefix=redis_prefix, socket_timeout=15.0)
    pool_slot = key_slot(ledger._pools.key("any").encode())
    node = next(i for i in range(3) if pool_slot not in redis_cluster.slots(i))
    chain = next(
        f"c{i}"
        for i in itertools.count()
        if key_slot(ledger.key(f"c{i}").encode()) in redis_cluster.slots(node)
    )
    path = [Level(chain, Limits())]
    pool = lifetime("cancel-commit", cost=100 * U)
    url = f"redis://127.0.0.1:{redis_cluster.ports[node]}"
    try:
        held = await ledger.areserve(path, 5 * U, 0, pools=[pool])
        assert isinstance(held, Reservation)
        admin = redis.Redis.from_url(url)
        admin.execute_command("CLIENT", "PAUSE", "10000", "WRITE")
        try:
            task = asyncio.create_task(ledger.acommit(path, held, 3 * U, 0))
            await cancel_in_flight(task, url)
            with pytest.raises(asyncio.CancelledError):
                await task
            assert ledger.pending == 2  # the chain's commit and the pools'
        finally:
            admin.execute_command("CLIENT", "UNPAUSE")
            admin.close()
        assert await ledger.aflush() == 0
        snap = ledger.pool_snapshot(pool)
        assert (_nano(snap.cost_usd), _nano(snap.reserved_cost_usd)) == (3 * U, 0)
        state = ledger.snapshot(chain)
        assert (state.cost_nano, state.reserved_nano) == (3 * U, 0)
    finally:
        _close(ledger)
