"""Contained calls with no TracerProvider: enforced, nothing traced, context untouched.

Runs in a fresh interpreter (the test process has its TracerProvider set).
"""

from __future__ import annotations

import json
import subprocess
import sys

from veronica_otel.testing import FakeLLMServer

_SCRIPT = """
import json, sys
import httpx2, openai
from opentelemetry import context, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel.instrumentors import _common
from veronica_otel.instrumentors.openai import OpenAIInstrumentor

seen = []  # the span current while each HTTP request is sent
client = openai.OpenAI(
    base_url=sys.argv[1], api_key="k", max_retries=0,
    http_client=httpx2.Client(event_hooks={"request": [
        lambda request: seen.append(trace.get_current_span().get_span_context())]}),
)

def call():
    return client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=5)

OpenAIInstrumentor().instrument()
remote = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(1))
token = context.attach(trace.set_span_in_context(NonRecordingSpan(remote)))
out = {"untraced_first": _common._untraced()}
with ExecutionContext(ExecutionConfig(max_steps=2)) as ctx:
    call()
    out["steps"] = ctx.snapshot().steps
    out["parent_kept"] = seen[-1] == remote
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # set late: the next call is traced
    out["untraced_after"] = _common._untraced()
    call()
    spans = [s for s in exporter.get_finished_spans() if s.name == "chat gpt-4o-mini"]
    out["traced"] = [(s.parent.span_id == remote.span_id, s.attributes["veronica.decision"],
                      s.attributes["gen_ai.usage.output_tokens"]) for s in spans]
    out["nested"] = seen[-1].span_id == spans[0].context.span_id
    try:
        call()
    except BudgetExceededError:
        out["denied"] = True
context.detach(token)
print(json.dumps(out))
"""


def test_untraced_call_is_contained_and_leaves_the_context_alone() -> None:
    with FakeLLMServer(output_tokens=5) as server:
        done = subprocess.run(
            [sys.executable, "-c", _SCRIPT, server.openai_base_url],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert server.count("/v1/chat/completions") == 2  # the third was denied before sending
    out = json.loads(done.stdout)
    assert out["untraced_first"] is True
    assert out["steps"] == 1
    # No span of ours was made current: the caller's remote parent went out as is.
    assert out["parent_kept"] is True
    assert out["untraced_after"] is False
    assert out["traced"] == [[True, "ALLOW", 5]]
    assert out["nested"] is True  # traced again: our span is current during the send
    assert out["denied"] is True
