"""The example scripts run as their docstrings say, and show containment working.

Each script runs once (its output cached) however many tests read it, and the
module's tests run on one pytest-xdist worker so that once holds there too.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parents[2] / "examples"


@functools.cache
def run(script: str) -> str:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout


def test_planner_critic_is_stopped_at_the_handoff_ceiling() -> None:
    out = run("planner_critic.py")
    assert "uncontained: 60 model calls" in out
    assert "contained:   9 model calls, then loop" in out


@pytest.mark.parametrize("script", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_every_example_runs(script: str) -> None:
    assert run(script).strip()


def test_the_quickstart_stops_the_loop_before_sending() -> None:
    out = run("quickstart.py")
    assert "denied before sending:" in out and "steps limit reached (limit 3" in out
    assert "requests the server received: 3\n" in out
