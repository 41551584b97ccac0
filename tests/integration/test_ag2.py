"""AG2 (``ag2`` >= 1.2) agents, contained: model calls and tool runs are chain steps.

AG2 sends its model calls through the ``openai`` SDK (contained by
OpenAIInstrumentor); AG2Instrumentor makes each function-tool run a step.
The fake server's request count and the tools' own counters show what
really ran: nothing after the trip.
"""

from __future__ import annotations

from typing import Any

import httpx2
import pytest

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel.instrumentors.ag2 import AG2Instrumentor
from veronica_otel.testing import FakeLLMServer, RecordedRequest, ScriptedReply

CHAT = "/v1/chat/completions"


pytestmark = pytest.mark.fake_llm(output_tokens=3)

# AG2 is imported when the module's first test runs, not at collection: every
# pytest-xdist worker collects every module, and ``import ag2`` takes seconds of CPU.
Agent: Any = None
OpenAIConfig: Any = None
FunctionTool: Any = None


@pytest.fixture(scope="module", autouse=True)
def _ag2() -> None:
    global Agent, OpenAIConfig, FunctionTool
    pytest.importorskip("ag2")
    from ag2 import Agent as _Agent
    from ag2.config.openai import OpenAIConfig as _OpenAIConfig
    from ag2.tools.final.function_tool import FunctionTool as _FunctionTool

    Agent = _Agent
    OpenAIConfig = _OpenAIConfig
    FunctionTool = _FunctionTool


def counting_agent(server: FakeLLMServer, http: httpx2.AsyncClient, runs: list[int]) -> Agent:
    def count(n: int) -> str:
        """Count to n."""
        runs.append(n)
        return f"counted to {n}"

    config = OpenAIConfig(
        model="gpt-4o-mini", base_url=server.openai_base_url, api_key="test", http_client=http
    )
    return Agent("counter", "You count.", config=config, tools=[count])


def _keep_counting(request: RecordedRequest) -> ScriptedReply:
    return ScriptedReply.tool_call("count", {"n": len(request.body["messages"])})


@pytest.mark.asyncio
@pytest.mark.usefixtures("ag2_instrumented")
async def test_a_runaway_ag2_agent_stops_at_max_steps_counting_tool_runs(
    server: FakeLLMServer, ag2_http: httpx2.AsyncClient
) -> None:
    runs: list[int] = []
    server.set_responder(_keep_counting)
    agent = counting_agent(server, ag2_http, runs)
    with pytest.raises(BudgetExceededError) as caught:
        async with ExecutionContext(ExecutionConfig(max_steps=5)) as ctx:
            await agent.ask("Count for me.")
    assert caught.value.reason == "steps"
    # model, tool, model, tool, model: the 6th step (a tool run) is denied, and
    # the model call after it is never sent.
    assert server.count(CHAT) == 3
    assert len(runs) == 2
    assert ctx.snapshot().steps == 5


@pytest.mark.asyncio
@pytest.mark.usefixtures("ag2_instrumented")
async def test_the_same_tool_call_repeated_trips_loop(
    server: FakeLLMServer, ag2_http: httpx2.AsyncClient
) -> None:
    runs: list[int] = []
    server.set_responder(lambda request: ScriptedReply.tool_call("count", {"n": 7}))
    agent = counting_agent(server, ag2_http, runs)
    with pytest.raises(BudgetExceededError) as caught:
        async with ExecutionContext(ExecutionConfig(max_repeats=2, max_steps=100)):
            await agent.ask("Count to seven, again and again.")
    assert caught.value.reason == "loop"
    assert runs == [7, 7]
    assert server.count(CHAT) == 3  # the model call after the denied run is not sent


@pytest.mark.asyncio
@pytest.mark.usefixtures("ag2_instrumented")
async def test_two_ag2_agents_that_never_agree_stop_at_the_handoff_ceiling(
    server: FakeLLMServer, ag2_http: httpx2.AsyncClient
) -> None:
    config = OpenAIConfig(
        model="gpt-4o-mini", base_url=server.openai_base_url, api_key="test", http_client=ag2_http
    )
    planner = Agent("planner", "You write plans.", config=config)
    critic = Agent("critic", "You reject plans.", config=config)
    turns = 0
    with pytest.raises(BudgetExceededError) as caught:
        async with ExecutionContext(ExecutionConfig(max_handoffs=4, max_steps=100)):
            draft = "a plan"
            for _ in range(30):  # they never agree
                review = await critic.ask(f"Critique: {draft}")
                turns += 1
                draft = (await planner.ask(f"Revise after: {await review.content()}")).body or ""
                turns += 1
    assert caught.value.reason == "loop"
    # critic, planner (1), critic (2), planner (3), critic (4): the 5th handoff is denied.
    assert turns == 5
    assert server.count(CHAT) == 5


@pytest.mark.asyncio
async def test_uninstrument_restores_the_tool_path(
    server: FakeLLMServer, ag2_http: httpx2.AsyncClient
) -> None:
    original, original_ask = FunctionTool.__dict__["__call__"], Agent.__dict__["ask"]
    instrumentor = AG2Instrumentor()
    instrumentor.instrument()
    instrumentor.instrument()  # idempotent
    assert FunctionTool.__dict__["__call__"] is not original
    instrumentor.uninstrument()
    assert FunctionTool.__dict__["__call__"] is original
    assert Agent.__dict__["ask"] is original_ask

    runs: list[int] = []
    server.script(ScriptedReply.tool_call("count", {"n": 1}), "done")
    agent = counting_agent(server, ag2_http, runs)
    async with ExecutionContext(ExecutionConfig(max_steps=1)) as ctx:
        await agent.ask("Count once.")  # nothing instrumented: nothing counted
    assert runs == [1]
    assert ctx.snapshot().steps == 0
