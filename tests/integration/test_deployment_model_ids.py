"""A Bedrock-style model id under a cost ceiling: sent, and charged as its model."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from veronica_otel import ExecutionConfig, ExecutionContext
from veronica_otel._pricing import default_price_table
from veronica_otel._units import nano_to_usd
from veronica_otel.instrumentors.anthropic import AnthropicInstrumentor
from veronica_otel.testing import FakeLLMServer

if TYPE_CHECKING:
    import anthropic

BEDROCK_ID = "us.anthropic.claude-3-5-sonnet-20241022-v2:0"
CANONICAL = "claude-3-5-sonnet-20241022"
INPUT, OUTPUT, CACHED = 10, 5, 4


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(input_tokens=INPUT, output_tokens=OUTPUT, cached_tokens=CACHED) as fake:
        yield fake


@pytest.fixture
def client(server: FakeLLMServer) -> Iterator[anthropic.Anthropic]:
    import anthropic

    instrumentor = AnthropicInstrumentor()
    instrumentor.instrument()
    try:
        with anthropic.Anthropic(
            base_url=server.anthropic_base_url, api_key="test", max_retries=0
        ) as claude:
            yield claude
    finally:
        instrumentor.uninstrument()


def test_a_bedrock_id_is_sent_and_charged_the_canonical_price(
    server: FakeLLMServer, client: anthropic.Anthropic
) -> None:
    prices = default_price_table().lookup("anthropic", CANONICAL)
    assert prices is not None
    expected = nano_to_usd(prices.cost_nano(INPUT, OUTPUT, CACHED))
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.5)) as ctx:
        client.messages.create(
            model=BEDROCK_ID,
            max_tokens=64,
            messages=[{"role": "user", "content": "Say hello."}],
        )
    assert server.count("/v1/messages") == 1
    assert server.requests[0].body["model"] == BEDROCK_ID  # the name goes out as written
    snap = ctx.snapshot()
    assert (snap.steps, snap.tokens, snap.reserved_usd) == (1, INPUT + OUTPUT, 0.0)
    assert snap.cost_usd == expected > 0
