"""examples/budget_pools.py runs as a user runs it, and its story holds."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).parents[2] / "examples" / "budget_pools.py"


def test_the_budget_pools_example_stops_alice_at_her_hour_and_bob_at_acmes_day() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 4, result.stdout
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
