"""Spans read back from Jaeger's OTLP/JSON: same nodes as the spans that were sent.

The documents here are what ``encode_otlp_json`` makes from real SDK spans
(the encoding Jaeger's ``/api/v3/traces`` answers in); the end-to-end test
against a real Jaeger is tests/e2e/test_jaeger.py.
"""

from __future__ import annotations

import base64

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from veronica_otel.exporters._graph_model import node_from_span
from veronica_otel.exporters.jaeger_query import JaegerQuery, graphs_from_spans, spans_from_otlp
from veronica_otel.exporters.otlp_json import encode_otlp_json


def finished_spans() -> list[ReadableSpan]:
    """A chain with a sub-agent, a sent call with its POST, a denied call and an orphan."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    chain = {"veronica.chain.id": "c1", "gen_ai.operation.name": "invoke_workflow"}
    with tracer.start_as_current_span("invoke_workflow plan", attributes=chain):
        call = {
            "veronica.chain.id": "c1",
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.usage.input_tokens": 12,
            "gen_ai.usage.output_tokens": 5,
            "veronica.cost_usd": 0.25,
            "veronica.decision": "ALLOW",
            "veronica.tags": ("a", "b"),
        }
        with (
            tracer.start_as_current_span("chat gpt-4o-mini", attributes=call),
            tracer.start_as_current_span("POST"),
        ):
            pass
        sub = {"veronica.chain.id": "c1.1", "gen_ai.operation.name": "invoke_agent"}
        with tracer.start_as_current_span("invoke_agent critic", attributes=sub):
            denied = {**call, "veronica.chain.id": "c1.1", "veronica.decision": "HALT"}
            with tracer.start_as_current_span("chat gpt-4o-mini", attributes=denied) as span:
                trip = {
                    "veronica.trip.reason": "steps",
                    "veronica.trip.limit": 2,
                    "veronica.trip.observed": 3.0,
                }
                span.add_event("veronica.trip", trip)
                span.set_status(Status(StatusCode.ERROR, "veronica trip: steps"))
    with tracer.start_as_current_span("no chain here"):
        pass
    return list(exporter.get_finished_spans())


def test_nodes_survive_the_round_trip() -> None:
    sent = finished_spans()
    back = spans_from_otlp({"result": encode_otlp_json(sent)})
    assert [node_from_span(s) for s in back] == [node_from_span(s) for s in sent]
    denied = next(s for s in back if (s.attributes or {}).get("veronica.decision") == "HALT")
    assert denied.status.description == "veronica trip: steps"
    assert dict(denied.events[0].attributes or {})["veronica.trip.limit"] == 2
    assert (back[1].attributes or {})["veronica.tags"] == ("a", "b")


def test_base64_ids_read_as_hex_ones_do() -> None:
    sent = finished_spans()
    document = encode_otlp_json(sent)
    for resource in document["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    back = spans_from_otlp(document)
    assert [s.context.span_id for s in back if s.context] == [
        s.context.span_id for s in sent if s.context
    ]


def test_one_graph_per_chain_and_no_graph_for_a_trace_without_one() -> None:
    graphs = graphs_from_spans(spans_from_otlp(encode_otlp_json(finished_spans())))
    assert len(graphs) == 1
    graph = graphs[0]
    assert graph["chain_id"] == "c1" and graph["complete"]
    names = [n["name"] for n in graph["nodes"]]
    assert names == [
        "invoke_workflow plan",
        "chat gpt-4o-mini",
        "POST",  # no chain of its own: its parent's
        "invoke_agent critic",
        "chat gpt-4o-mini",
    ]
    assert graph["totals"]["denied_calls"] == 1
    assert graph["totals"]["trip_reasons"] == ["steps"]


def test_not_a_document_is_no_spans() -> None:
    for junk in (None, [], {"result": 3}, {"resourceSpans": [1, {"scopeSpans": [None]}]}):
        assert spans_from_otlp(junk) == []


def test_bad_arguments_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="url"):
        JaegerQuery("localhost:16686")
    with pytest.raises(ValueError, match="trace id"):
        JaegerQuery("http://127.0.0.1:9").trace("xyz")
    with pytest.raises(ValueError, match="limit"):
        JaegerQuery("http://127.0.0.1:9").find("svc", limit=0)
