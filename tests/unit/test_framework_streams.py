"""The framework helpers that carry an agent name or a tool run across a stream.

A framework's streamed run (Strands ``stream_async``, smolagents
``run(stream=True)``) and a streamed tool run are generators the application
iterates: the agent name must hold from their first item to their last, a
denied tool run must not start the framework's generator, and a consumer that
stops early must close it (its ``finally`` releases the framework's locks).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel._agents import current_agent
from veronica_otel.instrumentors._framework import as_agent_iter, as_agent_stream, as_tool_stream


def test_a_streamed_run_acts_for_its_agent_and_closes_early() -> None:
    seen: list[str | None] = []
    closed: list[bool] = []

    def steps() -> Iterator[int]:
        try:
            for i in range(5):
                seen.append(current_agent())
                yield i
        finally:
            closed.append(True)

    with ExecutionContext(ExecutionConfig(max_steps=10)):
        stream = as_agent_iter("Looper", steps())
        assert next(stream) == 0 and next(stream) == 1
        assert current_agent() is None  # not the consumer's code: only the run's
        stream.close()  # type: ignore[attr-defined]
    assert seen == ["Looper", "Looper"] and closed == [True]


@pytest.mark.asyncio
async def test_an_async_streamed_run_acts_for_its_agent_and_closes_early() -> None:
    seen: list[str | None] = []
    closed: list[bool] = []

    async def events() -> AsyncIterator[int]:
        try:
            for i in range(5):
                seen.append(current_agent())
                yield i
        finally:
            closed.append(True)

    async with ExecutionContext(ExecutionConfig(max_steps=10)):
        stream = as_agent_stream("Looper", events())
        async for item in stream:
            assert current_agent() is None  # the consumer's code is not the run's
            if item == 1:
                break
        await stream.aclose()  # type: ignore[attr-defined]
    assert seen == ["Looper", "Looper"] and closed == [True]


@pytest.mark.asyncio
async def test_a_streamed_tool_run_is_one_step_checked_before_it_starts() -> None:
    started: list[int] = []

    async def tool_events(n: int) -> AsyncIterator[str]:
        started.append(n)
        yield "partial"
        yield "result"

    async with ExecutionContext(ExecutionConfig(max_steps=1)) as ctx:
        assert [e async for e in as_tool_stream("fw", "lookup", {"n": 1}, tool_events(1))] == [
            "partial",
            "result",
        ]
        assert ctx.snapshot().steps == 1
        with pytest.raises(BudgetExceededError) as info:
            async for _ in as_tool_stream("fw", "lookup", {"n": 2}, tool_events(2)):
                pass
    assert info.value.reason == "steps"
    assert started == [1]  # the denied run's generator never started


@pytest.mark.asyncio
async def test_a_consumer_cancelled_mid_stream_cancels_the_step() -> None:
    cancelled: list[bool] = []

    async def slow() -> AsyncIterator[int]:
        try:
            yield 0
            await asyncio.sleep(60)
            yield 1
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async with ExecutionContext(ExecutionConfig(max_steps=10)):
        stream = as_agent_stream("Looper", slow())
        assert await anext(stream) == 0
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(stream), 0.05)
    assert cancelled == [True]
