"""The numbers the docs quote, from one file: ``docs/numbers.json``.

A number in README.md or a doc page is written between markers naming its
key, ``<!--n:demo.planner-critic.contained-->9<!--/n-->``: GitHub shows the
9 (comments are not rendered) and the site hook drops the markers. The file
is produced by running what the numbers describe (``measure``: the demo's
scenarios and ``benchmarks/bench_paper.py --quick``, counts that are the
same on every run), and ``tests/e2e/test_numbers.py`` checks both ways: the
file against a fresh measurement, every marked number against the file.

Usage (from the repository root)::

    python docs/_numbers.py --measure   # rewrite docs/numbers.json from fresh runs
    python docs/_numbers.py --write     # put its numbers into the marked text
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NUMBERS = ROOT / "docs" / "numbers.json"
MARKER = re.compile(r"<!--n:([\w.-]+)-->(.*?)<!--/n-->")
# Where marked numbers may be written (relative to the repository root).
TEXTS = ("README.md", "docs/**/*.md", "examples/**/README.md", "benchmarks/README.md")


def numbers() -> dict[str, float]:
    loaded: dict[str, float] = json.loads(NUMBERS.read_text(encoding="utf-8"))
    return loaded


def marked(text: str) -> list[tuple[str, str]]:
    """Every ``(key, number as written)`` marked in ``text``."""
    return MARKER.findall(text)


def render_numbers(text: str, table: dict[str, float] | None = None) -> str:
    """``text`` with each marked number taken from the table, markers dropped (the site)."""
    values = numbers() if table is None else table
    return MARKER.sub(lambda m: str(values[m.group(1)]), text)


def _refresh(text: str, values: dict[str, float]) -> str:
    return MARKER.sub(lambda m: f"<!--n:{m.group(1)}-->{values[m.group(1)]}<!--/n-->", text)


def text_files() -> list[Path]:
    return sorted({path for pattern in TEXTS for path in ROOT.glob(pattern)})


def measure_demo() -> dict[str, int]:
    """Requests the fake server received in each demo scenario, both ways."""
    from veronica_otel.cli._demo import run_demo
    from veronica_otel.cli._demo_scenarios import SCENARIOS

    rows = run_demo(out=io.StringIO(), progress=io.StringIO())
    keys = {scenario.title: scenario.key for scenario in SCENARIOS}
    return {f"demo.{keys[row.scenario]}.{row.mode}": row.calls for row in rows}


def measure_paper() -> dict[str, int]:
    """The paper scenarios' counts from ``bench_paper.py --quick`` (deterministic)."""
    result = subprocess.run(
        [sys.executable, "bench_paper.py", "--quick"],
        cwd=ROOT / "benchmarks",
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    report: dict[str, Any] = json.loads(result.stdout)
    found: dict[str, int] = {}
    for key, scenario in report["scenarios"].items():
        for system, run in scenario["results"].items():
            if isinstance(run, dict) and "calls" in run:
                found[f"paper.{key}.{system}.calls"] = run["calls"]
                if "ops" in run:
                    found[f"paper.{key}.{system}.ops"] = run["ops"]
    return found


RESULTS = ROOT / "benchmarks" / "results" / "instructions"


def recorded_overhead() -> dict[str, float]:
    """The instruction ratios the docs quote, read from the recorded runs in
    ``benchmarks/results/instructions/`` (cachegrind takes most of an hour
    here, so the tests read its output rather than run it)."""

    def load(name: str) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads((RESULTS / name).read_text(encoding="utf-8"))
        return loaded

    found: dict[str, float] = {}
    sdk = load("sdk.json")
    for library in ("openai", "anthropic"):
        for official, row in sdk[library]["ratios"]["over_official"].items():
            key = f"overhead.{library}.{official}"
            found[f"{key}.ours"] = round(row["ours_added_over_official_added"], 2)
            found[f"{key}.enforcement"] = round(
                row["enforcement_over_floor_over_official_added"], 2
            )
    for name in (
        "no_sdk_openai_anthropic.json",
        "no_sdk_adapters_1.json",
        "no_sdk_adapters_2.json",
    ):
        for library, row in load(name)["no_sdk_shares"].items():
            found[f"overhead.no_sdk.{library}"] = row["share_pct"]
    wrap = load("wrap.json")["ratios"]
    found["overhead.wrap.plain"] = round(wrap["plain"], 3)
    found["overhead.wrap.hint"] = round(wrap["hint"], 3)
    return found


def measure() -> dict[str, float]:
    return {
        "quickstart.requests": 3,
        **measure_demo(),
        **measure_paper(),
        **recorded_overhead(),
    }


def main(argv: list[str]) -> int:
    if "--measure" in argv:
        NUMBERS.write_text(json.dumps(measure(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if "--write" in argv:
        values = numbers()
        for path in text_files():
            text = path.read_text(encoding="utf-8")
            if MARKER.search(text):
                path.write_text(_refresh(text, values), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
