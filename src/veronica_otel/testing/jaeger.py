"""Jaeger v2, built from source once and run on loopback, for tests and the example.

Jaeger v2 is an OpenTelemetry Collector distribution: OTLP in (gRPC and
HTTP), traces kept in memory, a query API out (``/api/v3/traces``,
``/api/traces``). Its module builds with the Go toolchain alone, so no
Docker is needed.

- :func:`jaeger_binary` builds ``github.com/jaegertracing/jaeger/cmd/jaeger``
  at :data:`JAEGER_VERSION` once into ``~/.cache/veronica-otel-jaeger/<version>/jaeger``
  (``VERONICA_JAEGER_CACHE`` moves the cache; ``VERONICA_JAEGER_BINARY`` names
  a binary to use instead), under a file lock so parallel test processes
  build it once. It needs ``go`` on ``PATH`` (or ``/usr/local/go/bin/go``)
  and the Go module proxy; :class:`JaegerUnavailable` says when there is none.
- :class:`JaegerProcess` starts it with in-memory storage on free loopback
  ports and waits for its health endpoint; with ``forward_to`` the same
  binary runs as a plain Collector (OTLP in, OTLP/gRPC out, nothing stored).

Usage::

    from veronica_otel.testing.jaeger import JaegerProcess

    with JaegerProcess() as jaeger:
        # OTEL_EXPORTER_OTLP_ENDPOINT=jaeger.otlp_http_url (or otlp_grpc_url)
        spans = jaeger.query.trace(trace_id)

From a shell (the example's way without Docker)::

    python -m veronica_otel.testing.jaeger build      # prints the binary's path
    python -m veronica_otel.testing.jaeger run        # 4317, 4318, 16686 until Ctrl-C

The binary has no UI assets (the module ships a placeholder page): read
traces through the query API or ``veronica-otel graph --jaeger``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING

from ._redis import _free_port

if TYPE_CHECKING:
    from veronica_otel.exporters.jaeger_query import JaegerQuery

__all__ = [
    "JAEGER_MODULE",
    "JAEGER_VERSION",
    "JaegerProcess",
    "JaegerUnavailable",
    "find_go",
    "jaeger_binary",
    "jaeger_cache",
    "main",
]

JAEGER_MODULE = "github.com/jaegertracing/jaeger"
# Jaeger v2.12.0 (its Go module is versioned v1.x). v1.76.0 (v2.13.0) is
# served by the proxy but not an approved release on these machines.
JAEGER_VERSION = "v1.75.0"
ENV_CACHE = "VERONICA_JAEGER_CACHE"
ENV_BINARY = "VERONICA_JAEGER_BINARY"
_BUILD_TIMEOUT_S = 3600.0
_START_TIMEOUT_S = 60.0
_LOG_TAIL = 40
_STOP_WAIT_S = 2.0


class JaegerUnavailable(RuntimeError):
    """No Jaeger binary can be had here (no Go toolchain, or the build failed)."""


def find_go() -> str | None:
    """The ``go`` command: on ``PATH``, else the standard ``/usr/local/go/bin/go``."""
    found = shutil.which("go")
    if found:
        return found
    standard = Path("/usr/local/go/bin/go")
    return str(standard) if os.access(standard, os.X_OK) else None


def jaeger_cache(version: str = JAEGER_VERSION) -> Path:
    """Where the binary of ``version`` is (or will be) kept."""
    root = os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "veronica-otel-jaeger"
    return Path(root) / version


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def jaeger_binary(
    version: str = JAEGER_VERSION, *, build: bool = True, progress: IO[str] | None = None
) -> Path:
    """The Jaeger binary of ``version``, built into the cache on first use.

    Raises:
        JaegerUnavailable: not built and ``build`` is false, no Go toolchain, or
            the build failed (with the Go command's last lines).
    """
    named = os.environ.get(ENV_BINARY)
    if named:
        if not os.access(named, os.X_OK):
            raise JaegerUnavailable(f"{ENV_BINARY}={named} is not an executable file")
        return Path(named)
    target = jaeger_cache(version) / "jaeger"
    if target.is_file():
        return target
    if not build:
        raise JaegerUnavailable(f"Jaeger {version} is not built yet ({target})")
    go = find_go()
    if go is None:
        raise JaegerUnavailable("no Go toolchain (go on PATH or /usr/local/go/bin/go)")
    with _locked(target.with_name(".lock")):
        if not target.is_file():  # another process may have built it while we waited
            _build(go, version, target, progress)
    return target


def _build(go: str, version: str, target: Path, progress: IO[str] | None) -> None:
    started = time.monotonic()
    if progress is not None:
        print(f"building Jaeger {version} into {target} (once) ...", file=progress, flush=True)
    package = f"{JAEGER_MODULE}/cmd/jaeger"
    ldflags = f"-s -w -X {JAEGER_MODULE}/internal/version.latestVersion={version}"
    partial = target.with_name(f".jaeger.{os.getpid()}.tmp")
    with tempfile.TemporaryDirectory(prefix="veronica-jaeger-build-") as module:
        steps = (
            [go, "mod", "init", "veronica-otel-jaeger-build"],
            [go, "get", "-tool", f"{package}@{version}"],
            [go, "build", "-trimpath", f"-ldflags={ldflags}", "-o", str(partial), package],
        )
        env = {**os.environ, "GOFLAGS": "-mod=mod"}
        for step in steps:
            try:
                subprocess.run(
                    step,
                    cwd=module,
                    env=env,
                    check=True,
                    capture_output=True,
                    text=True,
                    timeout=_BUILD_TIMEOUT_S,
                )
            except subprocess.CalledProcessError as exc:
                partial.unlink(missing_ok=True)
                tail = (exc.stderr or exc.stdout or "").strip().splitlines()[-5:]
                raise JaegerUnavailable(f"{' '.join(step)} failed: {' | '.join(tail)}") from exc
            except subprocess.TimeoutExpired as exc:
                partial.unlink(missing_ok=True)
                raise JaegerUnavailable(f"{' '.join(step)} timed out") from exc
    os.replace(partial, target)
    if progress is not None:
        print(f"built {target} in {time.monotonic() - started:.0f}s", file=progress, flush=True)


def _config(ports: dict[str, int], host: str, forward_to: str | None) -> str:
    """The Collector configuration: all-in-one in memory, or a plain forwarder."""

    def at(name: str) -> str:
        return f'"{host}:{ports[name]}"'

    receivers = f"""
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: {at("otlp_grpc")}
      http:
        endpoint: {at("otlp_http")}
processors:
  batch:
    timeout: 100ms
"""
    health = f"""
  healthcheckv2:
    use_v2: true
    http:
      endpoint: {at("health")}
"""
    # Its own metrics would listen on :8888 in every instance: off.
    telemetry = """
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
"""
    if forward_to is not None:
        return f"""{receivers}
exporters:
  otlp:
    endpoint: "{forward_to}"
    tls:
      insecure: true
extensions:{health}
service:
  extensions: [healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [otlp]{telemetry}"""
    return f"""{receivers}
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
extensions:{health}
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: {at("query")}
    grpc:
      endpoint: {at("query_grpc")}
service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]{telemetry}"""


class JaegerProcess:
    """One Jaeger v2 process on loopback: all-in-one with in-memory storage.

    Args:
        binary: The executable (:func:`jaeger_binary` when omitted: built on first use).
        forward_to: ``host:port`` of an OTLP/gRPC receiver: run as a plain
            Collector that forwards everything there and stores nothing.
        ports: Fixed ports by name (``otlp_grpc``, ``otlp_http``, ``query``,
            ``query_grpc``, ``health``); the others are free ones.
        host: Interface to listen on (``127.0.0.1``).
    """

    def __init__(
        self,
        binary: str | os.PathLike[str] | None = None,
        *,
        forward_to: str | None = None,
        ports: dict[str, int] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.binary = Path(binary) if binary is not None else jaeger_binary()
        self.forward_to = forward_to
        self.host = host
        names = ["otlp_grpc", "otlp_http", "health"]
        if forward_to is None:
            names += ["query", "query_grpc"]
        fixed = ports or {}
        self.ports = {name: fixed.get(name) or _free_port() for name in names}
        self._dir = tempfile.TemporaryDirectory(prefix="veronica-jaeger-")
        self._log_path = Path(self._dir.name) / "jaeger.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def otlp_http_url(self) -> str:
        """``OTEL_EXPORTER_OTLP_ENDPOINT`` for ``http/protobuf``."""
        return f"http://{self.host}:{self.ports['otlp_http']}"

    @property
    def otlp_grpc_url(self) -> str:
        """``OTEL_EXPORTER_OTLP_ENDPOINT`` for ``grpc``."""
        return f"http://{self.host}:{self.ports['otlp_grpc']}"

    @property
    def otlp_grpc_address(self) -> str:
        """``host:port`` of the OTLP/gRPC receiver (a forwarder's ``forward_to``)."""
        return f"{self.host}:{self.ports['otlp_grpc']}"

    @property
    def query_url(self) -> str:
        """The query service (API and UI placeholder); not for a forwarder."""
        if "query" not in self.ports:
            raise AttributeError("a forwarding Collector has no query service")
        return f"http://{self.host}:{self.ports['query']}"

    @property
    def query(self) -> JaegerQuery:
        """A client of this Jaeger's query API (needs the OpenTelemetry SDK)."""
        from veronica_otel.exporters.jaeger_query import JaegerQuery

        return JaegerQuery(self.query_url)

    def log(self) -> str:
        """What the process wrote so far (its last lines)."""
        try:
            lines = self._log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-_LOG_TAIL:])

    def start(self) -> JaegerProcess:
        """Start the process and wait for its health endpoint (raises on failure)."""
        config = Path(self._dir.name) / "config.yaml"
        config.write_text(_config(self.ports, self.host, self.forward_to))
        with self._log_path.open("wb") as log:
            self._process = subprocess.Popen(
                [str(self.binary), f"--config={config}"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        health = f"http://{self.host}:{self.ports['health']}/status"
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:  # bounded poll for start-up
            if self._process.poll() is not None:
                raise RuntimeError(f"Jaeger exited at start-up:\n{self.log()}")
            try:
                with urllib.request.urlopen(health, timeout=2) as reply:
                    if reply.status == 200:
                        return self
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"Jaeger was not healthy within {_START_TIMEOUT_S:g}s")
            time.sleep(0.05)

    def poll(self) -> int | None:
        """The exit status once the process ended, else None (also before start)."""
        return None if self._process is None else self._process.poll()

    def stop(self) -> None:
        """Stop the process (its in-memory traces go with it)."""
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            # Its graceful stop can wait ~10 s on a gRPC peer that came and went;
            # the traces are in memory, so there is nothing to save by waiting.
            process.wait(timeout=_STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def __enter__(self) -> JaegerProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        self._dir.cleanup()


# -- command line ------------------------------------------------------------

_STANDARD_PORTS = {"otlp_grpc": 4317, "otlp_http": 4318, "query": 16686, "query_grpc": 16685}


def main(argv: Sequence[str] | None = None) -> int:
    """``build`` (print the binary's path) or ``run`` (standard ports, until Ctrl-C)."""
    parser = argparse.ArgumentParser(
        prog="python -m veronica_otel.testing.jaeger",
        description=f"Build Jaeger {JAEGER_VERSION} from source once, or run it in memory.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build the binary into the cache (once) and print its path")
    run = sub.add_parser("run", help="run Jaeger with in-memory storage until Ctrl-C")
    run.add_argument("--host", default="127.0.0.1", help="interface to listen on (127.0.0.1)")
    args = parser.parse_args(argv)
    try:
        binary = jaeger_binary(progress=sys.stderr)
    except JaegerUnavailable as exc:
        print(f"jaeger: {exc}", file=sys.stderr)
        return 1
    if args.command == "build":
        print(binary)
        return 0
    jaeger = JaegerProcess(binary, ports={**_STANDARD_PORTS, "health": 13133}, host=args.host)
    with jaeger:
        print(
            f"Jaeger {JAEGER_VERSION} in memory:\n"
            f"  OTLP/HTTP  {jaeger.otlp_http_url}   (OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf)\n"
            f"  OTLP/gRPC  {jaeger.otlp_grpc_url}   (OTEL_EXPORTER_OTLP_PROTOCOL=grpc)\n"
            f"  query API  {jaeger.query_url}/api/v3/traces\n"
            "Ctrl-C stops it (the traces go with it).",
            flush=True,
        )
        stop = False

        def _stop(signum: int, frame: object) -> None:
            nonlocal stop
            stop = True

        signal.signal(signal.SIGTERM, _stop)
        try:
            while not stop and jaeger.poll() is None:
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
        if not stop and jaeger.poll() is not None:
            print(f"Jaeger exited:\n{jaeger.log()}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
