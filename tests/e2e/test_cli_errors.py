"""The first hour with ``veronica-otel``: real subprocesses with the venv's python.

A user's mistake is one line on stderr naming the problem and a non-zero exit,
never a traceback; hints work as printed; Ctrl-C on ``run`` escalates.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from veronica_otel import __version__

from .conftest import DemoRun
from .test_cli import alive

PYTHON = sys.executable
BIN = Path(sys.executable).parent
DEADLINE_S = 60.0


def _env(path: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERONICA_")}
    if path is not None:
        env["PATH"] = path
    return env


def cli(
    *args: str, path: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m veronica_otel.cli ARGS``, as a user without the script on PATH runs it."""
    return subprocess.run(
        [PYTHON, "-m", "veronica_otel.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(path),
        cwd=cwd,
        check=False,
    )


def one_line_error(result: subprocess.CompletedProcess[str], *names: str) -> str:
    """The single stderr line of a failed command, naming each of ``names``."""
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


# -- the basics ------------------------------------------------------------------------


def test_version_from_the_script_and_from_python_m() -> None:
    for command in ([str(BIN / "veronica-otel")], [PYTHON, "-m", "veronica_otel.cli"]):
        result = subprocess.run(
            [*command, "--version"], capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"veronica-otel {__version__}"


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (("bogus",), ("'bogus'", "--help")),
        (("run", "--timeout", "soon", "--", "true"), ("'soon' is not a duration",)),
        (("run", "--timeout", "5"), ("give a command after --",)),
        (("override", "--chain", "c1"), ("--reason", "--duration")),
        (("graph",), ("file",)),
        (("demo", "--unknown"), ("--unknown",)),
    ],
)
def test_usage_errors_are_one_line(args: tuple[str, ...], names: tuple[str, ...]) -> None:
    result = cli(*args)
    assert result.returncode == 2
    one_line_error(result, *names)


def test_a_command_that_cannot_run_is_one_line(tmp_path: Path) -> None:
    missing = cli("run", "--timeout", "5", "--", "/no/such/agent")
    assert missing.returncode == 127
    one_line_error(missing, "command not found", "/no/such/agent")
    text = tmp_path / "notes.txt"
    text.write_text("not a program", encoding="utf-8")
    not_executable = cli("run", "--timeout", "5", "--", str(text))
    assert not_executable.returncode == 126
    one_line_error(not_executable, "not executable", str(text))
    text.chmod(0o755)  # executable, but not a program the kernel can start
    not_a_program = cli("run", "--timeout", "5", "--", str(text))
    assert not_a_program.returncode == 126
    one_line_error(not_a_program, "cannot run", str(text))


# -- demo ----------------------------------------------------------------------------


def test_demo_without_the_openai_sdk_names_the_extra() -> None:
    # openai made unimportable the way Python documents: None in sys.modules.
    script = (
        "import sys; sys.modules['openai'] = None\n"
        "from veronica_otel.cli import main\n"
        "sys.exit(main(['demo']))"
    )
    result = subprocess.run(
        [PYTHON, "-c", script], capture_output=True, text=True, timeout=60, env=_env(), check=False
    )
    assert result.returncode == 1
    one_line_error(result, "openai SDK", "pip install 'veronica-otel[openai]'", "pip install -e")
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("out", "problem"),
    [("/dev/null/x", "Not a directory"), ("notes.txt", "notes.txt is not a directory")],
)
def test_demo_into_an_unwritable_folder_fails_before_running(
    out: str, problem: str, tmp_path: Path
) -> None:
    (tmp_path / "notes.txt").write_text("a file, not a folder", encoding="utf-8")
    result = cli("demo", "--out", out, cwd=tmp_path)
    assert result.returncode == 1
    one_line_error(result, out, problem)
    assert result.stdout == ""  # failed before any scenario ran


@pytest.fixture
def demo(demo_run: DemoRun) -> tuple[Path, str]:
    """The demo's folder and the command it printed to look at its graphs."""
    cwd, result = demo_run
    hint = re.search(r"^in a terminal: (.+)$", result.stdout, re.MULTILINE)
    assert hint is not None, result.stdout
    return cwd, hint.group(1)


def test_demo_prints_the_table_with_honest_counts(demo_run: DemoRun) -> None:
    result = demo_run[1]
    lines = result.stdout.splitlines()
    rows = [line for line in lines if "contained" in line]
    assert len(rows) >= 8
    retry = [line for line in rows if line.startswith("Retry amplification")]
    calls = [int(re.search(r"contained\s+(\d+)", line).group(1)) for line in retry]  # type: ignore[union-attr]
    assert calls == [64, 6]  # (1+3)^3 requests reached the server; contained: 1 + 5 retries
    assert "retries" in retry[1]
    for line in rows:
        if " contained " in line:
            assert "fewer calls" in line
    websocket = [line for line in rows if line.startswith("WebSocket")]
    assert "ws 1008" in websocket[1]
    # The session cut mid-stream leaves nothing for the event loop to complain
    # about at shutdown (an abandoned async stream did, on about half the runs).
    assert "asynchronous generator" not in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_the_demo_hint_runs_as_printed_without_the_script_on_path(
    demo: tuple[Path, str],
) -> None:
    cwd, hint = demo
    assert hint.startswith(str(BIN / "veronica-otel") + " graph graphs/")
    result = subprocess.run(
        ["/bin/sh", "-c", hint],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env("/usr/bin:/bin"),
        cwd=cwd,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "request" in result.stdout or "invoke_workflow" in result.stdout, result.stdout


def _runnable(path: str, cwd: Path | None = None) -> str:
    result = subprocess.run(
        [PYTHON, "-c", "from veronica_otel.cli import runnable_cli; print(runnable_cli())"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(path),
        cwd=cwd,
        check=True,
    )
    return result.stdout.strip()


def test_the_hint_is_the_bare_name_when_it_is_on_path(tmp_path: Path) -> None:
    assert _runnable(f"{BIN}:/usr/bin:/bin") == "veronica-otel"
    # From a folder the venv is not under: the absolute path.
    assert _runnable("/usr/bin:/bin", cwd=tmp_path) == str(BIN / "veronica-otel")
    assert _runnable("/usr/bin:/bin", cwd=BIN.parent) == "bin/veronica-otel"


# -- graph ---------------------------------------------------------------------------


def test_graph_html_into_a_missing_folder_creates_it(
    demo: tuple[Path, str], tmp_path: Path
) -> None:
    graph = next((demo[0] / "graphs").glob("*.json"))
    out = tmp_path / "new" / "deeper" / "view.html"
    result = cli("graph", str(graph), "--html", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_text(encoding="utf-8").lstrip().lower().startswith("<!doctype html")
    assert [p.name for p in out.parent.iterdir()] == ["view.html"]  # no temporary left
    # Readable as any file the user writes (umask 022: 0644), like the demo's.
    assert out.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_graph_mistakes_are_one_line(demo: tuple[Path, str], tmp_path: Path) -> None:
    graph = str(next((demo[0] / "graphs").glob("*.json")))
    not_json = tmp_path / "notes.txt"
    not_json.write_text("hello", encoding="utf-8")
    cases = [
        (("graph", str(tmp_path / "missing.json")), ("no such file", "missing.json")),
        (("graph", str(tmp_path)), ("cannot read", "Is a directory")),
        (("graph", str(not_json)), ("notes.txt is not a graph file",)),
        (("graph", graph, "--html", str(tmp_path)), ("is a directory", "graph.html")),
        (("graph", graph, "--html", "/dev/null/x.html"), ("/dev/null is not a directory",)),
    ]
    for args, names in cases:
        result = cli(*args)
        assert result.returncode == 1, args
        one_line_error(result, *names)


# -- run: Ctrl-C escalates ---------------------------------------------------------------

SUPERVISE = (PYTHON, "-m", "veronica_otel.cli", "run", "--timeout", "10m", "--")
STUBBORN = textwrap.dedent(
    """
    import signal, sys

    log = sys.argv[1]

    def note(signum, frame):  # note it, and keep running
        with open(log, "a") as f:
            f.write(signal.Signals(signum).name + "\\n")

    signal.signal(signal.SIGINT, note)
    signal.signal(signal.SIGTERM, note)
    with open(log, "a") as f:
        f.write("ready\\n")
    while True:
        signal.pause()
    """
)


def test_repeated_ctrl_c_escalates_to_sigterm_then_sigkill(tmp_path: Path) -> None:
    log = tmp_path / "signals"
    log.touch()
    supervisor = subprocess.Popen(
        [*SUPERVISE, PYTHON, "-c", STUBBORN, str(log)],
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:

        def seen() -> list[str]:
            return log.read_text().split()

        wait_for(lambda: seen() == ["ready"], "the agent to start")
        os.kill(supervisor.pid, signal.SIGINT)
        wait_for(lambda: seen() == ["ready", "SIGINT"], "SIGINT to reach the agent")
        os.kill(supervisor.pid, signal.SIGINT)
        wait_for(lambda: seen() == ["ready", "SIGINT", "SIGTERM"], "SIGTERM")
        assert supervisor.poll() is None  # the agent ignored both; still supervised
        os.kill(supervisor.pid, signal.SIGINT)
        _, stderr = supervisor.communicate(timeout=DEADLINE_S)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
    assert supervisor.returncode == 128 + signal.SIGKILL
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 3, stderr
    assert "interrupt: SIGINT sent to" in lines[0] and "again sends SIGTERM" in lines[0]
    assert lines[1].startswith("veronica-otel run: second interrupt: SIGTERM sent to")
    assert "again sends SIGKILL" in lines[1]
    assert lines[2].startswith("veronica-otel run: third interrupt: SIGKILL sent to")
    assert seen() == ["ready", "SIGINT", "SIGTERM"]


def test_one_ctrl_c_is_enough_for_an_agent_that_stops_on_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    agent = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    )
    supervisor = subprocess.Popen(
        [*SUPERVISE, PYTHON, "-c", agent],
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text() != "", "the agent to start")
        os.kill(supervisor.pid, signal.SIGINT)
        _, stderr = supervisor.communicate(timeout=DEADLINE_S)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
        if supervisor.stderr is not None:
            supervisor.stderr.close()  # else a timeout leaks the pipe into a later test
    # Python ends an uncaught KeyboardInterrupt by dying of SIGINT: passed on as 128 + 2.
    assert supervisor.returncode == 128 + signal.SIGINT
    assert not alive(int(pid_file.read_text()))
    assert "again sends SIGTERM" in stderr
