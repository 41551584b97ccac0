"""Every send counts, whoever triggers it (issue 22): a middleware that calls
``call_next`` twice (hedging), a custom transport that sends again. Each attempt
after the first is a retry drawn from ``max_retries_total`` before it is sent,
a 2xx reply that is dropped was billed (its reservation), and the SDK's own
retries are drawn once with them. Counted at the fake server (``GET /stats``).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx2
import openai
import pytest

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel.instrumentors.anthropic import AnthropicInstrumentor
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer

if TYPE_CHECKING:
    import anthropic

MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as fake:
        yield fake


@pytest.fixture
def instrumented() -> Iterator[None]:
    instrumentors = (AnthropicInstrumentor(), OpenAIInstrumentor())
    for instrumentor in instrumentors:
        instrumentor.instrument()
    yield
    for instrumentor in instrumentors:
        instrumentor.uninstrument()


def sent(server: FakeLLMServer) -> int:
    """Requests the server received, as it reports them."""
    with urllib.request.urlopen(f"{server.base_url}/stats") as reply:
        return int(json.load(reply)["total"])


def hedge(request: Any, call_next: Any) -> Any:
    """A hedging middleware: sends twice, keeps the second reply."""
    call_next(request)
    return call_next(request)


async def ahedge(request: Any, call_next: Any) -> Any:
    await call_next(request)
    return await call_next(request)


class Resend(httpx2.HTTPTransport):
    """A custom transport that sends every request twice (keeps the second reply)."""

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        first = super().handle_request(request)
        first.close()
        return super().handle_request(request)


def claude(server: FakeLLMServer, **kwargs: Any) -> anthropic.Anthropic:
    import anthropic

    return anthropic.Anthropic(
        base_url=server.anthropic_base_url, api_key="k", max_retries=0, **kwargs
    )


def create(client: anthropic.Anthropic) -> Any:
    return client.messages.create(
        model="claude-3-5-haiku-latest", max_tokens=100, messages=MESSAGES
    )


def test_a_hedging_middleware_draws_a_retry_for_its_second_send(
    server: FakeLLMServer, instrumented: None
) -> None:
    with (
        claude(server, middleware=[hedge]) as client,
        ExecutionContext(ExecutionConfig(max_steps=10, max_retries_total=2)) as ctx,
    ):
        create(client)
        create(client)
        assert sent(server) == 4
        with pytest.raises(BudgetExceededError) as caught:
            create(client)  # its first send is the last the chain allows
        snap = ctx.snapshot()
    assert caught.value.reason == "retries"
    assert sent(server) == 5
    assert (snap.steps, snap.retries) == (3, 2)


def test_a_reply_a_hedging_middleware_drops_is_charged(
    server: FakeLLMServer, instrumented: None
) -> None:
    with claude(server) as plain, ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as one:
        create(plain)
    with (
        claude(server, middleware=[hedge]) as client,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as hedged,
    ):
        create(client)
    assert sent(server) == 3
    # The reply read is committed at its usage; the one dropped was generated
    # and billed too: its reservation, at least the usage of a reply.
    assert hedged.snapshot().cost_usd > 2 * one.snapshot().cost_usd > 0


@pytest.mark.asyncio
async def test_an_async_hedging_middleware_draws_a_retry_for_its_second_send(
    server: FakeLLMServer, instrumented: None
) -> None:
    import anthropic

    async with (
        anthropic.AsyncAnthropic(
            base_url=server.anthropic_base_url, api_key="k", max_retries=0, middleware=[ahedge]
        ) as client,
    ):
        with ExecutionContext(ExecutionConfig(max_steps=10, max_retries_total=1)) as ctx:
            await client.messages.create(
                model="claude-3-5-haiku-latest", max_tokens=100, messages=MESSAGES
            )
            with pytest.raises(BudgetExceededError) as caught:
                await client.messages.create(
                    model="claude-3-5-haiku-latest", max_tokens=100, messages=MESSAGES
                )
            snap = ctx.snapshot()
    assert caught.value.reason == "retries"
    assert sent(server) == 3
    assert (snap.steps, snap.retries) == (2, 1)


def test_the_sdk_retries_and_a_hedge_are_each_drawn_once(
    server: FakeLLMServer, instrumented: None
) -> None:
    import anthropic

    server.fail_next(1, 500)  # the first send fails: the SDK retries the attempt
    with (
        anthropic.Anthropic(
            base_url=server.anthropic_base_url, api_key="k", max_retries=2, middleware=[hedge]
        ) as client,
        ExecutionContext(ExecutionConfig(max_retries_total=10)) as ctx,
    ):
        create(client)
        snap = ctx.snapshot()
    # Attempt 1 (a 500 dropped, then a 200 kept) has no retry: no SDK retry
    # either; every send after the first is one retry, never two.
    assert (snap.steps, snap.retries) == (1, sent(server) - 1)


def test_a_transport_that_sends_again_draws_a_retry_anthropic(
    server: FakeLLMServer, instrumented: None
) -> None:
    import anthropic

    with (
        claude(server, http_client=anthropic.DefaultHttpxClient(transport=Resend())) as client,
        ExecutionContext(ExecutionConfig(max_retries_total=1)) as ctx,
    ):
        create(client)
        with pytest.raises(BudgetExceededError) as caught:
            create(client)
        snap = ctx.snapshot()
    assert caught.value.reason == "retries"
    assert sent(server) == 3
    assert (snap.steps, snap.retries) == (2, 1)


def test_a_transport_that_sends_again_draws_a_retry_openai(
    server: FakeLLMServer, instrumented: None
) -> None:
    with (
        openai.OpenAI(
            base_url=server.openai_base_url,
            api_key="k",
            max_retries=0,
            http_client=openai.DefaultHttpxClient(transport=Resend()),
        ) as client,
        ExecutionContext(ExecutionConfig(max_retries_total=1)) as ctx,
    ):
        client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
        with pytest.raises(BudgetExceededError) as caught:
            client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
        snap = ctx.snapshot()
    assert caught.value.reason == "retries"
    assert sent(server) == 3
    assert (snap.steps, snap.retries) == (2, 1)


def test_the_openai_sdk_retries_are_drawn_once(server: FakeLLMServer, instrumented: None) -> None:
    server.fail_next(2, 500)
    with (
        openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=3) as client,
        ExecutionContext(ExecutionConfig(max_retries_total=10)) as ctx,
    ):
        client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
        snap = ctx.snapshot()
    assert sent(server) == 3
    assert (snap.steps, snap.retries) == (1, 2)
