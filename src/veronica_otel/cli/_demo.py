"""``veronica-otel demo``: runaway agent chains, uncontained and contained.

Everything is real except the model: the ``openai`` SDK talks HTTP to the
embedded fake LLM server, whose request counter is what the table reports as
"calls sent". The uncontained run of each scenario executes the same code in
an unlimited (observe-only) chain, so its spend is measured the same way.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

from veronica_otel._config import ExecutionConfig
from veronica_otel._context import ExecutionContext
from veronica_otel._errors import BudgetExceededError
from veronica_otel.testing import FakeLLMServer

from ._demo_scenarios import SCENARIOS, Scenario

__all__ = ["DemoRow", "run_demo"]


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


def _run_one(scenario: Scenario, client: Any, server: FakeLLMServer, contained: bool) -> DemoRow:
    server.reset()
    config = scenario.config if contained else ExecutionConfig()
    trip = "-"
    started = time.perf_counter()
    with ExecutionContext(
        config, name=f"{scenario.key}-{'contained' if contained else 'uncontained'}"
    ) as ctx:
        try:
            scenario.run(client)
        except BudgetExceededError as exc:
            trip = exc.reason
        usd = ctx.snapshot().cost_usd
    seconds = time.perf_counter() - started
    return DemoRow(
        scenario.title,
        "contained" if contained else "uncontained",
        server.request_count,
        usd,
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
    header = (
        f"{'scenario':<44}{'run':<13}{'calls':>6}{'USD':>10}  {'trip':<13}{'time':>8}  reduction"
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
            f"{row.trip:<13}{row.seconds * 1000:>6.0f}ms  {reduction}",
            file=out,
        )
