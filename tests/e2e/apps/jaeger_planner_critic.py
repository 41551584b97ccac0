"""The demo's planner/critic chain, set up in code and exported over OTLP.

The demo's own scenario (``planner_critic``) under its own ceiling
(``max_handoffs=8``), through the real openai SDK against an embedded fake
LLM server, with OpenTelemetry's httpx instrumentation on, so each call that
is sent has its HTTP client span. Prints one JSON line: the chain and trace
ids, the trip and how many model calls the server received.
"""

from __future__ import annotations

import json

from _export import tracer_provider
from opentelemetry import trace

provider = tracer_provider()
trace.set_tracer_provider(provider)

import openai  # noqa: E402

from veronica_otel import BudgetExceededError, ExecutionContext  # noqa: E402
from veronica_otel.cli._demo_scenarios import SCENARIOS, planner_critic  # noqa: E402
from veronica_otel.instrumentors.httpx import HTTPXInstrumentor  # noqa: E402
from veronica_otel.instrumentors.openai import OpenAIInstrumentor  # noqa: E402
from veronica_otel.testing import FakeLLMServer  # noqa: E402

OpenAIInstrumentor().instrument()
HTTPXInstrumentor().instrument(enable_otel_http=True)  # the POST span under each call


def main() -> None:
    config = next(s.config for s in SCENARIOS if s.run is planner_critic)
    with FakeLLMServer(output_tokens=40) as server:
        client = openai.OpenAI(base_url=server.openai_base_url, api_key="fake", max_retries=0)
        trip = None
        with ExecutionContext(config, name="planner-critic") as ctx:
            trace_id = trace.get_current_span().get_span_context().trace_id
            try:
                planner_critic(client)
            except BudgetExceededError as exc:
                trip = exc.reason
        client.close()
        sent = server.request_count
    provider.shutdown()  # flush to the collector before the report
    report = {"chain_id": ctx.chain_id, "trace_id": f"{trace_id:032x}", "trip": trip}
    print(json.dumps({**report, "sent": sent}))


if __name__ == "__main__":
    main()
