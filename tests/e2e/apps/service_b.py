"""Service B of the two-service test: a Starlette app under uvicorn, behind
``VeronicaASGIMiddleware``. Its ``/agent`` handler asks the LLM (the fake server
at ``OPENAI_BASE_URL``) through the openai SDK, as many times as it is told or
until its chain says no. Local limits come from ``VERONICA_*``; the grant keys
from ``VERONICA_GRANT_KEY(S)``, its audience from ``VERONICA_GRANT_AUDIENCE``,
a shared Redis ledger from ``VERONICA_REDIS_URL``. Paths under ``/via-gateway``
pass a gateway that strips the ``veronica-spent`` header. ``/stats`` reports
the grant rejections counted on the ``veronica.grants.rejected`` metric of
this process.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from _export import tracer_provider  # spans to OTLP when asked
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

READER = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[READER]))
trace.set_tracer_provider(tracer_provider())  # recorded, so traceparent is sent
logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")

import openai  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from veronica_otel import BudgetExceededError, current_context  # noqa: E402
from veronica_otel.instrumentors.httpx import HTTPXInstrumentor  # noqa: E402
from veronica_otel.instrumentors.openai import OpenAIInstrumentor  # noqa: E402
from veronica_otel.middleware import VeronicaASGIMiddleware  # noqa: E402

OpenAIInstrumentor().instrument()
# The fake LLM server is on an allowed host (127.0.0.1): only the vendor rule
# keeps the chain's baggage off its requests.
HTTPXInstrumentor().instrument(enable_otel_http=True)  # traceparent too, as asked
llm = openai.AsyncOpenAI(max_retries=0)


async def agent(request: Request) -> JSONResponse:
    ctx = current_context()
    assert ctx is not None
    made, denied = 0, None
    for step in range(int(request.query_params.get("calls", "1"))):
        try:
            await llm.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": f"B step {step}"}]
            )
        except BudgetExceededError as exc:
            denied = exc.reason
            break
        made += 1
    snap = ctx.snapshot()
    return JSONResponse(
        {
            "chain_id": ctx.chain_id,
            "depth": ctx.depth,
            "max_steps": ctx.config.max_steps,
            "made": made,
            "denied": denied,
            "steps": snap.steps,
            "cost_usd": snap.cost_usd,
            "tokens": snap.tokens,
        }
    )


async def stats(request: Request) -> JSONResponse:
    counts: dict[str, int] = {}
    data = READER.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "veronica.grants.rejected":
                    for point in metric.data.data_points:
                        reason = str(point.attributes["veronica.grant.reason"])
                        counts[reason] = counts.get(reason, 0) + int(point.value)
    return JSONResponse(counts)


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


def _ledger() -> Any:
    """The shared Redis ledger when ``VERONICA_REDIS_URL`` is set, else in-process."""
    url = os.environ.get("VERONICA_REDIS_URL")
    if not url:
        return None
    from veronica_otel.distributed import RedisLedger

    return RedisLedger.from_url(url)


class StrippingGateway:
    """A gateway in front of B that drops the ``veronica-spent`` header of every
    answer under ``/via-gateway`` (as some proxies drop unknown headers)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        prefix = "/via-gateway"
        if scope["type"] != "http" or not scope["path"].startswith(prefix):
            await self.app(scope, receive, send)
            return

        async def stripped(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message["headers"] if k != b"veronica-spent"]
                message = {**message, "headers": headers}
            await send(message)

        inner = {**scope, "path": scope["path"][len(prefix) :]}
        await self.app(inner, receive, stripped)


app = StrippingGateway(
    VeronicaASGIMiddleware(
        Starlette(
            routes=[Route("/agent", agent), Route("/stats", stats), Route("/health", health)]
        ),
        ledger=_ledger(),
    )
)
