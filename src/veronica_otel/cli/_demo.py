"""``veronica-otel demo``: runaway agent chains, uncontained and contained.

Everything is real except the model: the ``openai`` SDK talks HTTP to the
embedded fake LLM server, whose request counter is what the table reports as
"calls sent". The uncontained run of each scenario executes the same code in
an unlimited (observe-only) chain, so its spend is measured the same way.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from veronica_otel._context import ExecutionContext
from veronica_otel._errors import BudgetExceededError
from veronica_otel._pricing import default_price_table
from veronica_otel._units import nano_to_usd
from veronica_otel.testing import FakeLLMServer

from ._demo_scenarios import SCENARIOS, Scenario

__all__ = ["DemoRow", "run_demo", "trace_to_graph"]


@dataclass(frozen=True)
class DemoRow:
    """One line of the demo table."""

    scenario: str
    mode: str
    calls: int
    usd: float
    trip: str
    seconds: float
    note: str = ""


def _billed_usd(server: FakeLLMServer) -> float:
    """What the replies the server sent would cost at list price."""
    table = default_price_table()
    total = 0
    for bill in server.billed:
        prices = table.lookup("openai", bill.model)
        if prices is not None:
            total += prices.cost_nano(
                bill.input_tokens, bill.output_tokens, bill.cached_tokens, bill.reasoning_tokens
            )
    return nano_to_usd(total)


def _run_one(scenario: Scenario, client: Any, server: FakeLLMServer, contained: bool) -> DemoRow:
    server.reset()
    config = scenario.config if contained else None
    trip = "-"
    name = f"{scenario.key}-{'contained' if contained else 'uncontained'}"
    started = time.perf_counter()
    if scenario.serves:
        trip = str(scenario.run(client, config))
    else:
        with ExecutionContext(config, name=name):
            try:
                scenario.run(client)
            except BudgetExceededError as exc:
                trip = exc.reason
    seconds = time.perf_counter() - started
    return DemoRow(
        scenario.title,
        "contained" if contained else "uncontained",
        server.request_count,
        _billed_usd(server),
        trip,
        seconds,
        "" if contained else scenario.uncontained_note,
    )


def run_demo(out: TextIO = sys.stdout, progress: TextIO = sys.stderr) -> list[DemoRow]:
    """Run every scenario both ways and print the table; return its rows."""
    import openai

    from veronica_otel.instrumentors.openai import OpenAIInstrumentor

    instrumentor = OpenAIInstrumentor()
    was_instrumented = instrumentor.is_instrumented_by_opentelemetry
    if not was_instrumented:
        instrumentor.instrument()
    rows: list[DemoRow] = []
    try:
        with FakeLLMServer(output_tokens=40) as server:
            client = openai.OpenAI(base_url=server.openai_base_url, api_key="demo", max_retries=0)
            try:
                for scenario in SCENARIOS:
                    for contained in (False, True):
                        mode = "contained" if contained else "uncontained"
                        print(f"  running {scenario.title}: {mode} ...", file=progress, flush=True)
                        rows.append(_run_one(scenario, client, server, contained))
            finally:
                client.close()
    finally:
        if not was_instrumented:
            instrumentor.uninstrument()
    _print_table(rows, out)
    return rows


def _print_table(rows: list[DemoRow], out: TextIO) -> None:
    trip_w = max([13, *(len(row.trip) + 2 for row in rows)])  # the longest trip, aligned
    header = (
        f"{'scenario':<44}{'run':<13}{'calls':>6}{'USD':>10}  {'trip':<{trip_w}}{'time':>8}  "
        "reduction"
    )
    print(header, file=out)
    print("-" * len(header), file=out)
    baseline: dict[str, DemoRow] = {}
    for row in rows:
        if row.mode == "uncontained":
            baseline[row.scenario] = row
            reduction = row.note
        else:
            base = baseline.get(row.scenario)
            reduction = (
                f"{100 * (1 - row.calls / base.calls):.0f}% fewer calls, "
                f"{100 * (1 - row.usd / base.usd):.0f}% less spend"
                if base and base.calls and base.usd
                else ""
            )
        print(
            f"{row.scenario:<44}{row.mode:<13}{row.calls:>6}{row.usd:>10.4f}  "
            f"{row.trip:<{trip_w}}{row.seconds * 1000:>6.0f}ms  {reduction}",
            file=out,
        )


def trace_to_graph(out_dir: str) -> Callable[[], list[tuple[str, Path]]]:
    """Send this process's spans to the graph exporter; returns a function that
    flushes and lists the HTML files written.

    The demo is an application, so it may install the SDK tracer provider,
    but only when nothing else has. Its files have stable names, one pair per
    chain in the order the chains ran (``01-<root>.html`` and ``.json``),
    overwritten by the next run: the exporter writes into a scratch folder
    under ``out_dir`` (its names are chain ids, new each run), and
    :func:`_stable_names` moves them.
    """
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from veronica_otel.exporters.graph import ExecutionGraphExporter

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    scratch = Path(out_dir) / f".run-{os.getpid()}"
    exporter = ExecutionGraphExporter(scratch)
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    def finish() -> list[tuple[str, Path]]:
        exporter.force_flush()
        try:
            return _stable_names(scratch, Path(out_dir))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    return finish


_OURS = re.compile(r"^\d{2,}-[a-z0-9-]+\.(html|json)$")  # a name _stable_names gives


def _stable_names(scratch: Path, out: Path) -> list[tuple[str, Path]]:
    """Move each chain's graph from ``scratch`` to ``out`` under a stable name;
    returns ``(root name, html path)`` per chain, in the order the chains ran."""
    from veronica_otel.exporters.graph import load_graph

    found = []
    for html in scratch.glob("*.html"):
        graph = load_graph(html.with_suffix(".json"))
        roots = [n for n in graph["nodes"] if n["id"] in graph["roots"]]
        name = roots[0]["name"].split(" ", 1)[-1] if roots else graph["chain_id"]
        started = min((n["start"] for n in graph["nodes"]), default=0.0)
        found.append((started, name, html))
    found.sort(key=lambda item: item[0])
    width = max(2, len(str(len(found))))
    written: list[tuple[str, Path]] = []
    for index, (_, name, html) in enumerate(found, 1):
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:60] or "chain"
        stem = out / f"{index:0{width}d}-{slug}"
        html.with_suffix(".json").replace(stem.with_suffix(".json"))
        html.replace(stem.with_suffix(".html"))
        written.append((name, stem.with_suffix(".html")))
    kept = {path.name for _, path in written} | {
        path.with_suffix(".json").name for _, path in written
    }
    for stale in out.iterdir():  # an earlier run's files that this run did not rewrite
        if _OURS.match(stale.name) and stale.name not in kept:
            stale.unlink()
    return written
