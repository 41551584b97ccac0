"""The demo's graph files: stable names, overwritten per run, nothing piling up."""

from __future__ import annotations

from pathlib import Path

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from veronica_otel import ExecutionConfig, ExecutionContext
from veronica_otel.cli._demo import _stable_names
from veronica_otel.exporters.graph import ExecutionGraphExporter


def _one_run(spans: InMemorySpanExporter, scratch: Path, names: list[str]) -> None:
    """Chains named ``names`` run, their spans written by the graph exporter to ``scratch``."""
    spans.clear()
    for name in names:
        with ExecutionContext(ExecutionConfig(max_steps=3), name=name):
            pass
    exporter = ExecutionGraphExporter(scratch)
    exporter.export(spans.get_finished_spans())
    exporter.force_flush()


def test_each_run_overwrites_the_same_files_in_the_order_the_chains_ran(
    tmp_path: Path, span_exporter: InMemorySpanExporter
) -> None:
    out = tmp_path / "veronica-demo"
    out.mkdir()
    (out / "notes.txt").write_text("the user's own file")
    for run in range(2):
        _one_run(
            span_exporter, tmp_path / f"scratch{run}", ["Retry: contained", "planner/critic", "bob"]
        )
        written = _stable_names(tmp_path / f"scratch{run}", out)
        assert [name for name, _ in written] == ["Retry: contained", "planner/critic", "bob"]
    assert sorted(p.name for p in out.iterdir()) == [
        "01-retry-contained.html",
        "01-retry-contained.json",
        "02-planner-critic.html",
        "02-planner-critic.json",
        "03-bob.html",
        "03-bob.json",
        "notes.txt",
    ]


def test_a_shorter_run_removes_what_the_longer_one_left(
    tmp_path: Path, span_exporter: InMemorySpanExporter
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    _one_run(span_exporter, tmp_path / "a", ["one", "two", "three"])
    _stable_names(tmp_path / "a", out)
    _one_run(span_exporter, tmp_path / "b", ["one"])
    _stable_names(tmp_path / "b", out)
    assert sorted(p.name for p in out.iterdir()) == ["01-one.html", "01-one.json"]
