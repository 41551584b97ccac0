"""The trip channel's metrics and log records, and call metrics, with an SDK."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from veronica_otel import (
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    contained_tool,
)


def points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    found = []
    if data is None:
        return found
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    found.extend(metric.data.data_points)
    return found


def total(reader: InMemoryMetricReader, name: str, **attrs: str) -> float:
    return sum(
        p.value
        for p in points(reader, name)
        if all(p.attributes.get(k) == v for k, v in attrs.items())
    )


def test_trip_is_counted_and_logged(
    metric_reader: InMemoryMetricReader, log_exporter: InMemoryLogRecordExporter
) -> None:
    before = total(metric_reader, "veronica.trips", **{"veronica.trip.reason": "steps"})
    ctx = ExecutionContext(ExecutionConfig(max_steps=0), chain_id="telemetry-trip")
    assert ctx.wrap_llm_call(lambda: None) is Decision.HALT
    after = total(metric_reader, "veronica.trips", **{"veronica.trip.reason": "steps"})
    assert after - before == 1
    records = [r.log_record for r in log_exporter.get_finished_logs()]
    mine = [
        r for r in records if r.attributes and r.attributes.get("veronica.chain.id") == ctx.chain_id
    ]
    assert len(mine) == 1
    assert mine[0].event_name == "veronica.trip"
    assert mine[0].attributes is not None
    assert mine[0].attributes["veronica.trip.reason"] == "steps"


def test_calls_and_cost_counted_for_traced_chains(
    metric_reader: InMemoryMetricReader, span_exporter: InMemorySpanExporter
) -> None:
    before_calls = total(metric_reader, "veronica.calls", **{"veronica.kind": "tool"})
    before_cost = total(metric_reader, "veronica.cost_usd")

    @contained_tool(cost_usd=0.25)
    def tool() -> None:
        return None

    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        tool()
        tool()
        ctx.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.1))
    assert total(metric_reader, "veronica.calls", **{"veronica.kind": "tool"}) - before_calls == 2
    assert total(metric_reader, "veronica.cost_usd") - before_cost == pytest.approx(0.6)


def test_gauges_observe_live_chains(metric_reader: InMemoryMetricReader) -> None:
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=2.0), chain_id="gauge-chain")
    ctx.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.5))
    remaining = [
        p.value
        for p in points(metric_reader, "veronica.remaining_usd")
        if p.attributes.get("veronica.chain.id") == "gauge-chain"
    ]
    assert remaining == [pytest.approx(1.5)]


def test_call_metrics_skipped_until_a_meter_provider_is_set_then_counted() -> None:
    """With no MeterProvider the call counter is idle (nothing built per call);
    one set later still receives every call settled after it (fresh interpreter:
    the test process has its provider already)."""
    import subprocess
    import sys

    code = """
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from veronica_otel import _telemetry

assert _telemetry._idle(_telemetry._calls)
_telemetry.record_call("llm", 0.5, False, "m")  # no provider: dropped, never raised
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
assert not _telemetry._idle(_telemetry._calls)
_telemetry.record_call("llm", 0.25, False, "m")
found = {}
for rm in reader.get_metrics_data().resource_metrics:
    for sm in rm.scope_metrics:
        for metric in sm.metrics:
            found[metric.name] = sum(p.value for p in metric.data.data_points)
print(found["veronica.calls"], found["veronica.cost_usd"])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "0.25"]
