"""Process A of the two-service test: opens a chain, asks the LLM itself, then
calls service B with httpx2 and asks the LLM once more. Prints a JSON report.

The chain reaches B through ``HTTPXInstrumentor`` (allow-list from
``VERONICA_PROPAGATE_HOSTS``, key from ``VERONICA_GRANT_KEY``); B's spend comes
back in its ``veronica-spent`` header and is committed here.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from _export import tracer_provider  # spans to OTLP when asked
from opentelemetry import trace

trace.set_tracer_provider(tracer_provider())  # recorded, so traceparent is sent

import httpx2  # noqa: E402
import openai  # noqa: E402

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext  # noqa: E402
from veronica_otel.instrumentors.httpx import HTTPXInstrumentor  # noqa: E402
from veronica_otel.instrumentors.openai import OpenAIInstrumentor  # noqa: E402

OpenAIInstrumentor().instrument()
HTTPXInstrumentor().instrument(enable_otel_http=True)  # traceparent too, as asked


def snap(ctx: ExecutionContext) -> dict[str, Any]:
    s = ctx.snapshot()
    return {"steps": s.steps, "cost_usd": s.cost_usd, "tokens": s.tokens, "aborted": s.aborted}


def ask(llm: openai.OpenAI, text: str) -> None:
    llm.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": text}])


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    llm = openai.OpenAI(max_retries=0)
    report: dict[str, Any] = {}
    with ExecutionContext(ExecutionConfig(max_steps=3, max_cost_usd=1.0)) as ctx:
        report["chain_id"] = ctx.chain_id
        ask(llm, "A step")
        report["after_own_call"] = snap(ctx)
        with httpx2.Client(base_url=os.environ["SERVICE_B_URL"], timeout=30) as http:
            response = http.get("/agent", params={"calls": calls})
        report["b_status"] = response.status_code
        report["b"] = response.json()
        report["after_b"] = snap(ctx)
        try:
            ask(llm, "A again")
            report["last_call"] = "sent"
        except BudgetExceededError as exc:
            report["last_call"] = exc.reason
        report["final"] = snap(ctx)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
