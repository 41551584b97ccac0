"""Per-agent limits inside a chain, with the real ``openai`` SDK against FakeLLMServer.

Each agent's calls carry its name in the prompt, so the server's recorded
requests say exactly what each agent really sent: the calls up to the
agent's own ceiling, then nothing more from it, while the other agents of
the chain go on until the chain's own ceiling.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests._clock import FakeClock
from tests.integration._agent_calls import ask, sent_by
from veronica_otel import (
    BudgetExceededError,
    ExecutionConfig,
    ExecutionContext,
    PolicyPipeline,
    WrapOptions,
    agent,
)
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.policy_file import FilePolicy, PolicyFile
from veronica_otel.testing import FakeLLMServer

CHAT = "/v1/chat/completions"


RESEARCHER = ExecutionConfig(max_steps=3)


def test_planner_critic_loop_researcher_capped_critic_runs_to_the_chain_ceiling(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    denials: list[BudgetExceededError] = []
    with (
        ExecutionContext(ExecutionConfig(max_steps=12)) as ctx,
        pytest.raises(BudgetExceededError) as chain_stop,
    ):
        for _ in range(50):
            with agent("researcher", config=RESEARCHER):  # re-entered every round
                try:
                    ask(client, "researcher")
                except BudgetExceededError as exc:
                    if exc.agent is None:  # the chain's own ceiling: the end
                        raise
                    denials.append(exc)
                    assert ctx.trip is None  # the chain is not tripped by it
            with agent("critic"):
                ask(client, "critic")
    # The researcher's 3 steps count across its entries; the critic goes on
    # until the chain's own 12 steps are spent (3 + 9).
    assert sent_by(server, "researcher") == 3
    assert sent_by(server, "critic") == 9
    assert server.count(CHAT) == 12
    assert chain_stop.value.reason == "steps" and chain_stop.value.agent is None
    assert chain_stop.value.limit == 12
    assert len(denials) == 6  # rounds 4..9 each denied the researcher, nothing sent
    first = denials[0]
    assert (first.reason, first.agent, first.limit, first.observed) == ("steps", "researcher", 3, 4)
    assert first.chain_id == ctx.chain_id
    assert "agent 'researcher'" in str(first)
    assert ctx.snapshot().steps == 12


def test_an_agent_cost_ceiling_adds_up_across_entries() -> None:
    calls: list[int] = []
    hint = WrapOptions(cost_estimate_hint=0.05)
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        for round_ in range(5):
            with agent("writer", config=ExecutionConfig(max_cost_usd=0.2)):
                for _ in range(2):
                    ctx.wrap_llm_call(lambda r=round_: calls.append(r), hint)
            ctx.wrap_llm_call(lambda: calls.append(-1), hint)  # outside the writer
    # 4 x $0.05 = $0.20 for the writer (rounds 0 and 1); the chain's own
    # calls go on: 5 of them, $0.45 in all.
    assert calls.count(-1) == 5
    assert sorted(c for c in calls if c >= 0) == [0, 0, 1, 1]
    assert ctx.snapshot().cost_usd == pytest.approx(0.45)
    assert ctx.trip is None


def test_nested_agents_are_each_bound(client: openai.OpenAI, server: FakeLLMServer) -> None:
    outcomes: list[str | None] = []
    with ExecutionContext(ExecutionConfig(max_steps=100)):
        for _ in range(4):
            with agent("planner", config=ExecutionConfig(max_steps=5)):
                with agent("researcher", config=ExecutionConfig(max_steps=2)):
                    try:
                        ask(client, "researcher")
                        outcomes.append(None)
                    except BudgetExceededError as exc:
                        outcomes.append(exc.agent)
                try:
                    ask(client, "planner")
                    outcomes.append(None)
                except BudgetExceededError as exc:
                    outcomes.append(exc.agent)
    # researcher: 2 (its own ceiling); planner: 5 in all, 2 of them via the researcher.
    assert sent_by(server, "researcher") == 2
    assert sent_by(server, "planner") == 3
    assert outcomes == [
        None, None,  # round 1: researcher, planner
        None, None,  # round 2
        "researcher", None,  # round 3: researcher's 3rd denied; planner's 5th step
        "planner", "planner",  # round 4: the planner's 5 steps are spent (checked first)
    ]  # fmt: skip


def test_a_sub_agent_chain_counts_in_its_roots_agent(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=50)) as ctx:
        with agent("researcher", config=RESEARCHER):
            ask(client, "researcher")
            with ctx.spawn_child(ExecutionConfig(max_steps=10)) as child:
                ask(client, "researcher")
                ask(client, "researcher")
                with pytest.raises(BudgetExceededError) as err:
                    ask(client, "researcher")
        assert err.value.agent == "researcher" and err.value.chain_id == child.chain_id
        assert child.trip is None and ctx.trip is None
        with agent("critic"):
            ask(client, "critic")
    assert sent_by(server, "researcher") == 3


def test_agent_limits_follow_into_threads(client: openai.OpenAI, server: FakeLLMServer) -> None:
    with (
        ExecutionContext(ExecutionConfig(max_steps=100)),
        agent("researcher", config=ExecutionConfig(max_steps=4)),
        ThreadPoolExecutor(max_workers=8) as pool,
    ):
        # The OpenAI instrumentor carries the OpenTelemetry context (the agent
        # scope with it) into pool tasks: 8 threads share one researcher budget.
        futures = [pool.submit(ask, client, "researcher") for _ in range(10)]
        errors = [f.exception() for f in futures]
    denied = [e for e in errors if e is not None]
    assert sent_by(server, "researcher") == 4
    assert len(denied) == 6
    assert all(isinstance(e, BudgetExceededError) and e.agent == "researcher" for e in denied)


def test_call_spans_and_the_trip_event_name_the_agent(
    client: openai.OpenAI, server: FakeLLMServer, span_exporter: InMemorySpanExporter
) -> None:
    span_exporter.clear()
    with ExecutionContext(ExecutionConfig(max_steps=10)):
        with agent("researcher", config=ExecutionConfig(max_steps=1)):
            ask(client, "researcher")
            with pytest.raises(BudgetExceededError):
                ask(client, "researcher")
        with agent("critic"):
            ask(client, "critic")
    calls = [s for s in span_exporter.get_finished_spans() if s.name == "chat gpt-4o-mini"]
    assert len(calls) == 3
    bounded, denied, free = calls
    assert bounded.attributes["veronica.agent"] == "researcher"
    assert bounded.attributes["veronica.decision"] == "ALLOW"
    assert denied.attributes["veronica.agent"] == "researcher"
    assert denied.attributes["veronica.decision"] == "HALT"
    trip = [e for e in denied.events if e.name == "veronica.trip"]
    assert len(trip) == 1 and trip[0].attributes["veronica.agent"] == "researcher"
    assert "veronica.agent" not in free.attributes  # the critic has no limits of its own
    assert server.count(CHAT) == 2


POLICY = """
[agents."researcher"]
max_steps = 2

[agents."writer"]
max_steps = 1
"""


def policy_chain(path: Path, text: str, clock: FakeClock | None = None) -> ExecutionContext:
    path.write_text(text)
    policy = PolicyFile(path, check_interval_s=1.0, clock=clock or FakeClock())
    return ExecutionContext(ExecutionConfig(max_steps=20), PolicyPipeline([FilePolicy(policy)]))


def test_policy_file_agents_by_scope_and_by_span_attribute(
    client: openai.OpenAI,
    server: FakeLLMServer,
    tmp_path: Path,
    span_exporter: InMemorySpanExporter,  # a recording SDK span keeps the attribute
) -> None:
    tracer = trace.get_tracer("some.agent.framework")
    outcomes: dict[str, list[str | None]] = {"researcher": [], "writer": [], "critic": []}
    with policy_chain(tmp_path / "policy.toml", POLICY) as ctx:
        for _ in range(3):
            for who, seen in outcomes.items():
                try:
                    if who == "writer":  # named only by a framework's span
                        with tracer.start_as_current_span(
                            "invoke_agent writer", attributes={"gen_ai.agent.name": "writer"}
                        ):
                            ask(client, who)
                    else:
                        with agent(who):  # no config in code: the file's limits
                            ask(client, who)
                    seen.append(None)
                except BudgetExceededError as exc:
                    seen.append(exc.agent)
        assert ctx.trip is None
    assert outcomes == {
        "researcher": [None, None, "researcher"],
        "writer": [None, "writer", "writer"],
        "critic": [None, None, None],
    }
    assert (sent_by(server, "researcher"), sent_by(server, "writer")) == (2, 1)
    assert sent_by(server, "critic") == 3


def test_code_config_wins_over_the_policy_file(
    client: openai.OpenAI, server: FakeLLMServer, tmp_path: Path
) -> None:
    with (
        policy_chain(tmp_path / "policy.toml", POLICY),
        agent("researcher", config=ExecutionConfig(max_steps=4)),
    ):
        for _ in range(4):
            ask(client, "researcher")
        with pytest.raises(BudgetExceededError):
            ask(client, "researcher")
    assert sent_by(server, "researcher") == 4


def test_hot_reload_of_an_agent_limit_applies_to_the_next_call(
    client: openai.OpenAI, server: FakeLLMServer, tmp_path: Path
) -> None:
    clock = FakeClock()
    path = tmp_path / "policy.toml"
    with policy_chain(path, '[agents."researcher"]\nmax_steps = 5\n', clock) as ctx:
        with agent("researcher"):
            ask(client, "researcher")
            ask(client, "researcher")
            path.write_text('[agents."researcher"]\nmax_steps = 3\n')
            clock.advance(1.0)  # the next call re-reads the file
            ask(client, "researcher")  # step 3 of 3
            with pytest.raises(BudgetExceededError) as err:
                ask(client, "researcher")
            assert (err.value.agent, err.value.limit) == ("researcher", 3)
        with agent("critic"):
            ask(client, "critic")  # the chain goes on
        assert ctx.trip is None
    assert sent_by(server, "researcher") == 3


def test_raising_an_agent_limit_by_reload_before_it_is_spent(
    client: openai.OpenAI, server: FakeLLMServer, tmp_path: Path
) -> None:
    clock = FakeClock()
    path = tmp_path / "policy.toml"
    with policy_chain(path, '[agents."researcher"]\nmax_steps = 2\n', clock), agent("researcher"):
        ask(client, "researcher")
        path.write_text('[agents."researcher"]\nmax_steps = 4\n')
        clock.advance(1.0)
        for _ in range(3):
            ask(client, "researcher")
        with pytest.raises(BudgetExceededError):
            ask(client, "researcher")
    assert sent_by(server, "researcher") == 4


@pytest.mark.asyncio
async def test_async_agent_scope_with_limits(server: FakeLLMServer) -> None:
    async def ask_async(aclient: openai.AsyncOpenAI) -> None:
        await aclient.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "researcher: go"}],
            max_tokens=8,
        )

    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    try:
        async with (
            openai.AsyncOpenAI(
                base_url=server.openai_base_url, api_key="t", max_retries=0
            ) as aclient,
            ExecutionContext(ExecutionConfig(max_steps=10)),
            agent("researcher", config=ExecutionConfig(max_steps=2)),
        ):
            await ask_async(aclient)
            await ask_async(aclient)
            with pytest.raises(BudgetExceededError) as err:
                await ask_async(aclient)
    finally:
        instrumentor.uninstrument()
    assert err.value.agent == "researcher"
    assert sent_by(server, "researcher") == 2
