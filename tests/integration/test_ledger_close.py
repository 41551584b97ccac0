"""RedisLedger.close() closes the client it made, never one it was given.

Real Valkey and a real Redis Cluster. A socket left open is later reported by
the garbage collector as a ResourceWarning in whatever test runs then (under
``filterwarnings = error`` it fails that test), so these tests look at the
client's connections themselves, right after ``close()``.
"""

from __future__ import annotations

from typing import Any

import redis

from veronica_otel import ExecutionConfig, ExecutionContext, WrapOptions
from veronica_otel.distributed import RedisLedger
from veronica_otel.testing import RedisClusterProcess

HINT = WrapOptions(cost_estimate_hint=0.1)


def _one_call(ledger: RedisLedger) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=5), ledger=ledger) as ctx:
        ctx.wrap_llm_call(lambda: None, HINT)
    assert ledger.snapshot(ctx.chain_id).steps == 1


def _open_sockets(pools: list[Any]) -> int:
    conns = [c for pool in pools for c in (*pool._available_connections, *pool._in_use_connections)]
    return sum(conn._sock is not None for conn in conns)


def test_close_closes_every_node_connection_of_a_cluster_it_made(
    redis_cluster: RedisClusterProcess, redis_prefix: str
) -> None:
    ledger = RedisLedger.from_url(redis_cluster.url, key_prefix=redis_prefix)
    _one_call(ledger)  # its SCRIPT LOADs reach every node
    manager = ledger.client.redis_cluster.nodes_manager  # type: ignore[attr-defined]
    nodes = [*manager.nodes_cache.values(), *manager.startup_nodes.values()]
    pools = [node.redis_connection.connection_pool for node in nodes if node.redis_connection]
    assert _open_sockets(pools) > 0
    ledger.close()
    assert _open_sockets(pools) == 0  # from_url's node pools, left open by the cluster's close


def test_close_closes_a_server_client_it_made(redis_url: str, redis_prefix: str) -> None:
    ledger = RedisLedger.from_url(redis_url, key_prefix=redis_prefix)
    _one_call(ledger)
    pools = [ledger.client.connection_pool]
    assert _open_sockets(pools) > 0
    ledger.close()
    assert _open_sockets(pools) == 0


def test_close_leaves_a_client_it_was_given_open(redis_url: str, redis_prefix: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        ledger = RedisLedger(client, key_prefix=redis_prefix)
        _one_call(ledger)
        ledger.close()
        assert _open_sockets([client.connection_pool]) > 0  # still the caller's
        assert client.ping() is True
    finally:
        client.close()
