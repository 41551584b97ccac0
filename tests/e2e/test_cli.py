"""The ``veronica-otel`` command line, run as users run it: a subprocess.

(The demo's table is checked in ``test_cli_errors``, on the one demo run it makes.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

CLI = Path(sys.executable).parent / "veronica-otel"


def cli(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VERONICA_")}
    environ.update(env)
    return subprocess.run(
        [str(CLI), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environ,
        check=False,
    )


def alive(pid: int) -> bool:
    """Running (a zombie whose parent has not reaped it yet is not running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_help_for_each_command() -> None:
    assert cli("--help").returncode == 0
    for command in ("demo", "run", "override", "status", "pools", "graph"):
        result = cli(command, "--help")
        assert result.returncode == 0, result.stderr
        assert command in result.stdout


def test_no_command_is_a_usage_error() -> None:
    result = cli()
    assert result.returncode == 2
    assert "COMMAND" in result.stdout


def test_run_kills_the_whole_process_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open({str(pids)!r}, "w") as f:
            f.write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(600)
        """
    )
    result = cli("run", "--timeout", "1", "--grace", "1", "--", sys.executable, "-c", script)
    assert result.returncode == 3
    assert "deadline" in result.stderr
    parent, child = (int(p) for p in pids.read_text().split())
    assert not alive(parent)
    assert not alive(child)  # the grandchild went with its group


def test_run_passes_the_commands_status_through() -> None:
    result = cli("run", "--timeout", "30", "--", sys.executable, "-c", "raise SystemExit(7)")
    assert result.returncode == 7


def test_run_rejects_bad_durations() -> None:
    result = cli("run", "--timeout", "soon", "--", "true")
    assert result.returncode == 2
    assert "'soon' is not a duration" in result.stderr


def test_override_needs_the_shared_ledger() -> None:
    result = cli("override", "--chain", "c1", "--reason", "why", "--duration", "5m")
    assert result.returncode == 2
    assert "VERONICA_REDIS_URL" in result.stderr


def test_override_requires_a_reason() -> None:
    result = cli("override", "--chain", "c1", "--duration", "5m")
    assert result.returncode == 2
    assert "--reason" in result.stderr
