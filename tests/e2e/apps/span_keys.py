"""The same openai calls under one instrumentor; prints each call span's attribute keys.

Usage: ``python span_keys.py contrib|ours`` with ``OPENAI_BASE_URL`` set to a
fake server whose next request fails with a 400 (the first call is the error
case). ``contrib`` instruments with the official
``opentelemetry-instrumentation-openai-v2``; ``ours`` with veronica-otel's
instrumentor inside a chain. Prints one JSON object: case -> sorted keys of
the one CLIENT span that call produced.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

if sys.argv[1] == "ours":
    from veronica_otel import ExecutionConfig, ExecutionContext
    from veronica_otel.instrumentors.openai import OpenAIInstrumentor

    OpenAIInstrumentor().instrument()
    ExecutionContext(ExecutionConfig(max_cost_usd=10.0)).__enter__()
else:
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor as ContribInstrumentor

    ContribInstrumentor().instrument()

import openai  # noqa: E402  (instrumented first, as zero-code does)

client = openai.OpenAI(max_retries=0)
MODEL = "gpt-4o-mini"
MESSAGES = [{"role": "user", "content": "hi"}]
PARAMETERS = {
    "temperature": 0.5,
    "top_p": 0.9,
    "max_tokens": 20,
    "seed": 1,
    "stop": ["x"],
    "presence_penalty": 0.1,
    "frequency_penalty": 0.2,
    "n": 2,
    "response_format": {"type": "json_object"},
    "service_tier": "default",
}


def stream() -> None:
    for _ in client.chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    ):
        pass


CASES: dict[str, Callable[[], object]] = {
    "error": lambda: client.chat.completions.create(model=MODEL, messages=MESSAGES),
    "chat": lambda: client.chat.completions.create(model=MODEL, messages=MESSAGES),
    "chat_parameters": lambda: client.chat.completions.create(
        model=MODEL, messages=MESSAGES, **PARAMETERS
    ),
    "stream": stream,
    "embeddings": lambda: client.embeddings.create(
        model="text-embedding-3-small", input="hi", dimensions=8
    ),
}
keys: dict[str, list[str]] = {}
for name, call in CASES.items():
    exporter.clear()
    with contextlib.suppress(openai.APIStatusError):  # the error case
        call()
    spans = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.CLIENT]
    keys[name] = [sorted(span.attributes or {}) for span in spans]  # type: ignore[misc]
print(json.dumps(keys))
