"""The OpenAI instrumentor's contract, through the real ``openai`` SDK against FakeLLMServer.

Every call is contained before it is sent: usage is committed exactly as the
server reports it, a denied call never reaches the server, streams are cut at
the next chunk and settled, and spans carry the chain.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import httpx2
import openai
import openai._base_client as base_client
import pydantic
import pytest
import pytest_asyncio
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import ResponseUsage
from opentelemetry import baggage, propagate
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests._bounds import input_bound
from tests._clock import FakeClock, patch_chain_clock
from veronica_otel import (
    BudgetExceededError,
    ChainSnapshot,
    CircuitBreaker,
    CircuitState,
    ExecutionConfig,
    ExecutionContext,
    PolicyContext,
    PolicyDecision,
    PolicyPipeline,
    PriceTable,
    UnitPrices,
)
from veronica_otel._pricing import default_price_table
from veronica_otel._units import nano_to_usd, usd_to_nano
from veronica_otel.instrumentors import _openai_response
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer

CHAT_MODEL = "gpt-4o-mini"
EMBEDDING_MODEL = "text-embedding-3-small"
LEGACY_MODEL = "gpt-3.5-turbo-instruct"
PROMPT = "Say hello."
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": PROMPT}]
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
EMBEDDINGS = "/v1/embeddings"
COMPLETIONS = "/v1/completions"
OUTPUT_TOKENS = 6

# (input, output, cached input, reasoning) tokens as the server reported them
Usage = tuple[int, int, int, int]


class Pet(pydantic.BaseModel):
    name: str
    age: int


class StaticPolicy:
    """A policy that always answers with the same decision."""

    policy_type = "static"

    def __init__(self, decision: PolicyDecision) -> None:
        self.decision = decision

    def check(self, context: PolicyContext) -> PolicyDecision:
        return self.decision

    def reset(self) -> None:
        pass


# -- fixtures ------------------------------------------------------------------------


@pytest.fixture
def instrumentor() -> Iterator[OpenAIInstrumentor]:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    yield instrumentor
    instrumentor.uninstrument()


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=OUTPUT_TOKENS, reasoning_tokens=1, cached_tokens=2) as fake:
        yield fake


@pytest.fixture
def client(server: FakeLLMServer, instrumentor: OpenAIInstrumentor) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.openai_base_url, api_key="test", max_retries=0) as oai:
        yield oai


@pytest_asyncio.fixture
async def aclient(
    server: FakeLLMServer, instrumentor: OpenAIInstrumentor
) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=server.openai_base_url, api_key="test", max_retries=0
    ) as oai:
        yield oai


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    # Start at the real clock: the shared deadline timer thread keeps
    # comparing deadlines with time.monotonic().
    fake = FakeClock(time.monotonic())
    patch_chain_clock(monkeypatch, fake)
    return fake


@pytest.fixture
def backoffs(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The SDK's retry backoff sleeps, recorded instead of slept."""
    slept: list[float] = []

    class _Time:
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        def sleep(self, seconds: float) -> None:
            slept.append(seconds)

    monkeypatch.setattr(base_client, "time", _Time())
    return slept


# -- helpers -------------------------------------------------------------------------


def priced(model: str, usage: Usage, table: PriceTable | None = None) -> float:
    """What ``usage`` of ``model`` costs, in the ledger's own integer arithmetic."""
    prices = (table or default_price_table()).lookup("openai", model)
    assert prices is not None
    return nano_to_usd(prices.cost_nano(*usage))


def assert_settled_as_billed(snap: ChainSnapshot, model: str, usage: Usage) -> None:
    """One call, committed exactly as the server billed it, nothing left reserved."""
    assert snap.steps == 1
    assert snap.tokens == usage[0] + usage[1]
    assert snap.cost_usd == priced(model, usage)
    assert snap.reserved_usd == 0


def chat_usage(usage: CompletionUsage | None) -> Usage:
    assert usage is not None
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    details = usage.completion_tokens_details
    reasoning = details.reasoning_tokens if details else 0
    return usage.prompt_tokens, usage.completion_tokens, cached or 0, reasoning or 0


def responses_usage(usage: ResponseUsage | None) -> Usage:
    assert usage is not None
    return (
        usage.input_tokens,
        usage.output_tokens,
        usage.input_tokens_details.cached_tokens,
        usage.output_tokens_details.reasoning_tokens,
    )


def reported_by_server(server: FakeLLMServer) -> int:
    """Total tokens the server accounts for its last (streamed) request."""
    body_tokens = math.ceil(int(server.requests[-1].headers["content-length"]) / 4)
    return body_tokens + OUTPUT_TOKENS


def denied(reason: str, call: Callable[[], object]) -> BudgetExceededError:
    with pytest.raises(BudgetExceededError) as info:
        call()
    assert info.value.reason == reason
    return info.value


def call_spans(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def state_of(breaker: CircuitBreaker) -> CircuitState:
    return breaker.state


def trip_events(span: ReadableSpan) -> list[Any]:
    return [event for event in span.events if event.name == "veronica.trip"]


def chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    kwargs.setdefault("model", CHAT_MODEL)
    kwargs.setdefault("messages", MESSAGES)
    return client.chat.completions.create(**kwargs)


async def achat(client: openai.AsyncOpenAI, **kwargs: Any) -> Any:
    kwargs.setdefault("model", CHAT_MODEL)
    kwargs.setdefault("messages", MESSAGES)
    return await client.chat.completions.create(**kwargs)


# -- every API: the server's usage, committed exactly --------------------------------


def _chat_create(client: openai.OpenAI) -> Usage:
    return chat_usage(chat(client).usage)


def _chat_stream_with_usage(client: openai.OpenAI) -> Usage:
    usages = []
    with chat(client, stream=True, stream_options={"include_usage": True}) as stream:
        for chunk in stream:
            if chunk.usage is not None:
                usages.append(chunk.usage)
    assert len(usages) == 1
    return chat_usage(usages[0])


def _chat_parse(client: openai.OpenAI) -> Usage:
    completion = client.chat.completions.parse(
        model=CHAT_MODEL, messages=MESSAGES, response_format=Pet
    )
    assert isinstance(completion.choices[0].message.parsed, Pet)
    return chat_usage(completion.usage)


def _chat_stream_helper(client: openai.OpenAI) -> Usage:
    with client.chat.completions.stream(
        model=CHAT_MODEL,
        messages=MESSAGES,
        response_format=Pet,
        stream_options={"include_usage": True},
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Pet)
    return chat_usage(final.usage)


def _responses_create(client: openai.OpenAI) -> Usage:
    return responses_usage(client.responses.create(model=CHAT_MODEL, input=PROMPT).usage)


def _responses_parse(client: openai.OpenAI) -> Usage:
    response = client.responses.parse(model=CHAT_MODEL, input=PROMPT, text_format=Pet)
    assert isinstance(response.output_parsed, Pet)
    return responses_usage(response.usage)


def _responses_stream_helper(client: openai.OpenAI) -> Usage:
    with client.responses.stream(model=CHAT_MODEL, input=PROMPT) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.output_text.startswith("tok0")
    return responses_usage(final.usage)


def _embeddings_create(client: openai.OpenAI) -> Usage:
    usage = client.embeddings.create(model=EMBEDDING_MODEL, input=PROMPT).usage
    return usage.prompt_tokens, 0, 0, 0


def _legacy_completions_create(client: openai.OpenAI) -> Usage:
    return chat_usage(client.completions.create(model=LEGACY_MODEL, prompt=PROMPT).usage)


async def _achat_create(client: openai.AsyncOpenAI) -> Usage:
    return chat_usage((await achat(client)).usage)


async def _achat_stream_with_usage(client: openai.AsyncOpenAI) -> Usage:
    usages = []
    stream = await achat(client, stream=True, stream_options={"include_usage": True})
    async with stream:
        async for chunk in stream:
            if chunk.usage is not None:
                usages.append(chunk.usage)
    assert len(usages) == 1
    return chat_usage(usages[0])


async def _achat_parse(client: openai.AsyncOpenAI) -> Usage:
    completion = await client.chat.completions.parse(
        model=CHAT_MODEL, messages=MESSAGES, response_format=Pet
    )
    assert isinstance(completion.choices[0].message.parsed, Pet)
    return chat_usage(completion.usage)


async def _achat_stream_helper(client: openai.AsyncOpenAI) -> Usage:
    async with client.chat.completions.stream(
        model=CHAT_MODEL,
        messages=MESSAGES,
        response_format=Pet,
        stream_options={"include_usage": True},
    ) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Pet)
    return chat_usage(final.usage)


async def _aresponses_create(client: openai.AsyncOpenAI) -> Usage:
    response = await client.responses.create(model=CHAT_MODEL, input=PROMPT)
    return responses_usage(response.usage)


async def _aresponses_parse(client: openai.AsyncOpenAI) -> Usage:
    response = await client.responses.parse(model=CHAT_MODEL, input=PROMPT, text_format=Pet)
    assert isinstance(response.output_parsed, Pet)
    return responses_usage(response.usage)


async def _aresponses_stream_helper(client: openai.AsyncOpenAI) -> Usage:
    async with client.responses.stream(model=CHAT_MODEL, input=PROMPT) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_response()
    assert final.output_text.startswith("tok0")
    return responses_usage(final.usage)


async def _aembeddings_create(client: openai.AsyncOpenAI) -> Usage:
    usage = (await client.embeddings.create(model=EMBEDDING_MODEL, input=PROMPT)).usage
    return usage.prompt_tokens, 0, 0, 0


async def _alegacy_completions_create(client: openai.AsyncOpenAI) -> Usage:
    completion = await client.completions.create(model=LEGACY_MODEL, prompt=PROMPT)
    return chat_usage(completion.usage)


# name -> (model, path, sync call, async call)
OPERATIONS: dict[
    str,
    tuple[
        str,
        str,
        Callable[[openai.OpenAI], Usage],
        Callable[[openai.AsyncOpenAI], Awaitable[Usage]],
    ],
] = {
    "chat.completions.create": (CHAT_MODEL, CHAT, _chat_create, _achat_create),
    "chat.completions.create(stream, include_usage)": (
        CHAT_MODEL,
        CHAT,
        _chat_stream_with_usage,
        _achat_stream_with_usage,
    ),
    "chat.completions.parse": (CHAT_MODEL, CHAT, _chat_parse, _achat_parse),
    "chat.completions.stream": (CHAT_MODEL, CHAT, _chat_stream_helper, _achat_stream_helper),
    "responses.create": (CHAT_MODEL, RESPONSES, _responses_create, _aresponses_create),
    "responses.parse": (CHAT_MODEL, RESPONSES, _responses_parse, _aresponses_parse),
    "responses.stream": (
        CHAT_MODEL,
        RESPONSES,
        _responses_stream_helper,
        _aresponses_stream_helper,
    ),
    "embeddings.create": (EMBEDDING_MODEL, EMBEDDINGS, _embeddings_create, _aembeddings_create),
    "completions.create": (
        LEGACY_MODEL,
        COMPLETIONS,
        _legacy_completions_create,
        _alegacy_completions_create,
    ),
}


@pytest.mark.parametrize("name", list(OPERATIONS))
def test_commits_the_servers_usage_exactly(
    name: str, client: openai.OpenAI, server: FakeLLMServer
) -> None:
    model, path, call, _ = OPERATIONS[name]
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        usage = call(client)
        snap = ctx.snapshot()
    assert server.count(path) == 1
    assert_settled_as_billed(snap, model, usage)
    assert not snap.aborted


@pytest.mark.asyncio
@pytest.mark.parametrize("name", list(OPERATIONS))
async def test_async_commits_the_servers_usage_exactly(
    name: str, aclient: openai.AsyncOpenAI, server: FakeLLMServer
) -> None:
    model, path, _, acall = OPERATIONS[name]
    async with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        usage = await acall(aclient)
        snap = ctx.snapshot()
    assert server.count(path) == 1
    assert_settled_as_billed(snap, model, usage)


def test_stream_without_usage_commits_a_conservative_bound(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        with chat(client, stream=True) as stream:
            chunks = list(stream)
        snap = ctx.snapshot()
    assert all(chunk.usage is None for chunk in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert ctx.get_partial_result() == text
    reported = reported_by_server(server)
    assert snap.tokens >= reported
    # Priced as if every reported token were uncached input or plain output.
    assert snap.cost_usd >= priced(CHAT_MODEL, (reported - OUTPUT_TOKENS, OUTPUT_TOKENS, 0, 0))
    assert snap.reserved_usd == 0
    assert snap.steps == 1


@pytest.mark.asyncio
async def test_async_stream_without_usage_commits_a_conservative_bound(
    aclient: openai.AsyncOpenAI, server: FakeLLMServer
) -> None:
    async with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        stream = await achat(aclient, stream=True)
        async with stream:
            chunks = [chunk async for chunk in stream]
        snap = ctx.snapshot()
    assert all(chunk.usage is None for chunk in chunks)
    reported = reported_by_server(server)
    assert snap.tokens >= reported
    assert snap.cost_usd >= priced(CHAT_MODEL, (reported - OUTPUT_TOKENS, OUTPUT_TOKENS, 0, 0))
    assert snap.reserved_usd == 0


def test_stream_helper_closed_early_settles_the_reservation(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    # The helpers close the HTTP response themselves, not the SDK stream we hand them.
    # Closed before its usage arrived, a stream costs its reservation (DESIGN G10):
    # the provider may have generated, and billed, the whole reply.
    held: list[float] = []
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.01)) as ctx:
        with client.chat.completions.stream(
            model=CHAT_MODEL, messages=MESSAGES, max_completion_tokens=50
        ) as stream:
            for event in stream:
                if event.type == "content.delta" and event.delta:
                    held.append(ctx.snapshot().reserved_usd)
                    break
        assert ctx.snapshot().reserved_usd == 0
        assert ctx.get_partial_result() == "tok0"
        with client.responses.stream(
            model=CHAT_MODEL, input=PROMPT, max_output_tokens=50
        ) as rstream:
            for revent in rstream:
                if revent.type == "response.output_text.delta":
                    held.append(ctx.snapshot().reserved_usd)
                    break
        snap = ctx.snapshot()
    assert snap.reserved_usd == 0
    assert snap.steps == 2
    assert not snap.aborted
    assert all(amount > 0 for amount in held)
    assert snap.cost_usd == pytest.approx(sum(held), abs=1e-9)


# -- every reachable trip: the denied call never reaches the server ----------------------


def test_cost_trip_when_the_reservation_does_not_fit(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.0001)) as ctx:
        error = denied("cost", lambda: chat(client, max_completion_tokens=1_000_000))
        snap = ctx.snapshot()
    assert error.chain_id == ctx.chain_id
    assert server.count(CHAT) == 0
    assert snap.cost_usd == 0 and snap.reserved_usd == 0


def test_cost_trip_when_even_the_input_does_not_fit(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1e-9)):
        denied("cost", lambda: chat(client))
    assert server.count(CHAT) == 0


def test_steps_trip(client: openai.OpenAI, server: FakeLLMServer) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=2)) as ctx:
        chat(client)
        client.responses.create(model=CHAT_MODEL, input=PROMPT)
        denied("steps", lambda: chat(client))
        denied("steps", lambda: chat(client))  # sticky
    assert server.count(CHAT) == 1 and server.count(RESPONSES) == 1
    assert ctx.snapshot().steps == 2


@pytest.mark.asyncio
async def test_async_steps_trip(aclient: openai.AsyncOpenAI, server: FakeLLMServer) -> None:
    async with ExecutionContext(ExecutionConfig(max_steps=1)):
        await achat(aclient)
        with pytest.raises(BudgetExceededError) as info:
            await achat(aclient)
    assert info.value.reason == "steps"
    assert server.count(CHAT) == 1


def test_retries_trip_before_the_retry_is_sent(
    server: FakeLLMServer, instrumentor: Any, backoffs: list[float]
) -> None:
    server.fail_next(1, 500)
    with (
        openai.OpenAI(base_url=server.openai_base_url, api_key="test", max_retries=3) as oai,
        ExecutionContext(ExecutionConfig(max_retries_total=0)) as ctx,
    ):
        denied("retries", lambda: chat(oai))
    # The failed attempt went out; the retry, which would have succeeded, did not,
    # and it was refused before the SDK slept its backoff.
    assert server.count(CHAT) == 1
    assert backoffs == []
    assert ctx.snapshot().retries == 0


def test_tokens_trip(client: openai.OpenAI, server: FakeLLMServer) -> None:
    with ExecutionContext(ExecutionConfig(max_tokens=100)):
        denied("tokens", lambda: chat(client, max_completion_tokens=200))
    assert server.count(CHAT) == 0


def test_timeout_trip(client: openai.OpenAI, server: FakeLLMServer, clock: FakeClock) -> None:
    with ExecutionContext(ExecutionConfig(timeout_ms=60_000)):
        chat(client)
        clock.advance(61)
        error = denied("timeout", lambda: chat(client))
    assert error.limit == 60_000
    assert server.count(CHAT) == 1


def test_loop_trip(client: openai.OpenAI, server: FakeLLMServer) -> None:
    with ExecutionContext(ExecutionConfig(max_repeats=2)):
        chat(client)
        chat(client, messages=[{"role": "user", "content": "Something else."}])
        chat(client)
        denied("loop", lambda: chat(client))
    assert server.count(CHAT) == 3


def test_circuit_open_trip(client: openai.OpenAI, server: FakeLLMServer) -> None:
    breaker_clock = FakeClock()
    breaker = CircuitBreaker(failure_threshold=2, recovery_timeout=30.0, clock=breaker_clock)
    server.fail_next(2, 500)
    with ExecutionContext(pipeline=PolicyPipeline([breaker])):
        for _ in range(2):
            with pytest.raises(openai.InternalServerError):
                chat(client)
        assert state_of(breaker) is CircuitState.OPEN
        denied("circuit_open", lambda: chat(client))
        assert server.count(CHAT) == 2
        breaker_clock.advance(30)  # one probe goes out, succeeds, and closes it
        chat(client)
    assert state_of(breaker) is CircuitState.CLOSED
    assert server.count(CHAT) == 3


def test_depth_trip(client: openai.OpenAI, server: FakeLLMServer) -> None:
    # A context joined past max_depth (e.g. from a remote parent) is born tripped.
    with ExecutionContext(ExecutionConfig(max_depth=1), _depth=2):
        denied("depth", lambda: chat(client))
    assert server.count(CHAT) == 0


def test_unknown_model_is_denied_under_a_cost_ceiling(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        error = denied("cost", lambda: chat(client, model="acme-private-llm"))
        snap = ctx.snapshot()
    assert "acme-private-llm" in str(error)
    assert server.count(CHAT) == 0
    assert snap.reserved_usd == 0


def test_unknown_model_is_allowed_with_an_unknown_model_price(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    table = PriceTable(unknown_model_price_usd_per_mtok=3.0)
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0), price_table=table) as ctx:
        usage = chat_usage(chat(client, model="acme-private-llm").usage)
        snap = ctx.snapshot()
    assert server.count(CHAT) == 1
    assert snap.cost_usd == nano_to_usd(UnitPrices.from_usd_per_mtok(3.0, 3.0).cost_nano(*usage))


def test_unknown_model_is_not_blocked_without_a_cost_ceiling(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=5)) as ctx:
        usage = chat_usage(chat(client, model="acme-private-llm").usage)
    assert server.count(CHAT) == 1
    assert ctx.snapshot().tokens == usage[0] + usage[1]


# -- SDK-internal retries --------------------------------------------------------------


def test_sdk_retries_draw_on_the_chains_retry_budget(
    server: FakeLLMServer, instrumentor: Any
) -> None:
    server.fail_next(10, 500, retry_after_ms=1)
    with (
        openai.OpenAI(base_url=server.openai_base_url, api_key="test", max_retries=5) as oai,
        ExecutionContext(ExecutionConfig(max_retries_total=2)) as ctx,
    ):
        denied("retries", lambda: chat(oai))
        snap = ctx.snapshot()
    assert server.count(CHAT) == 3
    assert [r.headers["x-stainless-retry-count"] for r in server.requests] == ["0", "1", "2"]
    assert snap.retries == 2
    assert snap.steps == 1
    assert snap.reserved_usd == 0


@pytest.mark.asyncio
async def test_async_sdk_retries_draw_on_the_chains_retry_budget(
    server: FakeLLMServer, instrumentor: Any
) -> None:
    server.fail_next(10, 500, retry_after_ms=1)
    async with (
        openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="test", max_retries=5) as oai,
        ExecutionContext(ExecutionConfig(max_retries_total=2)) as ctx,
    ):
        with pytest.raises(BudgetExceededError) as info:
            await achat(oai)
    assert info.value.reason == "retries"
    assert server.count(CHAT) == 3
    assert ctx.snapshot().retries == 2


def test_a_retry_whose_backoff_outlasts_the_deadline_is_not_sent(
    server: FakeLLMServer, instrumentor: Any, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []

    class _Time:
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        def sleep(self, seconds: float) -> None:  # the backoff: 61 s pass on the chain's clock
            slept.append(seconds)
            clock.advance(61)

    monkeypatch.setattr(base_client, "time", _Time())
    server.fail_next(1, 500, retry_after_ms=1)
    with (
        openai.OpenAI(base_url=server.openai_base_url, api_key="test", max_retries=3) as oai,
        ExecutionContext(ExecutionConfig(timeout_ms=60_000, max_retries_total=3)) as ctx,
    ):
        denied("timeout", lambda: chat(oai))
    assert len(slept) == 1  # the retry was drawn and slept, then refused before sending
    assert server.count(CHAT) == 1
    assert ctx.snapshot().reserved_usd == 0


@pytest.mark.asyncio
async def test_async_retry_whose_backoff_outlasts_the_deadline_is_not_sent(
    server: FakeLLMServer, instrumentor: Any, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def _sleep(seconds: float) -> None:
        clock.advance(61)

    monkeypatch.setattr(base_client.anyio, "sleep", _sleep)
    server.fail_next(1, 500, retry_after_ms=1)
    async with (
        openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="test", max_retries=3) as oai,
        ExecutionContext(ExecutionConfig(timeout_ms=60_000, max_retries_total=3)),
    ):
        with pytest.raises(BudgetExceededError) as info:
            await achat(oai)
    assert info.value.reason == "timeout"
    assert server.count(CHAT) == 1


def test_sdk_retries_within_budget_succeed_and_commit_once(
    server: FakeLLMServer, instrumentor: Any, backoffs: list[float]
) -> None:
    server.fail_next(2, 500, retry_after_ms=1)
    with (
        openai.OpenAI(base_url=server.openai_base_url, api_key="test", max_retries=5) as oai,
        ExecutionContext(ExecutionConfig(max_retries_total=5, max_cost_usd=1.0)) as ctx,
    ):
        usage = chat_usage(chat(oai).usage)
        snap = ctx.snapshot()
    assert server.count(CHAT) == 3
    assert len(backoffs) == 2
    assert (snap.steps, snap.retries) == (1, 2)
    assert snap.tokens == usage[0] + usage[1]
    assert snap.cost_usd == priced(CHAT_MODEL, usage)


# -- streams cut mid-way -----------------------------------------------------------------


def _content(chunk: Any) -> str:
    return str(chunk.choices[0].delta.content or "") if chunk.choices else ""


def test_stream_is_cut_at_the_deadline(
    client: openai.OpenAI, server: FakeLLMServer, clock: FakeClock, span_exporter: Any
) -> None:
    received: list[str] = []
    with ExecutionContext(ExecutionConfig(timeout_ms=60_000, max_cost_usd=1.0)) as ctx:
        stream = chat(client, stream=True, stream_options={"include_usage": True})
        with pytest.raises(BudgetExceededError) as info:
            for chunk in stream:
                received.append(_content(chunk))
                if len("".join(received).split()) == 2:
                    clock.advance(61)
        snap = ctx.snapshot()
    assert info.value.reason == "timeout"
    assert stream.response.is_closed
    assert ctx.get_partial_result() == "".join(received) == "tok0 tok1"
    assert snap.reserved_usd == 0
    assert snap.cost_usd > 0  # what arrived is committed, bounded
    (span,) = call_spans(span_exporter, f"chat {CHAT_MODEL}")
    assert span.status.status_code is StatusCode.ERROR
    assert len(trip_events(span)) == 1


@pytest.mark.asyncio
async def test_async_stream_is_cut_at_the_deadline(
    aclient: openai.AsyncOpenAI, server: FakeLLMServer, clock: FakeClock
) -> None:
    received: list[str] = []
    async with ExecutionContext(ExecutionConfig(timeout_ms=60_000)) as ctx:
        stream = await achat(aclient, stream=True)
        with pytest.raises(BudgetExceededError) as info:
            async for chunk in stream:
                received.append(_content(chunk))
                if len("".join(received).split()) == 2:
                    clock.advance(61)
    assert info.value.reason == "timeout"
    assert stream.response.is_closed
    assert ctx.get_partial_result() == "tok0 tok1"
    assert ctx.snapshot().reserved_usd == 0


def test_stream_is_cut_by_the_real_deadline(instrumentor: Any) -> None:
    with (
        FakeLLMServer(output_tokens=60, chunk_delay_s=0.025) as slow,
        openai.OpenAI(base_url=slow.openai_base_url, api_key="test", max_retries=0) as oai,
        ExecutionContext(ExecutionConfig(timeout_ms=500)) as ctx,
    ):
        received: list[str] = []
        stream = chat(oai, stream=True)
        with pytest.raises(BudgetExceededError) as info:
            for chunk in stream:
                received.append(_content(chunk))
    assert info.value.reason == "timeout"
    assert stream.response.is_closed
    text = "".join(received)
    assert text.startswith("tok0")  # some text arrived before the cut
    assert "tok59" not in text  # and the stream did not run to its end
    partial = ctx.get_partial_result()
    assert isinstance(partial, str) and partial.startswith(text)
    assert ctx.snapshot().reserved_usd == 0


def test_stream_is_cut_by_cancel(client: openai.OpenAI, server: FakeLLMServer) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        with chat(client, stream=True) as stream:
            received: list[str] = []
            with pytest.raises(BudgetExceededError) as info:
                for chunk in stream:
                    received.append(_content(chunk))
                    if "tok2" in "".join(received):
                        ctx.cancel()
        snap = ctx.snapshot()
    assert info.value.reason == "timeout"
    assert stream.response.is_closed
    assert ctx.get_partial_result() == "tok0 tok1 tok2"
    assert snap.reserved_usd == 0


@pytest.mark.asyncio
async def test_async_stream_is_cut_by_cancel(
    aclient: openai.AsyncOpenAI, server: FakeLLMServer
) -> None:
    async with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        stream = await achat(aclient, stream=True)
        received: list[str] = []
        with pytest.raises(BudgetExceededError):
            async for chunk in stream:
                received.append(_content(chunk))
                if "tok1" in "".join(received):
                    ctx.cancel()
    assert stream.response.is_closed
    assert ctx.get_partial_result() == "tok0 tok1"
    assert ctx.snapshot().reserved_usd == 0


def test_a_stream_over_an_httpx_client_settles_and_is_cut(
    server: FakeLLMServer, instrumentor: OpenAIInstrumentor
) -> None:
    # openai 3.x still takes an httpx (not httpx2) client, and 2.x sends
    # through httpx by default: the body we settle on is of that library.
    with (
        httpx.Client() as http,
        openai.OpenAI(
            base_url=server.openai_base_url, api_key="k", max_retries=0, http_client=http
        ) as legacy,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        with chat(legacy, stream=True, stream_options={"include_usage": True}) as whole:
            assert isinstance(whole.response, httpx.Response)
            text = "".join(_content(chunk) for chunk in whole)
        settled = ctx.snapshot()
        raw = legacy.chat.completions.with_streaming_response.create(
            model=CHAT_MODEL, messages=MESSAGES, stream=True
        )
        with raw as response:  # read raw, closed by the helper: settled on close
            lines = list(response.iter_lines())
        closed = ctx.snapshot()
        with chat(legacy, stream=True) as cut, pytest.raises(BudgetExceededError):
            for _ in cut:
                ctx.cancel()
    assert text and settled.cost_usd > 0 and settled.reserved_usd == 0
    assert lines and closed.reserved_usd == 0 and closed.cost_usd > settled.cost_usd
    assert cut.response.is_closed and ctx.snapshot().reserved_usd == 0
    assert server.count(CHAT) == 3


def test_stream_is_cut_by_a_trip_elsewhere_in_the_chain(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=2)) as ctx:
        stream = chat(client, stream=True)
        first = next(iter(stream))
        chat(client)  # step 2
        denied("steps", lambda: chat(client))  # trips the chain
        with pytest.raises(BudgetExceededError) as info:
            for _ in stream:
                pass
    assert first.choices[0].delta.role == "assistant"
    assert info.value.reason == "steps"
    assert stream.response.is_closed
    assert ctx.snapshot().reserved_usd == 0


def test_legacy_completions_stream_keeps_the_text_received(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    held = 0.0
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        with (
            client.completions.create(model=LEGACY_MODEL, prompt=PROMPT, stream=True) as stream,
            pytest.raises(BudgetExceededError),
        ):
            for chunk in stream:
                if chunk.choices[0].text == " tok1":
                    held = ctx.snapshot().reserved_usd
                    ctx.cancel()
        snap = ctx.snapshot()
    assert ctx.get_partial_result() == "tok0 tok1"
    assert snap.reserved_usd == 0
    # Cut before its usage arrived: the reservation, not a bound from the text (G10).
    assert held > 0 and snap.cost_usd == pytest.approx(held, abs=1e-9)


def test_responses_stream_helper_is_cut_by_cancel(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
        client.responses.stream(model=CHAT_MODEL, input=PROMPT) as stream,
        pytest.raises(BudgetExceededError),
    ):
        for event in stream:
            if event.type == "response.output_text.delta" and event.delta == " tok1":
                ctx.cancel()
    assert ctx.get_partial_result() == "tok0 tok1"
    assert ctx.snapshot().reserved_usd == 0


# -- the output clamp ---------------------------------------------------------------------


def test_chat_without_a_cap_is_clamped_to_what_the_budget_buys(
    client: openai.OpenAI, server: FakeLLMServer, span_exporter: InMemorySpanExporter
) -> None:
    prices = default_price_table().lookup("openai", CHAT_MODEL)
    assert prices is not None
    bound = input_bound([MESSAGES], len(MESSAGES))
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.001)) as ctx:
        chat(client)
        remaining = ctx.remaining_cost_nano()
        assert remaining is not None and remaining < usd_to_nano(0.001)
        chat(client, n=2)
    first = prices.max_output_tokens_for(usd_to_nano(0.001), bound)
    second = prices.max_output_tokens_for(remaining, bound) // 2  # per choice
    assert [r.body["max_completion_tokens"] for r in server.requests] == [first, second]
    assert all("max_tokens" not in r.body for r in server.requests)
    spans = call_spans(span_exporter, f"chat {CHAT_MODEL}")
    assert [attributes(s)["veronica.clamped.max_tokens"] for s in spans] == [first, second]


def test_responses_without_a_cap_is_clamped(
    client: openai.OpenAI, server: FakeLLMServer, span_exporter: InMemorySpanExporter
) -> None:
    prices = default_price_table().lookup("openai", CHAT_MODEL)
    assert prices is not None
    expected = prices.max_output_tokens_for(usd_to_nano(0.002), input_bound([PROMPT], 1))
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.002)):
        client.responses.create(model=CHAT_MODEL, input=PROMPT)
    assert server.requests[-1].body["max_output_tokens"] == expected
    (span,) = call_spans(span_exporter, f"chat {CHAT_MODEL}")
    assert attributes(span)["veronica.clamped.max_tokens"] == expected
    assert attributes(span)["gen_ai.request.max_tokens"] == expected


def test_tool_definitions_count_towards_the_input_bound(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    tools: list[Any] = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city. " * 20,
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    prices = default_price_table().lookup("openai", CHAT_MODEL)
    assert prices is not None
    expected = prices.max_output_tokens_for(
        usd_to_nano(0.001), input_bound([MESSAGES, tools], len(MESSAGES))
    )
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.001)):
        chat(client, tools=tools)
    assert server.requests[-1].body["max_completion_tokens"] == expected


def test_legacy_completions_clamp_covers_every_best_of_candidate(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    prices = default_price_table().lookup("openai", LEGACY_MODEL)
    assert prices is not None
    affordable = prices.max_output_tokens_for(usd_to_nano(0.01), input_bound([PROMPT], 1))
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.01)):
        client.completions.create(model=LEGACY_MODEL, prompt=PROMPT, best_of=3)
    assert server.requests[-1].body["max_tokens"] == affordable // 3


def test_no_clamp_without_a_ceiling(client: openai.OpenAI, server: FakeLLMServer) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=5)):
        chat(client)
        client.responses.create(model=CHAT_MODEL, input=PROMPT)
    chat_body, responses_body = (r.body for r in server.requests)
    assert "max_completion_tokens" not in chat_body and "max_tokens" not in chat_body
    assert "max_output_tokens" not in responses_body


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_completion_tokens": 7},
        {"max_tokens": 7},
        {"extra_body": {"max_completion_tokens": 7}},
        {"extra_body": {"max_tokens": 7}},
    ],
    ids=["max_completion_tokens", "max_tokens", "extra_body", "extra_body-max_tokens"],
)
def test_a_callers_own_cap_is_respected(
    kwargs: dict[str, Any],
    client: openai.OpenAI,
    server: FakeLLMServer,
    span_exporter: InMemorySpanExporter,
) -> None:
    key = next(iter(kwargs.get("extra_body", kwargs)))
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)):
        chat(client, **kwargs)
    body = server.requests[-1].body
    assert body[key] == 7
    assert {"max_completion_tokens", "max_tokens"} & set(body) == {key}
    (span,) = call_spans(span_exporter, f"chat {CHAT_MODEL}")
    assert "veronica.clamped.max_tokens" not in (span.attributes or {})
    assert attributes(span)["gen_ai.request.max_tokens"] == 7


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_completion_tokens": 50},
        {"max_tokens": 50},
        {"extra_body": {"max_completion_tokens": 50}},
        {"max_completion_tokens": 40, "extra_body": {"max_completion_tokens": 50}},
    ],
    ids=["max_completion_tokens", "max_tokens", "extra_body", "body-and-extra_body"],
)
def test_a_policy_clamp_replaces_the_callers_cap(
    kwargs: dict[str, Any], client: openai.OpenAI, server: FakeLLMServer
) -> None:
    clamp = StaticPolicy(PolicyDecision(True, "static", max_tokens=3))
    caller_body = dict(kwargs.get("extra_body", {}))
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0), PolicyPipeline([clamp])) as ctx:
        completion = chat(client, **kwargs)
    key = "max_tokens" if "max_tokens" in kwargs else "max_completion_tokens"
    body = server.requests[-1].body
    assert body[key] == 3
    assert {"max_completion_tokens", "max_tokens"} & set(body) == {key}
    assert completion.usage is not None and completion.usage.completion_tokens == 3
    assert kwargs.get("extra_body", {}) == caller_body  # the caller's dict is not mutated
    assert ctx.snapshot().tokens == completion.usage.total_tokens


# -- degradation ----------------------------------------------------------------------------


def test_fallback_model_is_sent_instead(
    client: openai.OpenAI, server: FakeLLMServer, span_exporter: InMemorySpanExporter
) -> None:
    fallback = StaticPolicy(PolicyDecision(True, "degrade", fallback_model="gpt-4o-mini"))
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0), PolicyPipeline([fallback])) as ctx:
        completion = chat(client, model="gpt-4o")
    assert server.requests[-1].body["model"] == "gpt-4o-mini"
    assert ctx.snapshot().cost_usd == priced("gpt-4o-mini", chat_usage(completion.usage))
    (span,) = call_spans(span_exporter, "chat gpt-4o")
    assert attributes(span)["veronica.fallback_model"] == "gpt-4o-mini"
    assert attributes(span)["gen_ai.request.model"] == "gpt-4o-mini"


def test_fallback_to_an_unpriced_model_is_denied_and_released(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    fallback = StaticPolicy(PolicyDecision(True, "degrade", fallback_model="acme-private-llm"))
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0), PolicyPipeline([fallback])) as ctx:
        error = denied("cost", lambda: chat(client))
        snap = ctx.snapshot()
    assert "acme-private-llm" in str(error)
    assert server.count(CHAT) == 0
    assert snap.reserved_usd == 0


# -- threads and tasks share the chain ------------------------------------------------------


def test_thread_pool_workers_share_the_chain(client: openai.OpenAI, server: FakeLLMServer) -> None:
    def worker() -> list[str]:
        outcomes = []
        for _ in range(5):
            try:
                chat(client)
                outcomes.append("sent")
            except BudgetExceededError as exc:
                outcomes.append(exc.reason)
        return outcomes

    with ExecutionContext(ExecutionConfig(max_steps=10)) as ctx:
        with ThreadPoolExecutor(max_workers=8) as pool:
            futures = [pool.submit(contextvars.copy_context().run, worker) for _ in range(8)]
            outcomes = [o for future in futures for o in future.result()]
        snap = ctx.snapshot()
    assert outcomes.count("sent") == 10
    assert outcomes.count("steps") == 30
    assert server.count(CHAT) == 10
    assert snap.steps == 10


@pytest.mark.asyncio
async def test_asyncio_tasks_share_the_chain(
    aclient: openai.AsyncOpenAI, server: FakeLLMServer
) -> None:
    async def worker() -> list[str]:
        outcomes = []
        for _ in range(5):
            try:
                await achat(aclient)
                outcomes.append("sent")
            except BudgetExceededError as exc:
                outcomes.append(exc.reason)
        return outcomes

    async with ExecutionContext(ExecutionConfig(max_steps=10)) as ctx:
        results = await asyncio.gather(*(asyncio.create_task(worker()) for _ in range(8)))
    outcomes = [o for result in results for o in result]
    assert outcomes.count("sent") == 10
    assert outcomes.count("steps") == 30
    assert server.count(CHAT) == 10
    assert ctx.snapshot().steps == 10


def test_an_admitted_call_is_sent_even_if_another_call_trips_the_chain(
    server: FakeLLMServer, client: openai.OpenAI
) -> None:
    # Deterministic version of the race the thread-pool test can hit: call A is
    # admitted (step 1 of 1); before A is built, call B is denied (sticky trip).
    class Racing(openai.OpenAI):
        raced = False

        def _prepare_options(self, options: Any) -> Any:
            if not Racing.raced:
                Racing.raced = True
                denied("steps", lambda: chat(client))
            return super()._prepare_options(options)

    with (
        Racing(base_url=server.openai_base_url, api_key="test", max_retries=0) as racing,
        ExecutionContext(ExecutionConfig(max_steps=1)) as ctx,
    ):
        chat(racing)
        denied("steps", lambda: chat(racing))
    assert Racing.raced
    assert server.count(CHAT) == 1
    assert ctx.snapshot().steps == 1


# -- spans -------------------------------------------------------------------------------


def test_one_client_span_per_call_under_the_chains_root(
    client: openai.OpenAI, span_exporter: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=1)) as ctx:
        completion = chat(client)
        cost = ctx.snapshot().cost_usd
        denied("steps", lambda: chat(client))  # a fresh trip
        denied("steps", lambda: chat(client))  # the sticky trip
    spans = span_exporter.get_finished_spans()
    (root,) = [s for s in spans if s.name.startswith("invoke_workflow")]
    calls = call_spans(span_exporter, f"chat {CHAT_MODEL}")
    assert len(calls) == 3
    assert len(spans) == 4
    usage = chat_usage(completion.usage)
    sent, *denials = calls
    assert sent.kind is SpanKind.CLIENT
    sent_attributes = attributes(sent)
    assert sent_attributes["gen_ai.operation.name"] == "chat"
    assert sent_attributes["gen_ai.provider.name"] == "openai"
    assert sent_attributes["gen_ai.request.model"] == CHAT_MODEL
    assert sent_attributes["gen_ai.usage.input_tokens"] == usage[0]
    assert sent_attributes["gen_ai.usage.output_tokens"] == usage[1]
    assert sent_attributes["veronica.chain.id"] == ctx.chain_id
    assert sent_attributes["veronica.cost_usd"] == cost
    assert sent_attributes["veronica.decision"] == "ALLOW"
    assert sent.status.status_code is not StatusCode.ERROR
    for span in denials:
        assert span.kind is SpanKind.CLIENT
        assert span.attributes is not None
        assert span.attributes["veronica.decision"] == "HALT"
        assert span.attributes["veronica.chain.id"] == ctx.chain_id
        assert span.status.status_code is StatusCode.ERROR
        (event,) = trip_events(span)
        assert event.attributes is not None
        assert event.attributes["veronica.trip.reason"] == "steps"
        assert event.attributes["veronica.remaining.steps"] == 0  # what the chain had left
    # What the chain has left is on its root span at its end, not on every call span.
    assert attributes(root)["veronica.remaining.steps"] == 0
    assert attributes(root)["veronica.remaining.cost_usd"] == pytest.approx(1.0 - cost)
    for span in calls:
        assert not [key for key in attributes(span) if key.startswith("veronica.remaining.")]
        assert span.parent is not None
        assert span.parent.span_id == root.context.span_id
        assert span.context.trace_id == root.context.trace_id
    # Nothing was written to a span after it ended.
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")]


def test_user_errors_reraise_unchanged_and_release_the_reservation(
    client: openai.OpenAI, server: FakeLLMServer, span_exporter: InMemorySpanExporter
) -> None:
    server.fail_next(1, 400)
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        with pytest.raises(openai.BadRequestError) as info:
            chat(client)
        snap = ctx.snapshot()
    assert type(info.value) is openai.BadRequestError
    assert info.value.status_code == 400
    assert (snap.reserved_usd, snap.cost_usd, snap.steps, snap.aborted) == (0, 0, 1, False)
    (span,) = call_spans(span_exporter, f"chat {CHAT_MODEL}")
    assert span.status.status_code is StatusCode.ERROR
    assert [event.name for event in span.events] == ["exception"]


@pytest.mark.asyncio
async def test_async_user_errors_reraise_unchanged_and_release_the_reservation(
    aclient: openai.AsyncOpenAI, server: FakeLLMServer
) -> None:
    server.fail_next(1, 400)
    async with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        with pytest.raises(openai.BadRequestError):
            await achat(aclient)
    snap = ctx.snapshot()
    assert (snap.reserved_usd, snap.cost_usd, snap.steps) == (0, 0, 1)


# -- baggage ------------------------------------------------------------------------------


def _with_baggage() -> object:
    ctx = baggage.set_baggage("veronica.chain", "x")
    ctx = baggage.set_baggage("other", "y", ctx)
    return otel_context.attach(ctx)


def test_veronica_baggage_never_reaches_the_vendor(
    server: FakeLLMServer, instrumentor: Any
) -> None:
    seen: list[dict[str, object]] = []

    def on_request(request: httpx2.Request) -> None:
        seen.append(dict(baggage.get_all()))
        propagate.inject(request.headers)  # what an HTTP client instrumentation does

    token = _with_baggage()
    try:
        with (
            openai.OpenAI(
                base_url=server.openai_base_url,
                api_key="test",
                max_retries=0,
                http_client=httpx2.Client(event_hooks={"request": [on_request]}),
            ) as oai,
            ExecutionContext(),
        ):
            chat(oai)
            assert baggage.get_baggage("veronica.chain") == "x"  # restored after the call
    finally:
        otel_context.detach(token)  # type: ignore[arg-type]
    assert seen == [{"other": "y"}]
    header = server.requests[-1].headers.get("baggage", "")
    assert "other=y" in header
    assert "veronica" not in header


@pytest.mark.asyncio
async def test_async_veronica_baggage_never_reaches_the_vendor(
    server: FakeLLMServer, instrumentor: Any
) -> None:
    seen: list[dict[str, object]] = []

    async def on_request(request: httpx2.Request) -> None:
        seen.append(dict(baggage.get_all()))

    token = _with_baggage()
    try:
        async with (
            openai.AsyncOpenAI(
                base_url=server.openai_base_url,
                api_key="test",
                max_retries=0,
                http_client=httpx2.AsyncClient(event_hooks={"request": [on_request]}),
            ) as oai,
            ExecutionContext(),
        ):
            await achat(oai)
    finally:
        otel_context.detach(token)  # type: ignore[arg-type]
    assert seen == [{"other": "y"}]


# -- instrumentation lifecycle, raw responses ------------------------------------------------

_PATCHED = (
    (base_client.SyncAPIClient, "request"),
    (base_client.AsyncAPIClient, "request"),
    (base_client.SyncAPIClient, "_sleep_for_retry"),
    (base_client.AsyncAPIClient, "_sleep_for_retry"),
    (base_client.BaseClient, "_process_response_data"),
)


def test_uninstrument_restores_the_originals(server: FakeLLMServer) -> None:
    originals = [vars(owner)[name] for owner, name in _PATCHED]
    # A client made before instrumentation is contained too.
    with openai.OpenAI(base_url=server.openai_base_url, api_key="test", max_retries=0) as oai:
        instrumentor = OpenAIInstrumentor()
        instrumentor.instrument()
        try:
            # One layer of ours over each original (a wrapt wrapper or a plain hook).
            assert [vars(o)[n].__wrapped__ for o, n in _PATCHED] == originals
            with ExecutionContext(ExecutionConfig(max_steps=1)) as ctx:
                chat(oai)
                denied("steps", lambda: chat(oai))
        finally:
            instrumentor.uninstrument()
        assert [vars(owner)[name] for owner, name in _PATCHED] == originals
        with ExecutionContext(ExecutionConfig(max_steps=1)) as after:
            chat(oai)
            chat(oai)
    assert ctx.snapshot().steps == 1
    assert after.snapshot().steps == 0
    assert server.count(CHAT) == 3


def test_double_instrument_is_idempotent(
    client: openai.OpenAI, server: FakeLLMServer, span_exporter: InMemorySpanExporter
) -> None:
    OpenAIInstrumentor().instrument()  # already instrumented by the fixture
    wrapper = vars(base_client.SyncAPIClient)["request"]
    assert not hasattr(wrapper.__wrapped__, "__wrapped__")  # one layer: the SDK's own method
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        usage = chat_usage(chat(client).usage)
    snap = ctx.snapshot()
    assert snap.steps == 1
    assert snap.tokens == usage[0] + usage[1]
    assert len(call_spans(span_exporter, f"chat {CHAT_MODEL}")) == 1


def test_calls_outside_a_chain_pass_through(
    client: openai.OpenAI, server: FakeLLMServer, span_exporter: InMemorySpanExporter
) -> None:
    chat(client)
    assert server.count(CHAT) == 1
    assert "max_completion_tokens" not in server.requests[-1].body
    assert call_spans(span_exporter, f"chat {CHAT_MODEL}") == []


def test_with_raw_response_commits_usage_once(client: openai.OpenAI, server: FakeLLMServer) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        raw = client.chat.completions.with_raw_response.create(model=CHAT_MODEL, messages=MESSAGES)
        assert raw.headers["x-request-id"].startswith("req_fake")
        completion = raw.parse()
        assert raw.parse() is completion
        usage = chat_usage(completion.usage)
        snap = ctx.snapshot()
    assert_settled_as_billed(snap, CHAT_MODEL, usage)


def test_a_raw_response_read_later_is_found_before_any_reply_was_bound(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    # The payload hook asks for a bound call only once a reply was ever bound:
    # both lanes, a whole reply before any was and a raw one read after (the
    # set-once flag, as a fresh process has it; it ends set, as it would).
    _openai_response.BOUND[0] = False
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        whole = chat_usage(chat(client).usage)
        assert _openai_response.BOUND == [False]
        raw = client.chat.completions.with_raw_response.create(model=CHAT_MODEL, messages=MESSAGES)
        assert _openai_response.BOUND == [True]
        later = chat_usage(raw.parse().usage)
        snap = ctx.snapshot()
    assert snap.steps == 2
    assert snap.tokens == whole[0] + whole[1] + later[0] + later[1]
    assert snap.cost_usd == pytest.approx(priced(CHAT_MODEL, whole) + priced(CHAT_MODEL, later))
    assert snap.reserved_usd == 0


def test_each_client_puts_its_own_server_on_its_spans(
    server: FakeLLMServer, instrumentor: OpenAIInstrumentor, span_exporter: InMemorySpanExporter
) -> None:
    # The server attributes are remembered for the last base URL read: a
    # second client (another host name for the same server) replaces them.
    localhost = server.openai_base_url.replace("127.0.0.1", "localhost")
    with (
        openai.OpenAI(base_url=server.openai_base_url, api_key="test", max_retries=0) as first,
        openai.OpenAI(base_url=localhost, api_key="test", max_retries=0) as second,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)),
    ):
        for oai in (first, second, first):
            chat(oai)
    spans = call_spans(span_exporter, f"chat {CHAT_MODEL}")
    hosts = [attributes(span)["server.address"] for span in spans]
    assert hosts == ["127.0.0.1", "localhost", "127.0.0.1"]
    assert {attributes(span)["server.port"] for span in spans} == {server.port}


def test_with_raw_response_never_parsed_still_commits_the_servers_usage(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        raw = client.responses.with_raw_response.create(model=CHAT_MODEL, input=PROMPT)
        snap = ctx.snapshot()
    usage = responses_usage(raw.parse().usage)
    assert snap.tokens == usage[0] + usage[1]
    assert snap.cost_usd == priced(CHAT_MODEL, usage)
    assert snap.reserved_usd == 0


def test_with_streaming_response_commits_usage_once(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        with client.chat.completions.with_streaming_response.create(
            model=CHAT_MODEL, messages=MESSAGES
        ) as response:
            usage = chat_usage(response.parse().usage)
        snap = ctx.snapshot()
    assert snap.tokens == usage[0] + usage[1]
    assert snap.cost_usd == priced(CHAT_MODEL, usage)
    assert snap.reserved_usd == 0


def test_raw_response_of_a_stream_commits_usage_once(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        raw = client.chat.completions.with_raw_response.create(
            model=CHAT_MODEL,
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        with raw.parse() as stream:
            usages = [chunk.usage for chunk in stream if chunk.usage is not None]
        snap = ctx.snapshot()
    (usage,) = (chat_usage(u) for u in usages)
    assert snap.tokens == usage[0] + usage[1]
    assert snap.cost_usd == priced(CHAT_MODEL, usage)
    assert snap.reserved_usd == 0
