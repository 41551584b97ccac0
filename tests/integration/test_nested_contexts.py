"""A plain ``with ExecutionContext(...)`` inside another chain is that chain's child.

The issue's repro: a plain nested context opened inside a chain already
tripped on ``max_steps=2`` sent 7 more requests; only ``spawn_child`` linked
a parent. What reached the fake server, read from its ``GET /stats``, is the
truth.
"""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.integration._outcomes import chat, sent
from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext, current_context
from veronica_otel.distributed import RedisLedger
from veronica_otel.testing import FakeLLMServer

pytestmark = pytest.mark.fake_llm(output_tokens=5)


def test_a_nested_context_inside_a_tripped_chain_sends_nothing(
    server: FakeLLMServer, client: openai.OpenAI
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=2)) as outer:
        assert [chat(client) for _ in range(3)] == ["sent", "sent", "steps"]
        with pytest.raises(BudgetExceededError) as refused:
            ExecutionContext(ExecutionConfig(max_steps=10))
        assert refused.value.reason == "steps"
        assert refused.value.chain_id == outer.chain_id
    assert sent(server) == 2


def test_a_nested_context_is_carved_from_what_the_chain_has_left(
    server: FakeLLMServer, client: openai.OpenAI
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=5)) as outer:
        assert chat(client) == "sent"
        with ExecutionContext(ExecutionConfig(max_steps=10)) as inner:
            assert inner.parent is outer and current_context() is inner
            assert inner.config.max_steps == 4  # what the outer chain had left
            assert inner.chain_id == f"{outer.chain_id}.1"
            assert inner.depth == outer.depth + 1
            outcomes = [chat(client) for _ in range(7)]
        assert outcomes == ["sent"] * 4 + ["steps"] * 3
        assert outer.snapshot().steps == 5  # every child call charged to the chain
        assert chat(client) == "steps"  # the child spent what the chain had left
    assert sent(server) == 5


def test_the_enclosing_chain_trip_stops_an_open_nested_context(
    server: FakeLLMServer, client: openai.OpenAI
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=3)) as outer:
        with ExecutionContext(ExecutionConfig(max_steps=10)) as inner:
            assert chat(client) == "sent"
            with ExecutionContext(detached=True):  # an independent chain, asked for
                assert [chat(client) for _ in range(4)] == ["sent"] * 4
            outer.cancel()
            assert [chat(client) for _ in range(3)] == ["timeout"] * 3
        assert inner.aborted
    assert sent(server) == 5
    assert outer.snapshot().steps == 1


def test_a_nested_context_with_its_own_limits_bounds_only_itself(
    server: FakeLLMServer, client: openai.OpenAI
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=6)) as outer:
        with ExecutionContext(ExecutionConfig(max_steps=2)):
            assert [chat(client) for _ in range(3)] == ["sent", "sent", "steps"]
        assert [chat(client) for _ in range(5)] == ["sent"] * 4 + ["steps"]
    assert sent(server) == 6
    assert outer.snapshot().steps == 6


@pytest.mark.asyncio
async def test_async_nested_contexts_are_children_too(server: FakeLLMServer) -> None:
    from veronica_otel.instrumentors.openai import OpenAIInstrumentor

    OpenAIInstrumentor().instrument()
    try:
        async with openai.AsyncOpenAI(
            base_url=server.openai_base_url, api_key="t", max_retries=0
        ) as aclient:

            async def call() -> str:
                try:
                    await aclient.chat.completions.create(
                        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
                    )
                except BudgetExceededError as exc:
                    return exc.reason
                return "sent"

            async def task() -> list[str]:
                async with ExecutionContext(ExecutionConfig(max_steps=5)):
                    return [await call() for _ in range(3)]

            async with ExecutionContext(ExecutionConfig(max_steps=4)) as outer:
                results = await asyncio.gather(*(task() for _ in range(3)))
    finally:
        OpenAIInstrumentor().uninstrument()
    assert sorted(r for rs in results for r in rs).count("sent") == 4
    assert outer.snapshot().steps == 4
    assert sent(server) == 4


def test_entering_a_context_made_outside_every_chain_inside_one_is_refused(
    server: FakeLLMServer, client: openai.OpenAI
) -> None:
    made_before = ExecutionContext(ExecutionConfig(max_steps=10))
    with ExecutionContext(ExecutionConfig(max_steps=1)):
        assert chat(client) == "sent"
        with pytest.raises(RuntimeError, match="detached=True"), made_before:
            chat(client)
    with made_before, made_before:  # outside every chain: a root; itself inside itself
        assert chat(client) == "sent"
    assert sent(server) == 2


def test_spawn_child_is_unchanged(server: FakeLLMServer, client: openai.OpenAI) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=3)) as outer:
        child = outer.spawn_child(ExecutionConfig(max_steps=10))
        assert child.config.max_steps == 3 and child.parent is outer
        with child:
            assert [chat(client) for _ in range(4)] == ["sent"] * 3 + ["steps"]
    assert sent(server) == 3


def test_a_nested_context_on_another_ledger_must_say_detached(
    redis_url: str, redis_prefix: str
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=3)):
        store = RedisLedger.from_url(redis_url, key_prefix=redis_prefix)
        try:
            with pytest.raises(ValueError, match=r"ledger=.*detached=True"):
                ExecutionContext(ledger=store)
            with ExecutionContext(ledger=store, detached=True) as alone:
                assert alone.parent is None
        finally:
            store.close()
