"""OTLPJsonLinesSpanExporter: one OTLP/JSON ExportTraceServiceRequest per line.

Checked against the OTLP/JSON rules (hex ids, lowerCamelCase keys, enums as
integers, 64-bit integers as strings, AnyValue attributes) and round-tripped
through the official protobuf messages.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.json_format import ParseDict  # type: ignore[import-untyped]
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from tests.integration._span_sink import attached
from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext, contained_tool
from veronica_otel.exporters import OTLPJsonLinesSpanExporter
from veronica_otel.exporters.otlp_json import encode_otlp_json

ATTRIBUTES: dict[str, Any] = {
    "gen_ai.operation.name": "chat",
    "gen_ai.usage.input_tokens": 12,
    "veronica.cost_usd": 0.000125,
    "veronica.flag": True,
    "veronica.tags": ("a", "b"),
    "veronica.sizes": (1, 2, 3),
}
CAMEL = re.compile(r"^[a-z][a-zA-Z0-9]*$")


@pytest.fixture
def provider() -> TracerProvider:
    return TracerProvider(resource=Resource.create({"service.name": "otlp-json-test"}))


def make_spans(provider: TracerProvider) -> list[ReadableSpan]:
    """A parent, a child with every attribute type, an event, a link and an error."""
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("veronica_otel.test", "1.0")
    with tracer.start_as_current_span("invoke_workflow demo") as parent:
        link = Link(parent.get_span_context(), {"why": "example"})
        child = tracer.start_span(
            "chat gpt-4o-mini", kind=SpanKind.CLIENT, attributes=ATTRIBUTES, links=[link]
        )
        child.add_event("veronica.trip", {"veronica.trip.reason": "cost", "limit": 1.5})
        child.set_status(Status(StatusCode.ERROR, "veronica trip: cost"))
        child.end()
    child_span, parent_span = memory.get_finished_spans()
    return [parent_span, child_span]


def any_value(value: dict[str, Any]) -> Any:
    """An OTLP/JSON AnyValue back to Python."""
    ((kind, raw),) = value.items()
    if kind == "intValue":
        assert isinstance(raw, str)  # int64 is a string in OTLP/JSON
        return int(raw)
    if kind == "arrayValue":
        return tuple(any_value(v) for v in raw["values"])
    return raw


def walk_keys(obj: Any) -> Iterator[str]:
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield key
            yield from walk_keys(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from walk_keys(value)


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_lines_are_otlp_json(tmp_path: Path, provider: TracerProvider) -> None:
    path = tmp_path / "out" / "traces.jsonl"
    exporter = OTLPJsonLinesSpanExporter(path)
    spans = make_spans(provider)
    assert exporter.export(spans[:1]) is SpanExportResult.SUCCESS
    assert exporter.export(spans[1:]) is SpanExportResult.SUCCESS
    lines = read_lines(path)
    assert len(lines) == 2  # one line per export call
    for line in lines:
        assert set(line) == {"resourceSpans"}
        assert all(CAMEL.match(key) for key in walk_keys(line)), sorted(set(walk_keys(line)))
    (resource_spans,) = lines[1]["resourceSpans"]
    resource = {a["key"]: any_value(a["value"]) for a in resource_spans["resource"]["attributes"]}
    assert resource["service.name"] == "otlp-json-test"
    (scope_spans,) = resource_spans["scopeSpans"]
    assert scope_spans["scope"] == {"name": "veronica_otel.test", "version": "1.0"}
    (span,) = scope_spans["spans"]
    (parent,) = lines[0]["resourceSpans"][0]["scopeSpans"][0]["spans"]
    # Ids: lowercase hex of 16 and 8 bytes; links too.
    assert re.fullmatch(r"[0-9a-f]{32}", span["traceId"])
    assert re.fullmatch(r"[0-9a-f]{16}", span["spanId"])
    assert span["traceId"] == parent["traceId"] == f"{spans[1].context.trace_id:032x}"
    assert span["parentSpanId"] == parent["spanId"] == f"{spans[0].context.span_id:016x}"
    assert "parentSpanId" not in parent
    assert span["links"][0]["spanId"] == parent["spanId"]
    assert span["links"][0]["traceId"] == parent["traceId"]
    # Enums are integers, fixed64 times are decimal strings.
    assert span["kind"] == 3 and parent["kind"] == 1  # CLIENT, INTERNAL
    assert span["status"] == {"code": 2, "message": "veronica trip: cost"}
    assert re.fullmatch(r"\d{19}", span["startTimeUnixNano"])
    assert int(span["endTimeUnixNano"]) == spans[1].end_time
    # Attributes round-trip, with their types.
    attributes = {a["key"]: any_value(a["value"]) for a in span["attributes"]}
    assert attributes == ATTRIBUTES
    kinds = {a["key"]: next(iter(a["value"])) for a in span["attributes"]}
    assert kinds["veronica.cost_usd"] == "doubleValue" and kinds["veronica.flag"] == "boolValue"
    (event,) = span["events"]
    assert event["name"] == "veronica.trip"
    event_attrs = {a["key"]: any_value(a["value"]) for a in event["attributes"]}
    assert event_attrs == {"veronica.trip.reason": "cost", "limit": 1.5}


def test_a_line_is_the_official_message_with_hex_ids(provider: TracerProvider) -> None:
    spans = make_spans(provider)
    line = encode_otlp_json(spans)

    def to_base64(item: dict[str, Any]) -> None:
        for key in ("traceId", "spanId", "parentSpanId"):
            if key in item:
                item[key] = base64.b64encode(bytes.fromhex(item[key])).decode()

    for resource_spans in line["resourceSpans"]:
        for scope_spans in resource_spans["scopeSpans"]:
            for span in scope_spans["spans"]:
                to_base64(span)
                for link in span.get("links", ()):
                    to_base64(link)
    parsed = ParseDict(line, ExportTraceServiceRequest())
    assert parsed == encode_spans(spans)


def test_a_veronica_chain_in_otlp_json(tracer_provider: TracerProvider, tmp_path: Path) -> None:
    path = tmp_path / "chain.jsonl"

    @contained_tool
    def lookup() -> str:
        return "ok"

    with (
        attached(tracer_provider, SimpleSpanProcessor(OTLPJsonLinesSpanExporter(path))),
        ExecutionContext(ExecutionConfig(max_steps=1), name="json") as ctx,
    ):
        lookup()
        with pytest.raises(BudgetExceededError, match="steps"):
            lookup()
    spans = [
        span
        for line in read_lines(path)
        for rs in line["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
    ]
    by_name = {span["name"]: span for span in spans}
    root = by_name["invoke_workflow json"]
    attrs = {a["key"]: any_value(a["value"]) for a in root["attributes"]}
    assert attrs["veronica.chain.id"] == ctx.chain_id
    assert attrs["veronica.steps"] == 1 and attrs["veronica.decision"] == "HALT"
    tools = [s for s in spans if s["name"] == "execute_tool lookup"]
    assert len(tools) == 2 and all(t["parentSpanId"] == root["spanId"] for t in tools)
    trips = [e for t in tools for e in t.get("events", ()) if e["name"] == "veronica.trip"]
    assert len(trips) == 1


def test_concurrent_exports_append_whole_lines(tmp_path: Path, provider: TracerProvider) -> None:
    path = tmp_path / "t.jsonl"
    exporter = OTLPJsonLinesSpanExporter(path)
    spans = make_spans(provider)

    def worker() -> None:
        for _ in range(50):
            assert exporter.export(spans) is SpanExportResult.SUCCESS

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = read_lines(path)
    assert len(lines) == 400
    assert all(len(line["resourceSpans"][0]["scopeSpans"][0]["spans"]) == 2 for line in lines)


def test_contract_and_failures(
    tmp_path: Path, provider: TracerProvider, caplog: pytest.LogCaptureFixture
) -> None:
    spans = make_spans(provider)
    broken = OTLPJsonLinesSpanExporter(tmp_path)  # a directory: cannot be opened for append
    with caplog.at_level(logging.ERROR, logger="veronica_otel.exporters.otlp_json"):
        assert broken.export(spans) is SpanExportResult.FAILURE
    assert any(r.levelno == logging.ERROR for r in caplog.records)
    exporter = OTLPJsonLinesSpanExporter(tmp_path / "ok.jsonl")
    assert exporter.export([]) is SpanExportResult.SUCCESS
    assert exporter.force_flush() is True
    exporter.shutdown()
    assert exporter.export(spans) is SpanExportResult.FAILURE
    assert not (tmp_path / "ok.jsonl").exists()


def test_entry_point_reads_its_path_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (ep,) = entry_points(group="opentelemetry_traces_exporter", name="veronica_otlp_json")
    assert ep.load() is OTLPJsonLinesSpanExporter
    monkeypatch.setenv("VERONICA_OTLP_JSON_PATH", str(tmp_path / "env.jsonl"))
    assert OTLPJsonLinesSpanExporter().path == tmp_path / "env.jsonl"
    monkeypatch.delenv("VERONICA_OTLP_JSON_PATH")
    assert OTLPJsonLinesSpanExporter().path == Path("veronica-traces.jsonl")
