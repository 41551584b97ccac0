"""The example scripts run as their docstrings say, and show containment working.

Each script runs once however many tests read it (a module fixture; the
module's tests run on one pytest-xdist worker), as ``python SCRIPT``: from its
file as ``__main__``, in a process of its own forked from one that imported
what the examples import (:func:`tests.e2e._pasted.run_pasted`).
"""

from __future__ import annotations

import re
from pathlib import Path
from subprocess import CompletedProcess

import pytest

from tests.e2e._pasted import run_pasted

EXAMPLES = Path(__file__).parents[2] / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CompletedProcess[str]]:
    ran = run_pasted([EXAMPLES / name for name in SCRIPTS], tmp_path_factory.mktemp("examples"))
    return dict(zip(SCRIPTS, ran, strict=True))


def output(runs: dict[str, CompletedProcess[str]], script: str) -> str:
    """What ``script`` printed; it must have exited 0."""
    assert runs[script].returncode == 0, runs[script].stderr[-3000:]
    return runs[script].stdout


def test_planner_critic_is_stopped_at_the_handoff_ceiling(
    runs: dict[str, CompletedProcess[str]],
) -> None:
    out = output(runs, "planner_critic.py")
    assert "uncontained: 60 model calls" in out
    assert "contained:   9 model calls, then loop" in out


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_example_runs(runs: dict[str, CompletedProcess[str]], script: str) -> None:
    assert output(runs, script).strip()


def test_the_quickstart_stops_the_loop_before_sending(
    runs: dict[str, CompletedProcess[str]],
) -> None:
    out = output(runs, "quickstart.py")
    assert "denied before sending:" in out and "steps limit reached (limit 3" in out
    assert "requests the server received: 3\n" in out


def test_the_budget_pools_example_stops_alice_at_her_hour_and_bob_at_acmes_day(
    runs: dict[str, CompletedProcess[str]],
) -> None:
    lines = output(runs, "budget_pools.py").splitlines()
    assert len(lines) == 4, lines
    alice = re.fullmatch(
        r"alice: stopped by pool user:alice \(steps\); room again in (\d+) s", lines[0]
    )
    assert alice is not None and 3540 <= int(alice.group(1)) <= 3600
    bob = re.fullmatch(
        r"bob: stopped by pool tenant:acme \(cost\); room again in (\d+) s", lines[1]
    )
    assert bob is not None and 84_960 <= int(bob.group(1)) <= 86_400
    assert lines[2] == "calls sent: {'alice': 3, 'bob': 7} (the server saw 10)"
    spent = re.fullmatch(r"acme spent \$(0\.\d{4}) of \$0\.005 today", lines[3])
    assert spent is not None and 0.004 < float(spent.group(1)) <= 0.005
