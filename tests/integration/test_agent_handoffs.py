"""The agent-pair ceiling: a planner and a critic that never agree are stopped.

The planner/critic pair calls the real ``openai`` SDK against FakeLLMServer,
so the server's request count shows what was really sent: exactly the calls
up to the ceiling, nothing after the trip.
"""

from __future__ import annotations

import asyncio
import itertools
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext, agent
from veronica_otel._agents import HandoffCounter, current_agent
from veronica_otel.testing import FakeLLMServer

CHAT = "/v1/chat/completions"


def ask(client: openai.OpenAI, text: str) -> None:
    client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": text}], max_tokens=8
    )


def test_planner_critic_loop_stops_at_the_handoff_ceiling(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    rounds = 0
    with (
        ExecutionContext(ExecutionConfig(max_handoffs=5, max_steps=100)) as ctx,
        pytest.raises(BudgetExceededError) as err,
    ):
        for rounds in range(1, 31):  # 30 iterations if nobody stops them
            with agent("planner"):
                ask(client, f"plan v{rounds}")
            with agent("critic"):
                ask(client, f"critique v{rounds}")
    # planner, critic x5 handoffs = 6 calls; the 6th handoff's call never left.
    assert err.value.reason == "loop"
    assert err.value.limit == 5
    assert server.count(CHAT) == 6
    assert rounds == 4  # the 4th planner turn was the one denied
    # Sticky: neither agent gets another call out.
    with ctx, agent("critic"), pytest.raises(BudgetExceededError):
        ask(client, "one more?")
    assert server.count(CHAT) == 6
    assert ctx.snapshot().steps == 6


def test_one_agent_calling_repeatedly_is_not_a_handoff(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    with ExecutionContext(ExecutionConfig(max_handoffs=1)), agent("solo"):
        for i in range(5):
            ask(client, f"step {i}")
    assert server.count(CHAT) == 5


def test_calls_with_no_agent_do_not_break_the_alternation(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    with ExecutionContext(ExecutionConfig(max_handoffs=2)), pytest.raises(BudgetExceededError):
        for name in ["a", None, "b", None, "a", "b"]:
            if name is None:
                ask(client, "glue code, no agent")
            else:
                with agent(name):
                    ask(client, name)
    # a, -, b (1), -, a (2), b would be the 3rd: denied.
    assert server.count(CHAT) == 5


def test_gen_ai_agent_name_on_a_framework_span_names_the_agent(
    client: openai.OpenAI, server: FakeLLMServer, span_exporter: InMemorySpanExporter
) -> None:
    tracer = trace.get_tracer("some.agent.framework")
    with ExecutionContext(ExecutionConfig(max_handoffs=1)), pytest.raises(BudgetExceededError):
        for name in ["writer", "reviewer", "writer"]:
            with tracer.start_as_current_span(
                f"invoke_agent {name}", attributes={"gen_ai.agent.name": name}
            ):
                assert current_agent() == name
                ask(client, name)
    assert server.count(CHAT) == 2


def test_agent_spans_make_the_ping_pong_visible(
    client: openai.OpenAI, span_exporter: InMemorySpanExporter
) -> None:
    span_exporter.clear()
    with ExecutionContext(ExecutionConfig(max_handoffs=10)):
        for name in ["planner", "critic", "planner"]:
            with agent(name):
                ask(client, name)
    spans = span_exporter.get_finished_spans()
    agents = [s for s in spans if s.name.startswith("invoke_agent ")]
    assert [s.attributes["gen_ai.agent.name"] for s in agents] == ["planner", "critic", "planner"]
    calls = [s for s in spans if s.name.startswith("chat ")]
    assert {c.parent.span_id for c in calls if c.parent} == {a.context.span_id for a in agents}


def test_threads_hand_off_through_one_chain_exactly(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    """Concurrent agents: however calls interleave, at most max_handoffs switches."""
    limit = 7
    ctx = ExecutionContext(ExecutionConfig(max_handoffs=limit))

    def worker(name: str) -> int:
        sent = 0
        with ctx, agent(name):
            for _ in range(20):
                try:
                    ask(client, name)
                except BudgetExceededError:
                    return sent
                sent += 1
        return sent

    with ThreadPoolExecutor(2) as pool:
        sent = sum(pool.map(worker, ["left", "right"]))
    assert ctx.trip is not None and ctx.trip.reason == "loop"
    assert sent == server.count(CHAT)
    assert (
        ctx._state.handoffs is not None and ctx._state.handoffs.handoffs("left", "right") == limit
    )


def test_async_agents_in_tasks_are_told_apart() -> None:
    async def main() -> int:
        calls = 0

        async def step(name: str) -> None:
            nonlocal calls
            async with agent(name):
                await asyncio.sleep(0)
                ctx.begin_call().finish()
                calls += 1

        async with ExecutionContext(ExecutionConfig(max_handoffs=3)) as ctx:
            with pytest.raises(BudgetExceededError):
                for name in ["x", "y"] * 5:
                    await asyncio.create_task(step(name))
        return calls

    assert asyncio.run(main()) == 4


@pytest.mark.parametrize("bad", ["", "   ", "x" * 300, 3])
def test_bad_agent_names_are_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="agent name"):
        agent(bad)  # type: ignore[arg-type]


def test_bad_max_handoffs_is_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="max_handoffs"):
        ExecutionConfig(max_handoffs=-1)
    with pytest.raises(ValueError, match="VERONICA_MAX_HANDOFFS"):
        ExecutionConfig.from_env({"VERONICA_MAX_HANDOFFS": "two"})
    assert ExecutionConfig.from_env({"VERONICA_MAX_HANDOFFS": "4"}).max_handoffs == 4


def test_children_inherit_the_tighter_handoff_ceiling() -> None:
    with ExecutionContext(ExecutionConfig(max_handoffs=3)) as parent:
        child = parent.spawn_child(ExecutionConfig(max_handoffs=10))
    assert child.config.max_handoffs == 3


@given(st.lists(st.sampled_from(["a", "b", "c"]), max_size=60), st.integers(0, 6))
def test_handoff_counter_never_admits_more_than_the_limit(names: list[str], limit: int) -> None:
    counter = HandoffCounter(limit)
    admitted: list[str] = []
    for name in names:
        if counter.observe(name) is None:
            admitted.append(name)
    switches: dict[tuple[str, str], int] = {}
    for prev, now in itertools.pairwise(admitted):
        if prev != now:
            pair = (min(prev, now), max(prev, now))
            switches[pair] = switches.get(pair, 0) + 1
    assert all(count <= limit for count in switches.values())
    for (a, b), count in switches.items():
        assert counter.handoffs(a, b) == count
