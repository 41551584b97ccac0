"""One source for the numbers the docs quote: ``docs/numbers.json``.

Every number marked in README.md and the docs (``<!--n:KEY-->N<!--/n-->``)
must be the file's, and the file must be what the demo and the paper
benchmark count today (counts of requests the fake server received, the same
on every run). The demo's counts are read from the table of the one demo run
the end-to-end tests share (``tests/e2e/conftest.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs"))
import _numbers  # noqa: E402  (docs/ is not a package)

from .conftest import DemoRun  # noqa: E402


def test_every_marked_number_is_the_files() -> None:
    table = _numbers.numbers()
    seen: set[str] = set()
    wrong = []
    for path in _numbers.text_files():
        for key, written in _numbers.marked(path.read_text(encoding="utf-8")):
            seen.add(key)
            if key not in table or written != str(table[key]):
                wrong.append(
                    f"{path.relative_to(ROOT)}: {key} says {written}, file: {table.get(key)}"
                )
    assert not wrong, "\n".join(wrong) + "\n(python docs/_numbers.py --write fixes the text)"
    # The README, the demo's page and the benchmarks page all quote from it.
    readme = _numbers.marked((ROOT / "README.md").read_text(encoding="utf-8"))
    assert {key for key, _ in readme} >= {
        "demo.retries.uncontained",
        "demo.planner-critic.contained",
    }
    assert any(key.startswith("paper.") for key in seen)


def test_the_site_shows_the_numbers_without_markers() -> None:
    text = "a <!--n:demo.retries.uncontained-->1<!--/n--> b"
    assert _numbers.render_numbers(text, {"demo.retries.uncontained": 64}) == "a 64 b"


def test_the_file_is_what_the_demo_and_the_benchmark_count(demo_run: DemoRun) -> None:
    from veronica_otel.cli._demo_scenarios import SCENARIOS

    fresh: dict[str, float] = {
        "quickstart.requests": 3,
        **_numbers.measure_paper(),
        **_numbers.recorded_overhead(),
    }
    # The demo's table: a row per scenario and run, its title and run padded
    # to their columns, then the requests the server received.
    rows = demo_run[1].stdout.splitlines()
    for scenario in SCENARIOS:
        for mode in ("uncontained", "contained"):
            start = f"{scenario.title:<44}{mode:<13}"
            (row,) = [row for row in rows if row.startswith(start)]
            fresh[f"demo.{scenario.key}.{mode}"] = int(row[len(start) :].split()[0])
    assert fresh == _numbers.numbers(), "python docs/_numbers.py --measure --write updates them"
