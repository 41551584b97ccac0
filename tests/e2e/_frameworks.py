"""Running a framework's runaway app in its own venv, under zero code.

The app is an unchanged script (``apps/frameworks/*_app.py``) run with the
venv's ``opentelemetry-instrument``; the model is the runaway fake server in
the test process, whose counts are the truth of what was sent. The app ends
with one ``RESULT {json}`` line (``apps/frameworks/_report.py``).

Importing a framework is most of what such a run costs (crewAI alone takes
about 4 CPU-seconds), and a framework's tests differ only in their limits and
scenario: :class:`FrameworkApp` starts the app once for a module and runs each
test's scenario in a process forked from it after the import, with that
test's ``VERONICA_*`` variables and a default chain built from them
(``apps/frameworks/_report.py``). Each scenario still ends with its process,
and the server is counted after that, as after a run of its own. The apps of
one venv can share that process (:meth:`FrameworkApp.hosting`,
``apps/frameworks/host.py``): what they all import (OpenTelemetry's start-up,
openai, pydantic) is then imported once, and each scenario still runs in a
child of its own with its app's framework imported as before.

A run still going :data:`DUMP_AFTER` seconds after it began writes every
thread's stack to its stderr and exits, before the test gives up on it at
:data:`TIMEOUT`: a hang fails saying where it stood.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import pytest

from tests import _venvs
from veronica_otel.testing import FakeLLMServer

APPS = Path(__file__).parent / "apps" / "frameworks"
TIMEOUT = 300  # generous: a loaded CI machine; a run takes a few CPU seconds
DUMP_AFTER = TIMEOUT - 60  # from the run's start, after its imports: before TIMEOUT ends
CompletedProcess = subprocess.CompletedProcess[str]


def framework_venv(name: str) -> Path:
    """The cached venv of recipe ``name`` in :mod:`tests._venvs` (built if missing)."""
    try:
        return _venvs.venv(name.lower(), getattr(_venvs, name))
    except subprocess.CalledProcessError as exc:  # say what pip said, do not hide it
        pytest.fail(f"building the {name} venv: {_venvs.build_error(exc)}")


class FrameworkApp:
    """``apps/frameworks/<app>`` started once under zero code, serving scenarios.

    ``env`` is the whole process's (a ``None`` value removes a variable).
    Use as a context manager; :meth:`run` runs one scenario, as a run of the
    app of its own would, in a process forked from this one after its imports.
    """

    def __init__(
        self, venv: Path, app: str, server: FakeLLMServer, *apps: str, **env: str | None
    ) -> None:
        self._command = _command(venv, app, *apps)
        self._environ = _environment(server, {**env, "FRAMEWORK_SCENARIOS": "1"})
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: IO[bytes] | None = None
        self._stderr_read = 0  # what earlier scenarios' results already carried
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> FrameworkApp:
        self._stderr = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            self._command,
            cwd=APPS,
            env=self._environ,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            start_new_session=True,  # its group: the app and the scenarios it forks
        )
        self._reader = threading.Thread(
            target=self._read, args=(self._process.stdout,), daemon=True
        )
        self._reader.start()
        return self

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
            self._lines.put(line)
        self._lines.put(None)

    @classmethod
    def hosting(
        cls, venv: Path, apps: tuple[str, ...], server: FakeLLMServer, **env: str | None
    ) -> FrameworkApp:
        """``apps`` (of ``venv``) in one process (``host.py``); :meth:`app` gives each one."""
        return cls(venv, "host.py", server, *apps, **env)

    def app(self, name: str) -> HostedApp:
        """App ``name`` of those :meth:`hosting` started, its scenarios run by ``.run``."""
        return HostedApp(self, name)

    def run(self, *args: str, **env: str | None) -> tuple[dict[str, Any], CompletedProcess]:
        """Scenario ``args[0]`` (the app's default without one) under ``env``, once."""
        return self._scenario({"scenario": args[0] if args else "", "env": env}, args)

    def _scenario(
        self, scenario: dict[str, Any], args: tuple[str, ...]
    ) -> tuple[dict[str, Any], CompletedProcess]:
        assert self._process is not None and self._process.stdin is not None
        assert self._stderr is not None
        try:
            self._process.stdin.write(json.dumps(scenario) + "\n")
            self._process.stdin.flush()
        except BrokenPipeError:
            pass  # the app is gone: said below, with its stderr
        out: list[str] = []
        status: int | None = None
        while status is None:
            try:
                line = self._lines.get(timeout=TIMEOUT)
            except queue.Empty:
                line = None
            if line is None:  # the app ended or hung: the RESULT check below says so
                self._lines.put(None)  # and the next scenario finds it ended too
                break
            if line.startswith("DONE "):
                status = os.waitstatus_to_exitcode(int(line.split()[1]))
            else:
                out.append(line)
        # This scenario's stderr (the app's start-up's too, the first time); pread
        # leaves the offset the app writes at (it shares the open file) alone.
        fd = self._stderr.fileno()
        end = os.fstat(fd).st_size
        stderr = os.pread(fd, end - self._stderr_read, self._stderr_read).decode(errors="replace")
        self._stderr_read = end
        done = CompletedProcess(self._command + list(args), status, "".join(out), stderr)
        return _result(done), done

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        process = self._process
        if process is not None:
            if process.stdin is not None:
                process.stdin.close()  # the app's loop ends at EOF
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:  # a scenario it waits for hangs
                self._kill_group()
                process.wait()
            # The reader ends at EOF, once no process holds the pipe: closing it
            # under the reader would raise in its thread, in some later test.
            if self._reader is not None:
                self._reader.join(timeout=30)
                if self._reader.is_alive():  # a scenario outlived the app
                    self._kill_group()
                    self._reader.join()
            if process.stdout is not None:
                process.stdout.close()
        if self._stderr is not None:
            self._stderr.close()

    def _kill_group(self) -> None:
        assert self._process is not None
        with contextlib.suppress(ProcessLookupError):  # every process of it has ended
            os.killpg(self._process.pid, signal.SIGKILL)


class HostedApp:
    """One app of a :meth:`FrameworkApp.hosting` process: :meth:`run` as ``FrameworkApp.run``."""

    def __init__(self, host: FrameworkApp, name: str) -> None:
        self._host, self._name = host, name

    def run(self, *args: str, **env: str | None) -> tuple[dict[str, Any], CompletedProcess]:
        scenario = {"app": self._name, "scenario": args[0] if args else "", "env": env}
        return self._host._scenario(scenario, args)


def _command(venv: Path, app: str, *args: str) -> list[str]:
    bin_ = venv / "bin"
    return [str(bin_ / "opentelemetry-instrument"), str(bin_ / "python"), app, *args]


def _environment(server: FakeLLMServer, env: dict[str, str | None]) -> dict[str, str]:
    environ = _venvs.environ_without("VERONICA_", "OTEL_", "OPENAI_", "ANTHROPIC_", "PYTHON")
    environ.update(
        OPENAI_BASE_URL=server.openai_base_url,
        OPENAI_API_BASE=server.openai_base_url,  # llama-index-llms-openai reads this one
        OPENAI_API_KEY="test-key",
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        FAKE_LLM_URL=server.base_url,
        FRAMEWORK_DUMP_AFTER_S=str(DUMP_AFTER),
        **_venvs.plain_http_tls(),
    )
    for name, value in env.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    return environ


def _result(done: CompletedProcess) -> dict[str, Any]:
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no RESULT line; exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


def agent_policy(folder: Path, name: str, max_steps: int) -> str:
    """A policy file limiting agent ``name`` alone, for ``VERONICA_POLICY_FILE``."""
    policy = folder / "policy.toml"
    policy.write_text(f'[agents."{name}"]\nmax_steps = {max_steps}\n')
    return str(policy)
