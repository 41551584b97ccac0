"""One call, one count (DESIGN G13): ``wrap_llm_call`` around an instrumented call.

The wrap counts the step; the instrumented call inside it joins that step,
still reserves its own worst case before it is sent (G1) and commits its
actual usage; the wrap then commits no cost of its own (its hint is
released). A second instrumented call in the same wrap takes a step of its
own (a step is one request). Real ``openai`` clients against the fake
server, whose request count is the truth for what was sent; in process and
on a shared Redis/Valkey ledger, sync and async.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest
import pytest_asyncio
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

from veronica_otel import (
    AgentStepGuard,
    BudgetExceededError,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    PolicyPipeline,
    WrapOptions,
)
from veronica_otel._pricing import default_price_table
from veronica_otel._units import nano_to_usd
from veronica_otel.distributed import RedisLedger
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer

MODEL = "gpt-4o-mini"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]
CHAT = "/v1/chat/completions"
HINT = WrapOptions(operation_name="plan", cost_estimate_hint=0.01)


@pytest.fixture
def instrumentor() -> Iterator[OpenAIInstrumentor]:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    yield instrumentor
    instrumentor.uninstrument()


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=6) as fake:
        yield fake


@pytest.fixture
def client(server: FakeLLMServer, instrumentor: OpenAIInstrumentor) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0) as oai:
        yield oai


@pytest_asyncio.fixture
async def aclient(
    server: FakeLLMServer, instrumentor: OpenAIInstrumentor
) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=server.openai_base_url, api_key="k", max_retries=0
    ) as oai:
        yield oai


@pytest.fixture
def store(redis_url: str, redis_prefix: str) -> Iterator[RedisLedger]:
    ledger = RedisLedger.from_url(redis_url, key_prefix=redis_prefix)
    yield ledger
    ledger.close()


def actual_nano(replies: list[ChatCompletion]) -> int:
    """What the replies' usage costs at the model's price (what must be committed)."""
    prices = default_price_table().lookup("openai", MODEL)
    assert prices is not None
    total = 0
    for reply in replies:
        assert reply.usage is not None
        total += prices.cost_nano(reply.usage.prompt_tokens, reply.usage.completion_tokens)
    return total


def run_wraps(
    ctx: ExecutionContext, client: openai.OpenAI, wraps: int
) -> tuple[list[Decision], list[ChatCompletion]]:
    decisions: list[Decision] = []
    replies: list[ChatCompletion] = []

    def call() -> None:
        replies.append(
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=20)
        )

    for _ in range(wraps):
        decisions.append(ctx.wrap_llm_call(call, options=HINT))
    return decisions, replies


def test_max_steps_bounds_wrapped_instrumented_calls(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=4, max_cost_usd=1.0)) as ctx:
        decisions, replies = run_wraps(ctx, client, 5)
        snap = ctx.snapshot()
    assert decisions == [Decision.ALLOW] * 4 + [Decision.HALT]
    assert server.count(CHAT) == 4  # the 5th wrap was denied before fn ran
    assert snap.steps == 4
    assert snap.trip is not None and snap.trip.reason == "steps"
    # Each call at its actual usage: no hint on top, nothing left reserved.
    assert snap.cost_usd == nano_to_usd(actual_nano(replies))
    assert snap.reserved_usd == 0
    assert snap.tokens == sum(r.usage.total_tokens for r in replies if r.usage)


def test_the_hint_is_replaced_by_the_actual_cost(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        _, replies = run_wraps(ctx, client, 1)
        snap = ctx.snapshot()
    assert server.count(CHAT) == 1
    assert (snap.steps, snap.reserved_usd) == (1, 0)
    assert snap.cost_usd == nano_to_usd(actual_nano(replies))
    assert snap.cost_usd < HINT.cost_estimate_hint  # the fake reply is far cheaper


def test_the_joined_call_still_reserves_its_worst_case(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    # The hint fits; the call's worst case (input bound + 100,000 output
    # tokens at gpt-4o-mini's price, about $0.06) does not: it is not sent.
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.05)) as ctx:

        def call() -> None:
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=100_000)

        assert ctx.wrap_llm_call(call, options=HINT) == Decision.HALT
        snap = ctx.snapshot()
    assert server.count(CHAT) == 0
    # fn ran, so its step counts; the joined call was never sent: no cost.
    assert (snap.steps, snap.cost_usd, snap.reserved_usd) == (1, 0, 0)


def test_later_calls_in_one_wrap_take_steps_of_their_own(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    replies: list[ChatCompletion] = []

    def twice() -> None:
        for _ in range(2):
            replies.append(
                client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=20)
            )

    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        assert ctx.wrap_llm_call(twice, options=HINT) == Decision.ALLOW
        snap = ctx.snapshot()
    assert server.count(CHAT) == 2
    assert snap.steps == 2  # the first joined the wrap's step, the second took one
    assert snap.cost_usd == nano_to_usd(actual_nano(replies))

    # Under max_steps=1 the second request is not sent.
    with ExecutionContext(ExecutionConfig(max_steps=1)) as ctx:
        assert ctx.wrap_llm_call(twice) == Decision.HALT
        assert ctx.snapshot().steps == 1
    assert server.count(CHAT) == 3


def test_a_step_policy_counts_the_wrap_once(client: openai.OpenAI, server: FakeLLMServer) -> None:
    guard = AgentStepGuard(max_steps=3)
    with ExecutionContext(pipeline=PolicyPipeline([guard])) as ctx:
        decisions, _ = run_wraps(ctx, client, 4)
    assert decisions == [Decision.ALLOW] * 3 + [Decision.HALT]
    assert server.count(CHAT) == 3
    assert guard.current_step == 3


def test_a_wrapped_tool_call_is_not_joined(client: openai.OpenAI, server: FakeLLMServer) -> None:
    replies: list[ChatCompletion] = []

    def tool() -> None:
        replies.append(
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=20)
        )

    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        assert ctx.wrap_tool_call(tool, options=HINT) == Decision.ALLOW
        snap = ctx.snapshot()
    assert server.count(CHAT) == 1
    assert snap.steps == 2  # the tool's step and the LLM call's
    assert snap.cost_usd == nano_to_usd(actual_nano(replies)) + HINT.cost_estimate_hint


def test_a_call_after_the_wrap_ended_takes_its_own_step(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    # Work that outlives the wrap (a task, a callback) carries its context
    # along: the ended wrap is joined by nothing.
    carried: list[contextvars.Context] = []
    with ExecutionContext(ExecutionConfig(max_steps=2)) as ctx:
        assert ctx.wrap_llm_call(lambda: carried.append(contextvars.copy_context()))
        carried[0].run(
            client.chat.completions.create, model=MODEL, messages=MESSAGES, max_tokens=20
        )
        assert ctx.snapshot().steps == 2
        with pytest.raises(BudgetExceededError):
            carried[0].run(
                client.chat.completions.create, model=MODEL, messages=MESSAGES, max_tokens=20
            )
    assert server.count(CHAT) == 1


@pytest.mark.asyncio
async def test_async_wrap_counts_once(aclient: openai.AsyncOpenAI, server: FakeLLMServer) -> None:
    replies: list[ChatCompletion] = []

    async def call() -> None:
        replies.append(
            await aclient.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=20)
        )

    with ExecutionContext(ExecutionConfig(max_steps=4, max_cost_usd=1.0)) as ctx:
        decisions = [await ctx.awrap_llm_call(call, options=HINT) for _ in range(5)]
        snap = ctx.snapshot()
    assert decisions == [Decision.ALLOW] * 4 + [Decision.HALT]
    assert server.count(CHAT) == 4
    assert (snap.steps, snap.reserved_usd) == (4, 0)
    assert snap.cost_usd == nano_to_usd(actual_nano(replies))


def test_shared_ledger_counts_once(
    client: openai.OpenAI, server: FakeLLMServer, store: RedisLedger
) -> None:
    config = ExecutionConfig(max_steps=4, max_cost_usd=1.0)
    with ExecutionContext(config, ledger=store) as ctx:
        decisions, replies = run_wraps(ctx, client, 5)
        chain = ctx.chain_id
    state = store.snapshot(chain)  # the store's own counters
    assert decisions == [Decision.ALLOW] * 4 + [Decision.HALT]
    assert server.count(CHAT) == 4
    assert (state.steps, state.reserved_nano) == (4, 0)
    assert state.cost_nano == actual_nano(replies)


@pytest.mark.asyncio
async def test_shared_ledger_counts_once_async(
    aclient: openai.AsyncOpenAI, server: FakeLLMServer, store: RedisLedger
) -> None:
    replies: list[ChatCompletion] = []

    async def call() -> Any:
        replies.append(
            await aclient.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=20)
        )

    config = ExecutionConfig(max_steps=4, max_cost_usd=1.0)
    async with ExecutionContext(config, ledger=store) as ctx:
        decisions = [await ctx.awrap_llm_call(call, options=HINT) for _ in range(5)]
        chain = ctx.chain_id
    state = await store.asnapshot(chain)
    await store.aclose()
    assert decisions == [Decision.ALLOW] * 4 + [Decision.HALT]
    assert server.count(CHAT) == 4
    assert (state.steps, state.reserved_nano) == (4, 0)
    assert state.cost_nano == actual_nano(replies)


@pytest.mark.asyncio
async def test_concurrent_calls_in_one_wrap_join_it_once(
    aclient: openai.AsyncOpenAI, server: FakeLLMServer
) -> None:
    import asyncio

    async def both() -> None:
        await asyncio.gather(
            *(
                aclient.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=20)
                for _ in range(2)
            )
        )

    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        assert await ctx.awrap_llm_call(both) == Decision.ALLOW
        snap = ctx.snapshot()
    assert server.count(CHAT) == 2
    assert (snap.steps, snap.reserved_usd) == (2, 0)  # one joined, the other took a step
