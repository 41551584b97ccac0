"""The benchmark scripts still run and print one JSON object (quick mode).

Speed is never asserted here (machines are noisy); only that each script
measures what it claims, with its baselines, in the same run.

Marked ``bench``: benchmarks are not part of the test command (one of them
runs Python under cachegrind for minutes). Run them with
``bash scripts/bench.sh`` (``pytest -m bench``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "benchmarks"
pytestmark = pytest.mark.bench


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


def test_bench_paper_runs_every_scenario_three_ways_with_exact_counts() -> None:
    result = run("bench_paper.py")
    scenarios = result["scenarios"]
    assert isinstance(scenarios, dict)
    assert set(scenarios) == {
        "retry_amplification",
        "recursive_tools",
        "multi_agent_loop",
        "websocket_runaway",
    }
    assert result["deterministic"] is True
    for scenario in scenarios.values():
        rows = scenario["results"]
        assert {"uncontained", "veronica_otel", "veronica_core"} <= set(rows)
        assert scenario["paper"]["uncontained"] and scenario["note"]
        for system in ("veronica_otel", "veronica_core"):
            assert rows[system]["calls"] < rows["uncontained"]["calls"]
            assert rows[system]["limit_to_halt_ms"] is not None
    # The workloads are the paper's sizes, counted at the fake server.
    assert scenarios["retry_amplification"]["results"]["uncontained"]["calls"] == 27
    assert scenarios["recursive_tools"]["results"]["uncontained"]["calls"] == 20
    assert scenarios["multi_agent_loop"]["results"]["uncontained"]["calls"] == 60
    assert scenarios["websocket_runaway"]["results"]["uncontained"]["ops"] == 100
    # Step limits hold exactly, never limit + 1.
    for system in ("veronica_otel", "veronica_core"):
        assert scenarios["recursive_tools"]["results"][system]["calls"] == 5
        assert scenarios["multi_agent_loop"]["results"][system]["calls"] == 8


def test_bench_scale_counts_every_section_exactly() -> None:
    result = run("bench_scale.py")
    results = result["results"]
    assert isinstance(results, dict)
    assert result["exact"] is True
    chains = results["chains"]
    assert chains["exact"] and chains["memory"]["tracemalloc_bytes_per_chain"] > 0
    assert chains["one_chain_checks_per_s"] and chains["veronica_core_memory"]
    threads = results["threads"]
    assert threads["threads"] == 16 and threads["exact"] and threads["limit"]["exact"]
    assert threads["one_thread_checks_per_s"]
    processes = results["processes"]
    assert processes["processes"] == 8 and processes["exact"] and processes["limit"]["exact"]
    assert processes["one_process_checks_per_s"]
    growth = results["growth"]
    assert len(growth["sizes"]) == 3
    for system in ("veronica_otel", "veronica_core"):
        assert growth[system]["last_over_first"] > 0


def test_bench_profile_names_top_frames_of_both_targets(tmp_path: Path) -> None:
    result = run("bench_profile.py", "--html", str(tmp_path / "profile.html"))
    targets = result["targets"]
    assert isinstance(targets, dict)
    assert set(targets) == {"wrap_llm_call", "openai_instrumented"}
    for target in targets.values():
        assert target["top"] and target["top_ours"]
        assert {"function", "where", "share_pct"} <= set(target["top"][0])
    html = result["html"]
    assert isinstance(html, dict)
    assert all(Path(path).stat().st_size > 0 for path in html.values())


def test_bench_instructions_counts_each_variant_or_says_why_not() -> None:
    result = run("bench_instructions.py")
    if shutil.which("valgrind") is None:
        assert "valgrind" in str(result["skipped"])
        return
    counts = result["openai"]["instructions_per_call"]  # type: ignore[index]
    # A real SDK call executes millions of instructions; observing and
    # enforcing each add some on top (counted, not timed: deterministic).
    assert counts["bare"] > 1_000_000
    assert counts["bare"] < counts["observe"] and counts["bare"] < counts["enforce"]
    assert result["openai"]["ratios"]["enforce_added_over_bare"] > 0  # type: ignore[index]


def test_bench_instructions_runs_every_adapter_variant_once() -> None:
    # Without valgrind: each adapter's bare and enforce call runs, its chain
    # counting exactly the calls its instrumentor contained.
    result = run("bench_instructions.py", "--adapters", "--dry-run")
    dry_run = result["dry_run"]
    assert isinstance(dry_run, dict)
    adapters = ("genai", "bedrock", "mistralai", "cohere", "ollama", "litellm")
    assert set(dry_run) == {f"{a}_{kind}" for a in adapters for kind in ("bare", "enforce")}
    assert all(outcome == "ok" for outcome in dry_run.values()), dry_run


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_bench_instructions_counts_an_adapter_over_its_bare_call() -> None:
    result = run("bench_instructions.py", "--adapters", "ollama")
    ollama = result["no_sdk"]["ollama"]  # type: ignore[index]
    counts = ollama["instructions_per_call"]
    assert counts["bare"] > 1_000_000
    assert abs(ollama["added_over_bare"]["enforce"] - (counts["enforce"] - counts["bare"])) <= 1
    assert ollama["ratios"]["over_bare"]["enforce"] > 1
    assert "met_over_bare" in ollama["targets"]
    # Each count is the median of its layouts' counts, each reported beside it.
    for kind, per_layout in ollama["per_layout"].items():
        assert len(per_layout) == len(result["parameters"]["layouts"]) == 3  # type: ignore[index]
        assert counts[kind] == sorted(per_layout)[1]


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_bench_wrap_instructions_counts_both_projects() -> None:
    result = run("bench_wrap_instructions.py", "--calls", "50")
    results = result["results"]
    assert isinstance(results, dict)
    assert set(results) == {"ours_plain", "ours_hint", "core_plain", "core_hint"}
    assert all(value is None or value > 0 for value in results.values())
