"""The test servers' own start-up: a port taken between picking and binding."""

from __future__ import annotations

import socket

import pytest

from veronica_otel.testing import RedisClusterProcess, RedisServerProcess, find_redis_server
from veronica_otel.testing._redis import command

pytestmark = pytest.mark.skipif(find_redis_server() is None, reason="no Redis/Valkey binary")


def _occupy(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def test_a_picked_port_taken_before_start_is_picked_again() -> None:
    server = RedisServerProcess(durable=False)
    taken = server.port
    with _occupy(taken):
        server.start()
        try:
            assert server.port != taken
            assert command(server.port, "PING") == "PONG"
        finally:
            server.stop()


def test_a_port_given_by_the_caller_is_never_changed() -> None:
    with _occupy(0) as sock:
        port = sock.getsockname()[1]
        server = RedisServerProcess(port=port, durable=False, startup_timeout=5.0)
        with pytest.raises(RuntimeError, match=str(port)):
            server.start()
        server.stop()
        assert server.port == port


def test_a_cluster_node_whose_bus_port_is_taken_moves_it() -> None:
    cluster = RedisClusterProcess(nodes=2)
    taken = cluster.bus_ports[1]
    with _occupy(taken), cluster:
        assert cluster.bus_ports[1] != taken
        assert "cluster_state:ok" in str(command(cluster.ports[0], "CLUSTER", "INFO"))
