"""One call, one count (DESIGN G13), with every layer that could count it on.

Each real SDK talks to the fake server with its own adapter on, the HTTP
vendor guard on under it (the fake server's paths are providers' API paths,
so the guard would admit them if the adapter had not), and, in the second
test, an outer ``wrap_llm_call`` around each call. A chain with
``max_steps=2`` must let exactly two requests reach the server and count two
steps; the committed cost is the replies' usage, counted once.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

import httpx
import openai
import pytest

from veronica_otel import (
    BudgetExceededError,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
)
from veronica_otel._pricing import PriceTable, UnitPrices
from veronica_otel.instrumentors.aiohttp import AioHTTPInstrumentor
from veronica_otel.instrumentors.bedrock import BedrockInstrumentor
from veronica_otel.instrumentors.cohere import CohereInstrumentor
from veronica_otel.instrumentors.google_genai import GoogleGenAIInstrumentor
from veronica_otel.instrumentors.httpx import HTTPXInstrumentor
from veronica_otel.instrumentors.litellm import LiteLLMInstrumentor
from veronica_otel.instrumentors.mistralai import MistralAIInstrumentor
from veronica_otel.instrumentors.ollama import OllamaInstrumentor
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.instrumentors.requests import RequestsInstrumentor
from veronica_otel.instrumentors.urllib3 import URLLib3Instrumentor
from veronica_otel.testing import FakeLLMServer

# litellm's own warnings, as its own test module filters them.
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*ReadOnly.*:UserWarning"),
    pytest.mark.filterwarnings("ignore:Accessing the 'model_:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.usefixtures("litellm_leaks_collected"),
]

PROMPT = "hello"
# A local Ollama model has no public price: priced here so cost is counted too.
PRICES = PriceTable({"ollama:llama3.2": UnitPrices.from_usd_per_mtok(0.1, 0.2)})
Call = Callable[[], Any]


@contextlib.contextmanager
def _openai(url: str) -> Iterator[Call]:
    with openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as client:
        yield lambda: client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": PROMPT}], max_tokens=8
        )


@contextlib.contextmanager
def _gemini(url: str) -> Iterator[Call]:
    from google import genai
    from google.genai import types

    with genai.Client(api_key="k", http_options=types.HttpOptions(base_url=url)) as client:
        yield lambda: client.models.generate_content(
            model="gemini-2.0-flash",
            contents=PROMPT,
            config=types.GenerateContentConfig(max_output_tokens=8),
        )


@contextlib.contextmanager
def _bedrock(url: str) -> Iterator[Call]:
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "bedrock-runtime",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        config=Config(retries={"mode": "standard", "max_attempts": 1}),
    )
    try:
        yield lambda: client.converse(
            modelId="anthropic.claude-3-haiku-20240307-v1:0",
            messages=[{"role": "user", "content": [{"text": PROMPT}]}],
            inferenceConfig={"maxTokens": 8},
        )
    finally:
        client.close()


@contextlib.contextmanager
def _mistral(url: str) -> Iterator[Call]:
    from mistralai.client import Mistral

    with Mistral(api_key="k", server_url=url) as client:
        yield lambda: client.chat.complete(
            model="mistral-small-latest",
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=8,
        )


@contextlib.contextmanager
def _cohere(url: str) -> Iterator[Call]:
    import cohere

    with httpx.Client() as http:
        client = cohere.ClientV2(api_key="k", base_url=url, httpx_client=http, max_retries=0)
        yield lambda: client.chat(
            model="command-r-plus-08-2024",
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=8,
        )


@contextlib.contextmanager
def _ollama(url: str) -> Iterator[Call]:
    import ollama

    client = ollama.Client(host=url)
    try:
        yield lambda: client.chat(
            model="llama3.2",
            messages=[{"role": "user", "content": PROMPT}],
            options={"num_predict": 8},
        )
    finally:
        client._client.close()


@contextlib.contextmanager
def _litellm(url: str) -> Iterator[Call]:
    import litellm  # here, not at collection: seconds of CPU in every xdist worker

    yield lambda: litellm.completion(
        model="openai/gpt-4o-mini",
        messages=[{"role": "user", "content": PROMPT}],
        api_base=url + "/v1",
        api_key="k",
        max_retries=0,
        max_tokens=8,
    )


CLIENTS: dict[str, tuple[Callable[[str], contextlib.AbstractContextManager[Call]], Any]] = {
    "openai": (_openai, OpenAIInstrumentor),
    "google-genai": (_gemini, GoogleGenAIInstrumentor),
    "bedrock": (_bedrock, BedrockInstrumentor),
    "mistralai": (_mistral, MistralAIInstrumentor),
    "cohere": (_cohere, CohereInstrumentor),
    "ollama": (_ollama, OllamaInstrumentor),
    "litellm-over-openai": (_litellm, LiteLLMInstrumentor),
}


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=4) as fake:
        yield fake


@pytest.fixture(params=sorted(CLIENTS))
def contained(request: pytest.FixtureRequest, server: FakeLLMServer) -> Iterator[Call]:
    make, adapter = CLIENTS[request.param]
    layers = [adapter(), HTTPXInstrumentor(), RequestsInstrumentor(), URLLib3Instrumentor()]
    layers.append(AioHTTPInstrumentor())
    if request.param == "litellm-over-openai":
        layers.append(OpenAIInstrumentor())  # the SDK under litellm: must not count again
    for layer in layers:
        layer.instrument()
    try:
        with make(server.base_url) as call:
            yield call
    finally:
        for layer in reversed(layers):
            layer.uninstrument()


def test_every_layer_on_counts_each_call_once(server: FakeLLMServer, contained: Call) -> None:
    limits = ExecutionConfig(max_steps=2, max_cost_usd=1.0)
    with ExecutionContext(limits, price_table=PRICES) as ctx:
        contained()
        one = ctx.snapshot()
        contained()
        with pytest.raises(BudgetExceededError) as denied:
            contained()
        snap = ctx.snapshot()
    assert denied.value.reason == "steps"
    assert server.request_count == 2
    assert snap.steps == 2
    assert one.steps == 1
    # Counted once: the second call costs what the first did, not twice as much.
    assert snap.cost_usd == pytest.approx(2 * one.cost_usd)
    assert snap.reserved_usd == 0.0


def test_an_outer_wrap_llm_call_counts_once_too(server: FakeLLMServer, contained: Call) -> None:
    options = WrapOptions(operation_name="plan", cost_estimate_hint=0.001)
    limits = ExecutionConfig(max_steps=2, max_cost_usd=1.0)
    with ExecutionContext(limits, price_table=PRICES) as ctx:
        assert ctx.wrap_llm_call(contained, options) is Decision.ALLOW
        one = ctx.snapshot()
        assert ctx.wrap_llm_call(contained, options) is Decision.ALLOW
        assert ctx.wrap_llm_call(contained, options) is Decision.HALT
        snap = ctx.snapshot()
    assert server.request_count == 2
    assert snap.steps == 2
    # The actual usage, not the hint: the hint is released when a call joins.
    assert 0 < one.cost_usd < 0.001
    assert snap.cost_usd == pytest.approx(2 * one.cost_usd)
