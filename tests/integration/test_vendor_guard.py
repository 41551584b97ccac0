"""The HTTP vendor guard: raw HTTP clients (httpx2, httpx, requests, urllib3, aiohttp).

Nothing here goes through an SDK adapter: the guard under them admits each
vendor request, and what reached the provider is counted at the server.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
import httpx
import httpx2
import pytest
import requests
import urllib3

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel._pricing import default_price_table
from veronica_otel._units import nano_to_usd
from veronica_otel.instrumentors._adapter import ProviderAdapter, Request, wrapper
from veronica_otel.instrumentors._common import ContainedCall
from veronica_otel.instrumentors._hooks import InstrumentationError
from veronica_otel.instrumentors.aiohttp import AioHTTPInstrumentor
from veronica_otel.instrumentors.httpx import HTTPXInstrumentor
from veronica_otel.instrumentors.requests import RequestsInstrumentor
from veronica_otel.instrumentors.urllib3 import URLLib3Instrumentor
from veronica_otel.testing import FakeLLMServer

pytestmark = pytest.mark.fake_llm(output_tokens=5)

CHAT = "/v1/chat/completions"
MODEL = "gpt-4o-mini"
CLAUDE = "claude-3-5-haiku-latest"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}


def _price(provider: str, model: str, inp: int, out: int) -> float:
    prices = default_price_table().lookup(provider, model)
    assert prices is not None
    return nano_to_usd(prices.cost_nano(inp, out))


def _billed_cost(server: FakeLLMServer, provider: str) -> float:
    return sum(_price(provider, b.model, b.input_tokens, b.output_tokens) for b in server.billed)


@pytest.fixture
def instrument() -> Iterator[Callable[..., None]]:
    """Turn instrumentors on (with arguments); all off after the test."""
    done: list[Any] = []

    def on(*instrumentors: Any, **kwargs: Any) -> None:
        for instrumentor in instrumentors:
            instrumentor.instrument(**kwargs)
            done.append(instrumentor)

    yield on
    for instrumentor in reversed(done):
        instrumentor.uninstrument()


@pytest.fixture
def guard(instrument: Callable[..., None]) -> None:
    instrument(HTTPXInstrumentor(), RequestsInstrumentor(), AioHTTPInstrumentor())


def _post_httpx2(url: str, body: dict[str, Any]) -> dict[str, Any]:
    return httpx2.post(url, json=body).json()  # type: ignore[no-any-return]


def _post_httpx(url: str, body: dict[str, Any]) -> dict[str, Any]:
    return httpx.post(url, json=body).json()  # type: ignore[no-any-return]


def _post_requests(url: str, body: dict[str, Any]) -> dict[str, Any]:
    return requests.post(url, json=body, timeout=10).json()  # type: ignore[no-any-return]


def _post_urllib3(url: str, body: dict[str, Any]) -> dict[str, Any]:
    return urllib3.request("POST", url, json=body).json()  # type: ignore[no-any-return]


SYNC_CLIENTS = {
    "httpx2": _post_httpx2,
    "httpx": _post_httpx,
    "requests": _post_requests,
    "urllib3": _post_urllib3,
}


# -- steps and cost, sync ---------------------------------------------------------------


@pytest.mark.usefixtures("guard")
@pytest.mark.parametrize("client", sorted(SYNC_CLIENTS))
def test_max_steps_lets_exactly_n_requests_reach_the_server(
    server: FakeLLMServer, client: str, instrument: Callable[..., None]
) -> None:
    if client == "urllib3":
        instrument(URLLib3Instrumentor())
    post = SYNC_CLIENTS[client]
    url = server.openai_base_url + "/chat/completions"
    with ExecutionContext(ExecutionConfig(max_steps=3)) as ctx:
        for _ in range(3):
            assert post(url, BODY)["usage"]["completion_tokens"] == 5
        with pytest.raises(BudgetExceededError) as denied:
            post(url, BODY)
        assert denied.value.reason == "steps"
        assert ctx.snapshot().steps == 3
    assert server.count(CHAT) == 3


@pytest.mark.usefixtures("guard")
@pytest.mark.parametrize("client", ["httpx2", "requests"])
def test_cost_ceiling_holds_with_openai_usage(server: FakeLLMServer, client: str) -> None:
    post = SYNC_CLIENTS[client]
    url = server.openai_base_url + "/chat/completions"
    ceiling = 6e-5
    with ExecutionContext(ExecutionConfig(max_cost_usd=ceiling)) as ctx:
        with pytest.raises(BudgetExceededError) as denied:
            for _ in range(100):
                post(url, BODY)
        assert denied.value.reason == "cost"
        spent = ctx.snapshot().cost_usd
    sent = server.count(CHAT)
    assert 2 <= sent < 100
    # Committed from each reply's usage, not from the reservations.
    assert spent == pytest.approx(_billed_cost(server, "openai"))
    assert spent <= ceiling


@pytest.mark.usefixtures("guard")
@pytest.mark.parametrize("client", ["httpx2", "requests"])
def test_cost_is_committed_from_anthropic_usage(server: FakeLLMServer, client: str) -> None:
    body = {"model": CLAUDE, "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        reply = SYNC_CLIENTS[client](server.base_url + "/v1/messages", body)
        assert reply["usage"]["output_tokens"] == 5
        snap = ctx.snapshot()
    billed = server.billed[-1]
    assert snap.cost_usd == pytest.approx(
        _price("anthropic", CLAUDE, billed.input_tokens, billed.output_tokens)
    )
    assert snap.tokens == billed.input_tokens + billed.output_tokens


@pytest.mark.usefixtures("guard")
def test_an_uncapped_request_reserves_the_models_largest_output(server: FakeLLMServer) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    # gpt-4o-mini writes up to 16,384 tokens: 0.0098 USD; a ceiling below it denies.
    url = server.openai_base_url + "/chat/completions"
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=0.005)),
        pytest.raises(BudgetExceededError) as denied,
    ):
        httpx2.post(url, json=body)
    assert denied.value.reason == "cost"
    assert server.request_count == 0
    with (
        ExecutionContext(ExecutionConfig(max_tokens=10_000)),
        pytest.raises(BudgetExceededError) as denied,
    ):
        httpx2.post(url, json=body)
    assert denied.value.reason == "tokens"
    assert server.request_count == 0


# -- streams ------------------------------------------------------------------------------


@pytest.mark.usefixtures("guard")
@pytest.mark.parametrize("client", ["httpx2", "requests"])
def test_a_stream_is_committed_from_its_final_usage(server: FakeLLMServer, client: str) -> None:
    body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
    url = server.openai_base_url + "/chat/completions"
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        if client == "httpx2":
            with httpx2.stream("POST", url, json=body) as response:
                lines = list(response.iter_lines())
        else:
            with requests.post(url, json=body, stream=True, timeout=10) as response:
                lines = list(response.iter_lines())
        text = [line.decode() if isinstance(line, bytes) else line for line in lines]
        assert "data: [DONE]" in text
        snap = ctx.snapshot()
    billed = server.billed[-1]
    assert snap.tokens == billed.input_tokens + billed.output_tokens
    assert snap.cost_usd == pytest.approx(_billed_cost(server, "openai"))


@pytest.mark.usefixtures("guard")
def test_an_anthropic_stream_is_committed_from_message_delta(server: FakeLLMServer) -> None:
    body = {
        "model": CLAUDE,
        "max_tokens": 50,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        with httpx2.stream("POST", server.base_url + "/v1/messages", json=body) as response:
            events = [line for line in response.iter_lines() if line.startswith("event:")]
        snap = ctx.snapshot()
    assert events[-1] == "event: message_stop"
    billed = server.billed[-1]
    assert snap.tokens == billed.input_tokens + billed.output_tokens


@pytest.mark.usefixtures("guard")
def test_a_stream_without_usage_costs_its_reservation(server: FakeLLMServer) -> None:
    body = {**BODY, "stream": True}  # no include_usage: the usage never arrives
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        with httpx2.stream("POST", server.openai_base_url + "/chat/completions", json=body) as r:
            list(r.iter_lines())
        snap = ctx.snapshot()
    billed = server.billed[-1]
    assert snap.tokens > billed.input_tokens + billed.output_tokens
    assert snap.tokens >= 10  # at least the cap, plus an input bound over the real input


@pytest.mark.usefixtures("guard")
@pytest.mark.parametrize("client", ["httpx2", "requests"])
def test_a_stream_is_cut_at_the_next_chunk_when_the_chain_trips(
    server: FakeLLMServer, client: str
) -> None:
    body = {**BODY, "max_tokens": 50, "stream": True, "stream_options": {"include_usage": True}}
    server.set_chunk_delay(0.001)
    url = server.openai_base_url + "/chat/completions"
    got: list[Any] = []
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        with pytest.raises(BudgetExceededError):
            if client == "httpx2":
                with httpx2.stream("POST", url, json=body) as response:
                    for chunk in response.iter_raw():
                        got.append(chunk)
                        ctx.cancel()  # the chain trips while the stream is read
            else:
                with requests.post(url, json=body, stream=True, timeout=10) as response:
                    for chunk in response.iter_content(chunk_size=None):
                        got.append(chunk)
                        ctx.cancel()
        snap = ctx.snapshot()
    assert len(got) == 1  # nothing after the trip
    assert snap.tokens > 0  # the reservation: its usage never arrived


# -- what cannot be priced, and the modes --------------------------------------------------


@pytest.mark.usefixtures("guard")
@pytest.mark.parametrize("client", ["httpx2", "requests"])
def test_an_unpriced_model_is_refused_under_a_cost_ceiling(
    server: FakeLLMServer, client: str
) -> None:
    body = {**BODY, "model": "my-own-finetune"}
    url = server.openai_base_url + "/chat/completions"
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)),
        pytest.raises(BudgetExceededError) as denied,
    ):
        SYNC_CLIENTS[client](url, body)
    assert denied.value.reason == "cost"
    assert "my-own-finetune" in str(denied.value)
    assert server.request_count == 0
    # No cost ceiling: counted as a step, sent.
    with ExecutionContext(ExecutionConfig(max_steps=5)) as ctx:
        SYNC_CLIENTS[client](server.openai_base_url + "/chat/completions", body)
        assert ctx.snapshot().steps == 1
    assert server.request_count == 1


def test_an_unreadable_body_or_endpoint_to_a_vendor_host_is_refused_under_a_ceiling(
    server: FakeLLMServer, instrument: Callable[..., None]
) -> None:
    instrument(HTTPXInstrumentor(), vendor_hosts=[f"127.0.0.1:{server.port}"])
    url = server.openai_base_url + "/chat/completions"

    def chunks() -> Iterator[bytes]:
        yield json.dumps(BODY).encode()

    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)):
        with pytest.raises(BudgetExceededError, match="cannot be read") as denied:
            httpx2.post(url, content=chunks())
        assert denied.value.reason == "cost"
        with pytest.raises(BudgetExceededError, match="images/generations"):
            httpx2.post(server.openai_base_url + "/images/generations", json={"prompt": "x"})
        with pytest.raises(BudgetExceededError, match="v1/unknown"):
            httpx2.post(server.base_url + "/v1/unknown", json={"model": MODEL})
        # Not billed: passes untouched.
        httpx2.post(server.base_url + "/v1/messages/count_tokens", json={"model": CLAUDE})
        httpx2.get(server.base_url + "/v1/models")
    assert server.request_count == 2


def test_refuse_mode_raises_for_every_unadmitted_vendor_request(
    server: FakeLLMServer, instrument: Callable[..., None]
) -> None:
    instrument(HTTPXInstrumentor(), RequestsInstrumentor(), vendor_guard="refuse")
    with ExecutionContext(ExecutionConfig(max_steps=10)):
        with pytest.raises(InstrumentationError, match="VERONICA_VENDOR_GUARD=refuse"):
            httpx2.post(server.openai_base_url + "/chat/completions", json=BODY)
        with pytest.raises(InstrumentationError):
            requests.post(server.openai_base_url + "/chat/completions", json=BODY, timeout=10)
        httpx2.get(server.base_url + "/health")  # not a vendor call
    assert server.request_count == 1


def test_off_mode_leaves_vendor_requests_alone(
    server: FakeLLMServer, instrument: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VERONICA_VENDOR_GUARD", "off")
    instrument(HTTPXInstrumentor())
    with ExecutionContext(ExecutionConfig(max_steps=1)) as ctx:
        for _ in range(3):
            httpx2.post(server.openai_base_url + "/chat/completions", json=BODY)
        assert ctx.snapshot().steps == 0
    assert server.request_count == 3


def test_a_malformed_mode_is_an_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VERONICA_VENDOR_GUARD", "sometimes")
    for instrumentor in (HTTPXInstrumentor(), AioHTTPInstrumentor(), URLLib3Instrumentor()):
        with pytest.raises(ValueError, match="VERONICA_VENDOR_GUARD"):
            instrumentor.instrument()
        instrumentor.uninstrument()


# -- counted once, and only vendors ---------------------------------------------------------


class _TinyAdapter(ProviderAdapter):
    provider = "openai"

    def read_request(
        self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], method: str
    ) -> Request | None:
        return Request("chat", kwargs["model"], kwargs["messages"], 1, kwargs["max_tokens"])

    def read_reply(self, call: ContainedCall, reply: Any) -> None:
        usage = reply["usage"]
        call.set_usage(usage["prompt_tokens"], usage["completion_tokens"])


class _TinySDK:
    """An SDK whose one method sends through httpx2 or requests, contained by an adapter."""

    def __init__(self, url: str, lib: str) -> None:
        self.url, self.lib = url, lib

    def chat(self, *, model: str, messages: list[Any], max_tokens: int) -> Any:
        body = {"model": model, "messages": messages, "max_tokens": max_tokens}
        if self.lib == "httpx2":
            return httpx2.post(self.url, json=body).json()
        return requests.post(self.url, json=body, timeout=10).json()


@pytest.mark.usefixtures("guard")
@pytest.mark.parametrize("lib", ["httpx2", "requests"])
def test_a_call_an_adapter_admitted_is_counted_once(server: FakeLLMServer, lib: str) -> None:
    contained = wrapper(_TinyAdapter(), "chat")
    sdk = _TinySDK(server.openai_base_url + "/chat/completions", lib)

    def chat() -> Any:
        return contained(
            sdk.chat, sdk, (), {"model": MODEL, "messages": BODY["messages"], "max_tokens": 10}
        )

    with ExecutionContext(ExecutionConfig(max_steps=2, max_cost_usd=1.0)) as ctx:
        chat()
        chat()
        with pytest.raises(BudgetExceededError):
            chat()
        snap = ctx.snapshot()
    assert server.count(CHAT) == 2
    assert snap.steps == 2
    assert snap.cost_usd == pytest.approx(_billed_cost(server, "openai"))


@pytest.mark.usefixtures("guard")
def test_non_vendor_requests_are_untouched(server: FakeLLMServer) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=1, max_cost_usd=1.0)) as ctx:
        httpx2.get(server.base_url + "/health")
        requests.get(server.base_url + "/health", timeout=10)
        # A provider's path with a body unlike its API's: not a vendor call.
        httpx2.post(server.openai_base_url + "/chat/completions", json={"hello": "world"})
        httpx2.post(server.base_url + "/api/orders", json={"model": MODEL})
        assert ctx.snapshot().steps == 0
    assert server.request_count == 4


# -- threads and asyncio ------------------------------------------------------------------


@pytest.mark.usefixtures("guard")
def test_threads_share_the_chain_limit(server: FakeLLMServer) -> None:
    url = server.openai_base_url + "/chat/completions"
    denied = 0
    lock = threading.Lock()

    def work(i: int) -> None:
        nonlocal denied
        try:
            (_post_httpx2 if i % 2 else _post_requests)(url, BODY)
        except BudgetExceededError:
            with lock:
                denied += 1

    with ExecutionContext(ExecutionConfig(max_steps=5)) as ctx:
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(work, range(12)))
        assert ctx.snapshot().steps == 5
    assert server.count(CHAT) == 5
    assert denied == 7


@pytest.mark.asyncio
@pytest.mark.usefixtures("guard")
async def test_asyncio_clients_share_the_chain_limit(server: FakeLLMServer) -> None:
    url = server.openai_base_url + "/chat/completions"

    async def with_aiohttp(session: aiohttp.ClientSession) -> int:
        async with session.post(url, json=BODY) as response:
            return (await response.json())["usage"]["completion_tokens"]  # type: ignore[no-any-return]

    async def with_httpx(client: httpx.AsyncClient) -> int:
        return (await client.post(url, json=BODY)).json()["usage"]["completion_tokens"]  # type: ignore[no-any-return]

    async with ExecutionContext(ExecutionConfig(max_steps=6, max_cost_usd=1.0)) as ctx:
        async with aiohttp.ClientSession() as session, httpx.AsyncClient() as client:
            results = await asyncio.gather(
                *(with_aiohttp(session) if i % 2 else with_httpx(client) for i in range(10)),
                return_exceptions=True,
            )
        snap = ctx.snapshot()
    assert sum(r == 5 for r in results) == 6
    assert all(isinstance(r, BudgetExceededError) for r in results if r != 5)
    assert server.count(CHAT) == 6
    assert snap.steps == 6
    assert snap.cost_usd == pytest.approx(_billed_cost(server, "openai"))


@pytest.mark.asyncio
@pytest.mark.usefixtures("guard")
async def test_an_aiohttp_stream_is_committed_from_its_usage(server: FakeLLMServer) -> None:
    body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
    async with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        url = server.openai_base_url + "/chat/completions"
        async with aiohttp.ClientSession() as session, session.post(url, json=body) as r:
            lines = [line async for line in r.content]
        snap = ctx.snapshot()
    assert b"data: [DONE]" in [line.strip() for line in lines]
    billed = server.billed[-1]
    assert snap.tokens == billed.input_tokens + billed.output_tokens
