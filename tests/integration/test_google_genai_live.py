"""Gemini Live sessions (``client.aio.live.connect``) of the real ``google-genai``
SDK against FakeLLMServer: each turn a call admitted before the message that
makes the model generate is sent, settled from its ``usageMetadata``.

The SDK speaks Live only over ``wss://`` (it passes an SSL context to
``websockets``): the client here is a Vertex AI client behind a custom base URL
(an API gateway) whose session base URL is the fake server's ``ws://`` one,
with the SSL context removed; everything else is the SDK's own code.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel._pricing import default_price_table
from veronica_otel._units import usd_to_nano
from veronica_otel.instrumentors.google_genai import GoogleGenAIInstrumentor
from veronica_otel.testing import FakeLLMServer

if TYPE_CHECKING:
    from google import genai
    from google.genai import types

MODEL = "gemini-live-2.5-flash"
PATH = "/ws/google.cloud.aiplatform.v1beta1.LlmBidiService/BidiGenerateContent"
OUTPUT_TOKENS = 5
INPUT_TOKENS = 40


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=OUTPUT_TOKENS, input_tokens=INPUT_TOKENS) as fake:
        yield fake


@pytest_asyncio.fixture
async def live(server: FakeLLMServer) -> AsyncIterator[genai.client.AsyncClient]:
    from google import genai
    from google.genai import types
    from google.oauth2.credentials import Credentials

    instrumentor = GoogleGenAIInstrumentor()
    instrumentor.instrument()
    gemini = genai.Client(
        vertexai=True,
        credentials=Credentials(token="t"),  # type: ignore[no-untyped-call]
        http_options=types.HttpOptions(base_url=server.base_url),
    )
    gemini._api_client._websocket_ssl_ctx = {}  # ws:// on loopback (see the module docs)
    try:
        yield gemini.aio
    finally:
        await gemini.aio.aclose()
        gemini.close()
        instrumentor.uninstrument()


def _config(server: FakeLLMServer, **kwargs: Any) -> types.LiveConnectConfig:
    from google.genai import types

    url = server.base_url.replace("http://", "ws://", 1) + PATH
    return types.LiveConnectConfig(
        http_options=types.HttpOptions(base_url=url),
        response_modalities=[types.Modality.TEXT],
        **kwargs,
    )


async def _turn(session: genai.live.AsyncSession) -> types.LiveServerMessage:
    from google.genai import types

    await session.send_client_content(
        turns=types.Content(role="user", parts=[types.Part(text="hi")])
    )
    async for message in session.receive():
        if message.server_content and message.server_content.turn_complete:
            return message
    raise AssertionError("the turn never completed")


@pytest.mark.asyncio
async def test_max_steps_lets_exactly_n_turns_reach_the_server(
    server: FakeLLMServer, live: genai.client.AsyncClient
) -> None:
    turns = 0
    with ExecutionContext(ExecutionConfig(max_steps=2)) as ctx:
        with pytest.raises(BudgetExceededError) as denied:
            async with live.live.connect(model=MODEL, config=_config(server)) as session:
                for _ in range(4):
                    await _turn(session)
                    turns += 1
        assert denied.value.reason == "steps"
        snapshot = ctx.snapshot()
    assert turns == 2
    assert server.event_count(PATH, "client_content") == 2
    assert snapshot.steps == 2
    assert snapshot.tokens == 2 * (INPUT_TOKENS + OUTPUT_TOKENS)  # from usageMetadata


@pytest.mark.asyncio
async def test_a_tripped_chain_opens_no_live_socket(
    server: FakeLLMServer, live: genai.client.AsyncClient
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=5)) as ctx:
        ctx.cancel()
        with pytest.raises(BudgetExceededError):
            async with live.live.connect(model=MODEL, config=_config(server)):
                pass
    assert server.count(PATH) == 0


@pytest.mark.asyncio
async def test_a_cost_ceiling_holds_from_usage_metadata(
    server: FakeLLMServer, live: genai.client.AsyncClient
) -> None:
    prices = default_price_table().lookup("gcp.vertex_ai", MODEL)
    assert prices is not None
    sent = 0
    config = _config(server, max_output_tokens=OUTPUT_TOKENS)
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.002)) as ctx:
        with pytest.raises(BudgetExceededError) as denied:
            async with live.live.connect(model=MODEL, config=config) as session:
                for _ in range(50):
                    await _turn(session)
                    sent += 1
        assert denied.value.reason == "cost"
        spent = usd_to_nano(ctx.snapshot().cost_usd)
    assert sent >= 2
    assert server.event_count(PATH, "client_content") == sent
    assert spent == sent * prices.cost_nano(INPUT_TOKENS, OUTPUT_TOKENS)
    assert spent <= usd_to_nano(0.002)


@pytest.mark.asyncio
async def test_a_dropped_live_connection_costs_the_reservation(
    server: FakeLLMServer, live: genai.client.AsyncClient
) -> None:
    from google.genai import errors

    prices = default_price_table().lookup("gcp.vertex_ai", MODEL)
    assert prices is not None
    server.drop_next_responses(1)
    config = _config(server, max_output_tokens=100)
    with ExecutionContext(ExecutionConfig(max_cost_usd=5.0)) as ctx:
        with pytest.raises(errors.APIError):  # the SDK's error for the lost connection
            async with live.live.connect(model=MODEL, config=config) as session:
                await _turn(session)
        snapshot = ctx.snapshot()
    assert server.event_count(PATH, "client_content") == 1
    assert snapshot.steps == 1
    assert usd_to_nano(snapshot.cost_usd) >= prices.cost_nano(0, 100)
    assert snapshot.reserved_usd == 0


@pytest.mark.asyncio
async def test_live_music_stays_refused_in_a_chain_with_limits(
    live: genai.client.AsyncClient,
) -> None:
    with (
        ExecutionContext(ExecutionConfig(max_steps=10)),
        pytest.raises(BudgetExceededError, match="Live music session"),
    ):
        async with live.live.music.connect(model="lyria-realtime-exp"):
            pass


@pytest.mark.asyncio
async def test_leaving_the_session_before_the_turn_completes_costs_the_reservation(
    server: FakeLLMServer, live: genai.client.AsyncClient
) -> None:
    from google.genai import types

    prices = default_price_table().lookup("gcp.vertex_ai", MODEL)
    assert prices is not None
    config = _config(server, max_output_tokens=100)
    with ExecutionContext(ExecutionConfig(max_cost_usd=5.0)) as ctx:
        async with live.live.connect(model=MODEL, config=config) as session:
            await session.send_client_content(
                turns=types.Content(role="user", parts=[types.Part(text="hi")])
            )
        snapshot = ctx.snapshot()
    assert snapshot.steps == 1
    assert usd_to_nano(snapshot.cost_usd) >= prices.cost_nano(0, 100)
    assert snapshot.reserved_usd == 0
