"""What leaves over OTLP arrives intact: a receiver built on the official protobuf messages.

The test starts an OTLP/HTTP (protobuf) receiver on loopback, points the
standard ``OTLPSpanExporter`` at it, runs a chain through the real ``openai``
SDK against the embedded fake server (a call, a tool, a sub-agent's call, a
denied call), and checks what the receiver decoded: one trace, the parent and
child links, the GenAI and ``veronica.*`` attributes, and the trip event.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tests.integration._span_sink import attached
from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext, contained_tool
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer

MODEL = "gpt-4o-mini"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello."}]
OUTPUT_TOKENS = 7


class OTLPReceiver:
    """A minimal OTLP/HTTP traces endpoint: POST /v1/traces with a protobuf body."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            disable_nagle_algorithm = True  # no 40 ms Nagle/delayed-ACK stall on loopback

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if (
                    self.path != "/v1/traces"
                    or self.headers.get("Content-Type") != "application/x-protobuf"
                ):
                    self.send_error(404)
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with receiver._lock:
                    receiver.requests.append(request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"

    def __enter__(self) -> OTLPReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def spans(self) -> list[tuple[dict[str, Any], Span]]:
        """Every span received, with its resource's attributes."""
        with self._lock:
            return [
                (attributes(rs.resource.attributes), span)
                for request in self.requests
                for rs in request.resource_spans
                for ss in rs.scope_spans
                for span in ss.spans
            ]


def value(any_value: AnyValue) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return tuple(value(v) for v in any_value.array_value.values)
    return getattr(any_value, kind) if kind else None


def attributes(items: Any) -> dict[str, Any]:
    pairs: list[KeyValue] = list(items)
    return {kv.key: value(kv.value) for kv in pairs}


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as running:
        yield running


@pytest.fixture
def otlp_exported(tracer_provider: TracerProvider, receiver: OTLPReceiver) -> Iterator[None]:
    """The session provider also sends this test's spans over OTLP/HTTP to the receiver."""
    exporter = OTLPSpanExporter(endpoint=receiver.endpoint, timeout=10)
    with attached(tracer_provider, SimpleSpanProcessor(exporter)):
        yield


@pytest.fixture
def client() -> Iterator[openai.OpenAI]:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    try:
        with (
            FakeLLMServer(input_tokens=11, output_tokens=OUTPUT_TOKENS) as server,
            openai.OpenAI(base_url=server.openai_base_url, api_key="test", max_retries=0) as oai,
        ):
            yield oai
    finally:
        instrumentor.uninstrument()


@contained_tool
def fetch_page(url: str) -> str:
    return f"contents of {url}"


def test_chain_arrives_intact_over_otlp_http(
    otlp_exported: None, receiver: OTLPReceiver, client: openai.OpenAI
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=3), name="researcher") as ctx:
        client.chat.completions.create(model=MODEL, messages=MESSAGES)
        fetch_page("example.org")
        with ctx.spawn_child(name="summarizer") as child:
            client.chat.completions.create(model=MODEL, messages=MESSAGES)
        with pytest.raises(BudgetExceededError) as denied_error:
            client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert denied_error.value.reason == "steps"

    received = receiver.spans()
    spans = {span.name: span for _, span in received}
    assert len(received) == 6, sorted(spans)
    resource = received[0][0]
    assert "service.name" in resource and "telemetry.sdk.language" in resource

    # One trace, linked parent to child exactly as the chain ran.
    root = spans["invoke_workflow researcher"]
    agent = spans["invoke_agent summarizer"]
    tool = spans["execute_tool fetch_page"]
    calls = [span for _, span in received if span.name == f"chat {MODEL}"]
    assert len(calls) == 3
    first, child_call, denied = sorted(calls, key=lambda s: s.start_time_unix_nano)
    assert {span.trace_id for _, span in received} == {root.trace_id}
    assert len(root.trace_id) == 16 and len(root.span_id) == 8
    assert root.parent_span_id == b""
    for span in (first, tool, agent, denied):
        assert span.parent_span_id == root.span_id
    assert child_call.parent_span_id == agent.span_id
    assert child_call.kind == Span.SpanKind.SPAN_KIND_CLIENT

    # GenAI attributes on the calls.
    call_attrs = attributes(first.attributes)
    assert call_attrs["gen_ai.operation.name"] == "chat"
    assert call_attrs["gen_ai.provider.name"] == "openai"
    assert call_attrs["gen_ai.request.model"] == MODEL
    assert call_attrs["gen_ai.usage.input_tokens"] == 11
    assert call_attrs["gen_ai.usage.output_tokens"] == OUTPUT_TOKENS
    assert call_attrs["veronica.chain.id"] == ctx.chain_id
    assert call_attrs["veronica.decision"] == "ALLOW"
    assert call_attrs["veronica.cost_usd"] > 0
    assert attributes(child_call.attributes)["veronica.chain.id"] == child.chain_id
    assert child.chain_id.startswith(f"{ctx.chain_id}.")
    tool_attrs = attributes(tool.attributes)
    assert tool_attrs["gen_ai.operation.name"] == "execute_tool"
    assert tool_attrs["gen_ai.tool.name"] == "fetch_page"

    # veronica.* on the chain's spans.
    root_attrs = attributes(root.attributes)
    assert root_attrs["gen_ai.operation.name"] == "invoke_workflow"
    assert root_attrs["veronica.chain.id"] == ctx.chain_id
    assert root_attrs["veronica.depth"] == 0
    assert root_attrs["veronica.steps"] == 3
    assert root_attrs["veronica.decision"] == "HALT"
    assert root_attrs["veronica.trip.reason"] == "steps"
    assert root_attrs["veronica.cost_usd"] == pytest.approx(ctx.snapshot().cost_usd)
    agent_attrs = attributes(agent.attributes)
    assert agent_attrs["gen_ai.operation.name"] == "invoke_agent"
    assert agent_attrs["veronica.depth"] == 1

    # The denied call: HALT, an error status and one veronica.trip event.
    denied_attrs = attributes(denied.attributes)
    assert denied_attrs["veronica.decision"] == "HALT"
    assert denied_attrs["gen_ai.request.model"] == MODEL
    assert "gen_ai.usage.output_tokens" not in denied_attrs
    assert denied.status.code == Status.StatusCode.STATUS_CODE_ERROR
    (trip,) = [event for event in denied.events if event.name == "veronica.trip"]
    assert attributes(trip.attributes) == {
        "veronica.trip.reason": "steps",
        "veronica.trip.limit": 3.0,
        "veronica.trip.observed": 4.0,
        "veronica.chain.id": ctx.chain_id,
        "veronica.remaining.steps": 0,  # the chain's state at the trip, not on call spans
    }
    assert not any(event.name == "veronica.trip" for event in first.events)
