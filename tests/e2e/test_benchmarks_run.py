"""The benchmark scripts still run and print one JSON object (quick mode).

Speed is never asserted here (machines are noisy); only that each script
measures what it claims, with its baselines, in the same run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "benchmarks"


def run(script: str, *args: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, str(BENCH / script), "--quick", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result = json.loads(out.stdout)
    assert isinstance(result, dict)
    return result


def test_bench_overhead_measures_all_variants() -> None:
    result = run("bench_overhead.py")
    results = result["results"]
    assert isinstance(results, dict)
    assert {"bare", "ours_plain", "ours_hint", "veronica_core_plain", "veronica_core_hint"} <= set(
        results
    )
    assert "ours_plain_over_veronica_core_plain" in result["ratios"]  # type: ignore[operator]


@pytest.mark.parametrize("script", ["bench_instrumented.py", "bench_distributed.py"])
def test_bench_scripts_print_json(script: str) -> None:
    extra = ("--no-child",) if script == "bench_instrumented.py" else ()
    result = run(script, *extra)
    assert result  # one JSON object with its parameters and results
