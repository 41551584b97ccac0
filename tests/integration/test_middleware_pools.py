"""Middleware ``pools=``: each request spends from its tenant's pool, picked from the request.

A Starlette app (ASGI) and a plain WSGI app each make one real openai SDK
call per request to the fake server, whose counts are the truth. Tenant
acme runs out of its hourly pool and is refused before the handler runs,
with 429, ``Retry-After`` and the pool named; tenant bob keeps working.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from typing import Any

import httpx2
import openai
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from tests._clock import FakeClock
from veronica_otel import BudgetPool, ExecutionConfig, LocalLedger
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.middleware import VeronicaASGIMiddleware, VeronicaWSGIMiddleware
from veronica_otel.testing import FakeLLMServer

CHAT = "/v1/chat/completions"
CONFIG = ExecutionConfig(max_steps=10)


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    try:
        with FakeLLMServer(output_tokens=5) as fake:
            yield fake
    finally:
        instrumentor.uninstrument()


class Tenants:
    """Two tenants' pools on one ledger whose clock the test moves."""

    def __init__(self) -> None:
        self.clock = FakeClock(1000.0)
        self.ledger = LocalLedger(clock=self.clock)
        self.pools = {
            "acme": BudgetPool("tenant:acme", max_steps=3, window="1h", ledger=self.ledger),
            "bob": BudgetPool("tenant:bob", max_steps=100, window="1h", ledger=self.ledger),
            "tiny": BudgetPool("tenant:tiny", max_cost_usd=1e-6, window="1h", ledger=self.ledger),
        }
        self.handled = 0

    def for_headers(self, tenant: str) -> list[BudgetPool]:
        return [self.pools[tenant]]  # an unknown tenant: KeyError, refused with 503


def asgi_pools(tenants: Tenants) -> Any:
    def pools(scope: dict[str, Any]) -> list[BudgetPool]:
        headers = dict(scope["headers"])
        return tenants.for_headers(headers[b"x-tenant"].decode())

    return pools


def wsgi_pools(tenants: Tenants) -> Any:
    return lambda environ: tenants.for_headers(environ["HTTP_X_TENANT"])


def chat(client: openai.OpenAI) -> str:
    completion = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    return completion.id


@pytest.fixture
def tenants() -> Tenants:
    return Tenants()


@pytest.fixture
def asgi(tenants: Tenants, server: FakeLLMServer) -> Iterator[TestClient]:
    async def handle(request: Request) -> JSONResponse:
        tenants.handled += 1
        async with openai.AsyncOpenAI(
            base_url=server.openai_base_url, api_key="t", max_retries=0
        ) as llm:  # one per request: the test client's event loop is not ours to keep
            completion = await llm.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=5
            )
        return JSONResponse({"id": completion.id})

    app = Starlette(
        routes=[Route("/ask", handle)],
        middleware=[
            Middleware(
                VeronicaASGIMiddleware,  # type: ignore[arg-type]
                config=CONFIG,
                ledger=tenants.ledger,
                pools=asgi_pools(tenants),
            )
        ],
    )
    with TestClient(app) as client:
        yield client


@pytest.fixture
def wsgi(tenants: Tenants, server: FakeLLMServer) -> Iterator[httpx2.Client]:
    llm = openai.OpenAI(base_url=server.openai_base_url, api_key="t", max_retries=0)

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        tenants.handled += 1
        body = json.dumps({"id": chat(llm)}).encode()
        start_response("200 OK", [("Content-Type", "application/json")])
        return [body]

    wrapped = VeronicaWSGIMiddleware(app, CONFIG, ledger=tenants.ledger, pools=wsgi_pools(tenants))
    transport = httpx2.WSGITransport(app=wrapped, raise_app_exceptions=False)
    with httpx2.Client(transport=transport, base_url="http://testserver") as client:
        yield client
    llm.close()


def ask(client: Any, tenant: str) -> Any:
    return client.get("/ask", headers={"x-tenant": tenant})


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_one_tenant_stops_at_its_pool_while_the_other_keeps_working(
    kind: str, request: pytest.FixtureRequest, tenants: Tenants, server: FakeLLMServer
) -> None:
    client = request.getfixturevalue(kind)
    assert [ask(client, "acme").status_code for _ in range(3)] == [200] * 3
    refused = ask(client, "acme")
    assert [ask(client, "bob").status_code for _ in range(5)] == [200] * 5
    assert server.count(CHAT) == 8
    assert tenants.handled == 8  # acme's fourth never reached the handler
    assert refused.status_code == 429
    body = refused.json()
    assert body["error"] == "budget_exceeded" and body["reason"] == "steps"
    assert body["pool"] == "tenant:acme"
    assert 3540 <= body["retry_after_s"] <= 3600  # the first step leaves the hour then
    assert refused.headers["retry-after"] == str(math.ceil(body["retry_after_s"]))
    assert tenants.pools["acme"].snapshot().steps == 3
    assert tenants.pools["bob"].snapshot().steps == 5
    tenants.clock.advance(body["retry_after_s"])  # the window has slid: acme again
    assert ask(client, "acme").status_code == 200
    assert server.count(CHAT) == 9


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_a_pool_denial_in_the_handler_is_a_429_naming_the_pool(
    kind: str, request: pytest.FixtureRequest, tenants: Tenants, server: FakeLLMServer
) -> None:
    client = request.getfixturevalue(kind)
    refused = ask(client, "tiny")  # room for nothing a call could cost
    assert refused.status_code == 429
    assert refused.json()["pool"] == "tenant:tiny"
    assert refused.json()["reason"] == "cost"
    assert "retry-after" not in refused.headers  # no spend to leave the window: no date
    assert tenants.handled == 1 and server.count(CHAT) == 0


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_a_pools_callable_that_raises_fails_closed_before_the_handler(
    kind: str, request: pytest.FixtureRequest, tenants: Tenants, server: FakeLLMServer
) -> None:
    client = request.getfixturevalue(kind)
    refused = ask(client, "mallory")
    assert refused.status_code == 503
    assert refused.json() == {
        "error": "budget pools unavailable",
        "reason": "the pools= callable failed (KeyError); failing closed",
        "chain_id": None,
    }
    assert tenants.handled == 0 and server.count(CHAT) == 0


def test_pools_must_be_callable() -> None:
    with pytest.raises(TypeError, match="pools must be a callable of the request"):
        VeronicaWSGIMiddleware(lambda e, s: [], pools=[BudgetPool("x", max_steps=1)])  # type: ignore[arg-type]
