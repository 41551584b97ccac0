"""Outbound propagation: the chain's signed grant goes to allowed hosts only, never to
LLM vendors, and the downstream service's spend comes back into the chain.

Real clients (httpx2 sync and async, httpx, requests, the openai SDK) against
real local HTTP servers: a small recording service, and the fake LLM server.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import httpx2
import openai
import pytest
import requests
from opentelemetry import baggage
from opentelemetry import context as otel_context
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)

from veronica_otel import ExecutionConfig, ExecutionContext, WrapOptions
from veronica_otel._grants import Grant, NonceCache, Spent, sign_spent, verify_grant
from veronica_otel.instrumentors.httpx import HTTPXInstrumentor
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.instrumentors.requests import RequestsInstrumentor
from veronica_otel.testing import FakeLLMServer

KEY = "outbound-test-key-0123456789abcd"
CENT = WrapOptions(operation_name="local step", cost_estimate_hint=0.01)


class Service:
    """A downstream service that records headers and answers with a signed spend."""

    def __init__(self, spent: Spent | None = None, key: str = KEY) -> None:
        self.spent = spent
        self.key = key
        self.headers: list[dict[str, str]] = []
        service = self

        class Handler(BaseHTTPRequestHandler):
            disable_nagle_algorithm = True

            def do_GET(self) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                service.headers.append(headers)
                if self.path.startswith("/redirect?to="):
                    self.send_response(302)
                    self.send_header("Location", self.path.split("=", 1)[1])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = b"{}"
                self.send_response(200)
                grant = service.grant(headers)
                if grant is not None and service.spent is not None:
                    self.send_header(
                        "veronica-spent",
                        sign_spent(service.spent, grant.nonce, grant.audience, service.key),
                    )
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    @staticmethod
    def entries(headers: dict[str, str]) -> dict[str, str]:
        extracted = W3CBaggagePropagator().extract(headers, otel_context.Context())
        return {k: str(v) for k, v in baggage.get_all(extracted).items()}

    def grant(self, headers: dict[str, str]) -> Grant | None:
        raw = self.entries(headers).get("veronica.grant")
        if not raw:
            return None
        return verify_grant(raw, KEY, audience=f"127.0.0.1:{self.port}", replay_cache=NonceCache())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def service() -> Iterator[Service]:
    srv = Service(Spent(cost_nano=30_000_000, tokens=100, steps=2, retries=1))
    yield srv
    srv.close()


@pytest.fixture
def other_service() -> Iterator[Service]:
    srv = Service(Spent(steps=1))
    yield srv
    srv.close()


@pytest.fixture
def instrument() -> Iterator[Callable[..., None]]:
    used: list[BaseInstrumentor] = []

    def go(instrumentor: BaseInstrumentor, **kwargs: Any) -> None:
        instrumentor.instrument(**kwargs)
        used.append(instrumentor)

    yield go
    for instrumentor in reversed(used):
        instrumentor.uninstrument()


@pytest.fixture
def inbound_baggage() -> Iterator[None]:
    """The context of a request that arrived with veronica baggage and an app entry."""
    ctx = baggage.set_baggage("veronica.grant", "from-upstream")
    ctx = baggage.set_baggage("veronica.chain", "upstream", ctx)
    token = otel_context.attach(baggage.set_baggage("tenant", "acme", ctx))
    yield
    otel_context.detach(token)


def check_grant_and_spend(service: Service, ctx: ExecutionContext) -> None:
    entries = Service.entries(service.headers[-1])
    assert entries["veronica.chain"] == ctx.chain_id
    assert entries["veronica.depth"] == "0"
    grant = verify_grant(entries["veronica.grant"], KEY, audience=None, replay_cache=NonceCache())
    assert grant is not None
    assert (grant.chain_id, grant.depth, grant.steps, grant.retries) == (ctx.chain_id, 0, 4, 4)
    assert (grant.cost_nano, grant.carved) == (990_000_000, True)  # all that was left
    assert grant.audience == f"127.0.0.1:{service.port}"
    snap = ctx.snapshot()  # one local step + what the service reported, the rest released
    assert (snap.steps, snap.tokens, snap.reserved_usd) == (3, 100, 0)
    assert snap.cost_usd == pytest.approx(0.04)


def chain() -> ExecutionContext:
    return ExecutionContext(ExecutionConfig(max_steps=5, max_retries_total=4, max_cost_usd=1.0))


@pytest.mark.usefixtures("tracer_provider")
def test_httpx2_sends_the_grant_to_an_allowed_host_and_commits_the_spend(
    service: Service, instrument: Callable[..., None]
) -> None:
    instrument(
        HTTPXInstrumentor(), propagate_hosts=["127.0.0.1"], grant_key=KEY, enable_otel_http=True
    )
    with chain() as ctx, httpx2.Client() as client:
        ctx.begin_call("tool", CENT).finish()
        client.get(service.url)
        check_grant_and_spend(service, ctx)
    assert "traceparent" in service.headers[-1]  # OpenTelemetry's own injection, as asked


@pytest.mark.usefixtures("tracer_provider")
def test_opentelemetry_http_instrumentation_is_not_turned_on_unless_asked(
    service: Service, instrument: Callable[..., None]
) -> None:
    instrument(HTTPXInstrumentor(), propagate_hosts=["127.0.0.1"], grant_key=KEY)
    instrument(RequestsInstrumentor(), propagate_hosts=["127.0.0.1"], grant_key=KEY)
    with chain() as ctx, httpx2.Client() as client, requests.Session() as session:
        client.get(service.url)
        session.get(service.url, timeout=10)
        for headers in service.headers:
            assert Service.entries(headers)["veronica.chain"] == ctx.chain_id
            assert "traceparent" not in headers


@pytest.mark.asyncio
async def test_async_httpx2(service: Service, instrument: Callable[..., None]) -> None:
    instrument(HTTPXInstrumentor(), propagate_hosts="127.0.0.1", grant_key=KEY)
    with chain() as ctx:
        ctx.begin_call("tool", CENT).finish()
        async with httpx2.AsyncClient() as client:
            await client.get(service.url)
        check_grant_and_spend(service, ctx)


def test_legacy_httpx(service: Service, instrument: Callable[..., None]) -> None:
    instrument(HTTPXInstrumentor(), propagate_hosts=f"127.0.0.1:{service.port}", grant_key=KEY)
    with chain() as ctx, httpx.Client() as client:
        ctx.begin_call("tool", CENT).finish()
        client.get(service.url)
        check_grant_and_spend(service, ctx)


@pytest.mark.usefixtures("tracer_provider")
def test_requests(service: Service, instrument: Callable[..., None]) -> None:
    instrument(
        RequestsInstrumentor(), propagate_hosts="127.0.0.*", grant_key=KEY, enable_otel_http=True
    )
    with chain() as ctx, requests.Session() as session:
        ctx.begin_call("tool", CENT).finish()
        session.get(service.url, timeout=10)
        check_grant_and_spend(service, ctx)
    assert "traceparent" in service.headers[-1]


@pytest.mark.usefixtures("inbound_baggage")
def test_a_host_not_on_the_allow_list_gets_no_veronica_baggage(
    service: Service, instrument: Callable[..., None]
) -> None:
    instrument(
        HTTPXInstrumentor(),
        propagate_hosts="orders.internal",
        grant_key=KEY,
        enable_otel_http=True,  # it injects the context's baggage: the app's entry stays
    )
    with chain() as ctx, httpx2.Client() as client:
        client.get(service.url)
        assert Service.entries(service.headers[-1]) == {"tenant": "acme"}
        assert ctx.snapshot().steps == 0


@pytest.mark.usefixtures("inbound_baggage", "tracer_provider")
def test_llm_vendors_never_get_veronica_baggage_even_on_an_allowed_host(
    instrument: Callable[..., None],
) -> None:
    instrument(OpenAIInstrumentor())
    instrument(
        HTTPXInstrumentor(), propagate_hosts="127.0.0.1", grant_key=KEY, enable_otel_http=True
    )
    with FakeLLMServer(output_tokens=5) as llm, chain():
        # Closed here: an open client's socket, left to garbage collection, fails
        # whichever later test a collection runs in (filterwarnings = error).
        with openai.OpenAI(base_url=llm.openai_base_url, api_key="test", max_retries=0) as client:
            client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
            )
        # A raw request to the same server, from outside the SDK, is not a vendor call.
        httpx2.get(f"{llm.base_url}/health")
        sdk_call, raw_call = llm.requests
    assert "traceparent" in sdk_call.headers
    assert "veronica" not in json.dumps(dict(sdk_call.headers))
    # No baggage at all: OpenTelemetry's instrumentation would forward the app's too.
    assert "baggage" not in sdk_call.headers
    assert "veronica.grant" in raw_call.headers["baggage"]
    assert "tenant=acme" in raw_call.headers["baggage"]


@pytest.mark.usefixtures("inbound_baggage", "tracer_provider")
@pytest.mark.parametrize("client", ["httpx2", "requests"])
def test_a_vendor_host_gets_no_baggage_at_all_whoever_injects_it(
    service: Service, instrument: Callable[..., None], client: str
) -> None:
    # OpenTelemetry's HTTP instrumentations on, as opentelemetry-instrument does:
    # they inject every baggage entry of the context; the vendor rule removes them.
    vendor = [f"127.0.0.1:{service.port}"]
    instrument(HTTPXInstrumentor(), vendor_hosts=vendor, enable_otel_http=True)
    instrument(RequestsInstrumentor(), vendor_hosts=vendor, enable_otel_http=True)
    with chain():
        if client == "httpx2":
            httpx2.get(service.url)
        else:
            requests.get(service.url, timeout=10)
    assert "traceparent" in service.headers[-1]
    assert "baggage" not in service.headers[-1]


def test_vendor_hosts_are_never_sent_a_grant(
    service: Service, instrument: Callable[..., None]
) -> None:
    instrument(
        HTTPXInstrumentor(),
        propagate_hosts="127.0.0.1",
        vendor_hosts=[f"127.0.0.1:{service.port}"],
        grant_key=KEY,
    )
    with chain(), httpx2.Client() as client:
        client.get(service.url)
    assert "veronica" not in json.dumps(service.headers[-1])


def test_each_redirect_hop_is_checked(
    service: Service, other_service: Service, instrument: Callable[..., None]
) -> None:
    instrument(HTTPXInstrumentor(), propagate_hosts=f"127.0.0.1:{service.port}", grant_key=KEY)
    with chain() as ctx, httpx2.Client(follow_redirects=True) as client:
        client.get(f"{service.url}/redirect?to={other_service.url}/")
        assert "veronica.grant" in service.headers[-1]["baggage"]
        assert "veronica" not in json.dumps(other_service.headers[-1])
        # The redirect answer carried no spend-back: its whole carve is committed.
        assert ctx.snapshot().steps == 5


def test_without_a_key_nothing_is_propagated(
    service: Service, instrument: Callable[..., None], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="veronica_otel.instrumentors"):
        instrument(HTTPXInstrumentor(), propagate_hosts="127.0.0.1")
    assert "VERONICA_GRANT_KEY is not" in caplog.text
    with chain(), httpx2.Client() as client:
        client.get(service.url)
    assert "veronica" not in json.dumps(service.headers[-1])


def test_a_forged_spend_header_is_not_committed(
    instrument: Callable[..., None], caplog: pytest.LogCaptureFixture
) -> None:
    forger = Service(Spent(steps=3), key="someone-elses-key-0123456789abcd")
    try:
        instrument(HTTPXInstrumentor(), propagate_hosts="127.0.0.1", grant_key=KEY)
        with chain() as ctx, httpx2.Client() as client:
            with caplog.at_level(logging.WARNING, logger="veronica_otel.grants"):
                client.get(forger.url)
            assert ctx.snapshot().steps == 5  # not 3: the whole carve is committed
        assert "veronica-spent header not trusted (unknown_key)" in caplog.text
    finally:
        forger.close()


def test_uninstrument_restores_the_transports(instrument: Callable[..., None]) -> None:
    original = httpx2.HTTPTransport.__dict__["handle_request"]
    instrumentor = HTTPXInstrumentor()
    instrumentor.instrument(propagate_hosts="127.0.0.1", grant_key=KEY)
    assert httpx2.HTTPTransport.__dict__["handle_request"] is not original
    instrumentor.uninstrument()
    assert httpx2.HTTPTransport.__dict__["handle_request"] is original


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"propagate_hosts": "bad host"}, "propagate_hosts"),
        ({"propagate_hosts": "h:99999"}, "propagate_hosts"),
        ({"vendor_hosts": ["a/b"]}, "vendor_hosts"),
        ({"grant_key": "short"}, "grant_key"),
        ({"grant_ttl_s": 0}, "grant_ttl_s"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(kwargs: dict[str, Any], message: str) -> None:
    instrumentor = HTTPXInstrumentor()
    with pytest.raises(ValueError, match=message):
        instrumentor.instrument(**kwargs)
    assert not instrumentor.is_instrumented_by_opentelemetry
