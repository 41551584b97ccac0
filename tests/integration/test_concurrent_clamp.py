"""Concurrent calls share a budget without starving each other (issue 12).

An uncapped call is clamped to what the *unreserved* budget buys, but never
past its model's output limit, so calls running side by side each reserve
their real worst case; and a denial caused only by other calls' in-flight
reservations is raised without stopping the chain. Real ``openai`` clients
against FakeLLMServer; a server-side barrier holds every reply until all the
calls have arrived, so each is admitted while the others hold reservations.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest
import pytest_asyncio
from openai.types.chat import ChatCompletionMessageParam

from tests._bounds import input_bound
from veronica_otel import (
    BudgetExceededError,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
)
from veronica_otel._ledger import LocalLedger
from veronica_otel._pricing import MAX_OUTPUT_TOKENS, default_price_table
from veronica_otel._units import nano_to_usd
from veronica_otel.distributed import RedisLedger
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer, RecordedRequest

MODEL = "gpt-4o-mini"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]
CHAT = "/v1/chat/completions"


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=5) as fake:
        yield fake


@pytest_asyncio.fixture
async def aclient(server: FakeLLMServer) -> AsyncIterator[openai.AsyncOpenAI]:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    try:
        async with openai.AsyncOpenAI(
            base_url=server.openai_base_url, api_key="test", max_retries=0
        ) as client:
            yield client
    finally:
        instrumentor.uninstrument()


def hold_replies_until(server: FakeLLMServer, calls: int) -> None:
    """No reply leaves before ``calls`` requests arrived: all are in flight at once."""
    barrier = threading.Barrier(calls, timeout=10)

    def responder(request: RecordedRequest) -> None:
        barrier.wait()  # a call that never arrives breaks it: the others get a 500

    server.set_responder(responder)


def real_size_nano() -> int:
    """The worst case of one uncapped call: the model's whole output at its price."""
    prices = default_price_table().lookup("openai", MODEL)
    assert prices is not None
    return prices.max_cost_nano(input_bound([MESSAGES], 1), MAX_OUTPUT_TOKENS[MODEL])


async def uncapped(client: openai.AsyncOpenAI) -> Any:
    return await client.chat.completions.create(model=MODEL, messages=MESSAGES)


@pytest.mark.asyncio
async def test_ten_concurrent_uncapped_calls_all_go_out(
    aclient: openai.AsyncOpenAI, server: FakeLLMServer
) -> None:
    ceiling = 10 * real_size_nano()  # fits all ten at their real size, and no more
    hold_replies_until(server, 10)
    with ExecutionContext(ExecutionConfig(max_cost_usd=nano_to_usd(ceiling))) as ctx:
        replies = await asyncio.gather(*(uncapped(aclient) for _ in range(10)))
        snap = ctx.snapshot()
    assert server.count(CHAT) == 10
    assert len(replies) == 10
    # Each was clamped to the model's output limit, not to what the budget buys.
    assert [r.body["max_completion_tokens"] for r in server.requests] == [16_384] * 10
    assert not snap.aborted
    assert snap.reserved_usd == 0
    assert 0 < snap.cost_usd <= nano_to_usd(ceiling)  # G1


@pytest.mark.asyncio
async def test_two_uncapped_calls_under_a_dollar_both_go_out(
    aclient: openai.AsyncOpenAI, server: FakeLLMServer
) -> None:
    """The issue's repro: the first no longer clamps to all that is left."""
    hold_replies_until(server, 2)
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        await asyncio.gather(uncapped(aclient), uncapped(aclient))
        assert ctx.trip is None
        assert ctx.snapshot().reserved_usd == 0
    assert server.count(CHAT) == 2


@pytest.mark.asyncio
async def test_a_clamp_takes_only_what_is_unreserved(
    aclient: openai.AsyncOpenAI, server: FakeLLMServer
) -> None:
    """Room for three and a half: the last admitted gets a smaller cap, none is denied."""
    ceiling = 3 * real_size_nano() + real_size_nano() // 2
    hold_replies_until(server, 4)
    with ExecutionContext(ExecutionConfig(max_cost_usd=nano_to_usd(ceiling))) as ctx:
        await asyncio.gather(*(uncapped(aclient) for _ in range(4)))
        snap = ctx.snapshot()
    caps = sorted(r.body["max_completion_tokens"] for r in server.requests)
    assert server.count(CHAT) == 4
    assert caps[-3:] == [16_384] * 3  # three at full size, the fourth gets what is left
    assert 1 <= caps[0] < 16_384
    assert not snap.aborted and snap.reserved_usd == 0
    assert snap.cost_usd <= nano_to_usd(ceiling)


@pytest.mark.asyncio
async def test_the_clamp_leaves_room_for_the_prompt_in_the_context_window(
    aclient: openai.AsyncOpenAI, server: FakeLLMServer
) -> None:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "x" * 3_000}]
    with ExecutionContext(ExecutionConfig(max_cost_usd=10.0)):  # buys far more than 8192
        await aclient.chat.completions.create(model="gpt-4", messages=messages)
    # gpt-4: 8192 tokens of context shared by the prompt's bound and the reply.
    assert server.requests[-1].body["max_completion_tokens"] == 8_192 - input_bound([messages], 1)


# -- a denial caused only by in-flight reservations is not a trip ------------------------


@pytest.mark.asyncio
async def test_denied_by_reservations_alone_does_not_trip_the_chain(
    aclient: openai.AsyncOpenAI, server: FakeLLMServer, ledger: LocalLedger | RedisLedger
) -> None:
    prices = default_price_table().lookup("openai", MODEL)
    assert prices is not None
    call = prices.max_cost_nano(input_bound([MESSAGES], 1), 1_000)  # a call capped at 1000
    ceiling = 2 * call
    # No waiting for room: this test holds the other reservation itself.
    config = ExecutionConfig(max_cost_usd=nano_to_usd(ceiling), reservation_wait_s=0)
    with ExecutionContext(config, chain_id="soft", ledger=ledger) as ctx:
        # Another call in flight holds 1.5 calls' worth: this one fits the
        # committed spend (0) but not beside that reservation.
        held = ctx.begin_call(cost_nano=call + call // 2)
        with pytest.raises(BudgetExceededError) as denied:
            await aclient.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_completion_tokens=1_000
            )
        assert denied.value.reason == "cost"
        assert denied.value.trip.sticky is False
        assert ctx.trip is None and not ctx.aborted
        assert ledger.snapshot("soft").trip is None  # nothing stored, in either ledger
        assert server.count(CHAT) == 0
        held.finish(sent=False)  # the other call was never sent: given back
        await aclient.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_completion_tokens=1_000
        )
        assert server.count(CHAT) == 1
        snap = ctx.snapshot()
    assert not snap.aborted and snap.reserved_usd == 0


def test_a_call_that_cannot_fit_committed_spend_still_trips(
    ledger: LocalLedger | RedisLedger,
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0), chain_id="hard", ledger=ledger) as ctx:
        held = ctx.begin_call(cost_nano=10**8)
        with pytest.raises(BudgetExceededError) as denied:
            ctx.begin_call(cost_nano=2 * 10**9)  # more than the ceiling by itself
        assert denied.value.trip.sticky
        assert ctx.trip == denied.value.trip
        held.finish(sent=False)


def test_wrapped_calls_are_denied_without_tripping(ledger: LocalLedger | RedisLedger) -> None:
    """wrap_llm_call too (in process, its fast path: a one-level step)."""
    config = ExecutionConfig(max_cost_usd=1.0, reservation_wait_s=0)  # the hold is ours
    with ExecutionContext(config, chain_id="fast", ledger=ledger) as ctx:
        held = ctx.begin_call(cost_nano=6 * 10**8)
        options = WrapOptions(operation_name="x", cost_estimate_hint=0.5)
        assert ctx.wrap_llm_call(lambda: "sent", options) is Decision.HALT
        assert ctx.trip is None
        held.finish(sent=False)
        assert ctx.wrap_llm_call(lambda: "sent", options) is Decision.ALLOW
        assert ctx.trip is None
