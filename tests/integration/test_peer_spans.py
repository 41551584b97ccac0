"""A peer GenAI instrumentor's span already describes the call: ours goes on it.

The official openai-v2 instrumentation, OpenLLMetry and openlit wrap
``create()`` and make a CLIENT span for the operation, current while our
hook runs. Their real packages run in tests/e2e/test_real_installs.py; here
the same shape of span, made by another tracer, shows the rule exactly.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer

peer = trace.get_tracer("peer.openai")


@pytest.fixture
def client() -> Iterator[openai.OpenAI]:
    OpenAIInstrumentor().instrument()
    with FakeLLMServer(output_tokens=5) as server:
        yield openai.OpenAI(base_url=server.openai_base_url, api_key="test", max_retries=0)
    OpenAIInstrumentor().uninstrument()


def chat(client: openai.OpenAI) -> None:
    client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
    )


def peer_chat(client: openai.OpenAI, operation: str = "chat") -> None:
    attributes = {"gen_ai.operation.name": operation, "gen_ai.request.model": "gpt-4o-mini"}
    with peer.start_as_current_span("chat gpt-4o-mini", kind=trace.SpanKind.CLIENT) as span:
        span.set_attributes(attributes)
        chat(client)


def test_a_peer_span_for_the_call_gets_our_attributes_and_no_second_span(
    tracer_provider: TracerProvider, span_exporter: InMemorySpanExporter, client: openai.OpenAI
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=1)) as ctx:
        peer_chat(client)
        with pytest.raises(BudgetExceededError):
            peer_chat(client)
    spans = [s for s in span_exporter.get_finished_spans() if s.kind is trace.SpanKind.CLIENT]
    assert [s.instrumentation_scope.name for s in spans] == ["peer.openai", "peer.openai"]
    sent, denied = (dict(s.attributes or {}) for s in spans)
    assert (sent["veronica.chain.id"], sent["veronica.decision"]) == (ctx.chain_id, "ALLOW")
    assert (denied["veronica.chain.id"], denied["veronica.decision"]) == (ctx.chain_id, "HALT")


def test_our_own_span_when_the_current_span_describes_something_else(
    tracer_provider: TracerProvider, span_exporter: InMemorySpanExporter, client: openai.OpenAI
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=5)):
        peer_chat(client, operation="invoke_agent")  # an agent span, not this call
        with peer.start_as_current_span("work"):  # an INTERNAL span
            chat(client)
    ours = [
        s
        for s in span_exporter.get_finished_spans()
        if s.instrumentation_scope.name != "peer.openai"
    ]
    assert [s.name for s in ours if s.kind is trace.SpanKind.CLIENT] == ["chat gpt-4o-mini"] * 2
