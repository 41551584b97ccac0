"""AG2 agents get their limits from the policy file's ``[agents."name"]``.

``Agent.ask`` runs as the agent named after the AG2 agent (AG2Instrumentor),
so a chain that follows a policy file bounds each AG2 agent by its table;
the fake server's recorded requests show what each agent really sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import pytest

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext, PolicyPipeline
from veronica_otel.policy_file import FilePolicy, PolicyFile
from veronica_otel.testing import FakeLLMServer

CHAT = "/v1/chat/completions"


# AG2 is imported when the module's first test runs, not at collection: every
# pytest-xdist worker collects every module, and ``import ag2`` takes seconds of
# CPU (about 6 here), so the modules that import it share one worker ("ag2").
pytestmark = pytest.mark.fake_llm(output_tokens=3)
Agent: Any = None
OpenAIConfig: Any = None


@pytest.fixture(scope="module", autouse=True)
def _ag2() -> None:
    global Agent, OpenAIConfig
    pytest.importorskip("ag2")
    from ag2 import Agent as _Agent
    from ag2.config.openai import OpenAIConfig as _OpenAIConfig

    Agent = _Agent
    OpenAIConfig = _OpenAIConfig


def sent_with(server: FakeLLMServer, prompt: str) -> int:
    return sum(
        1
        for r in server.requests
        if r.path == CHAT and any(prompt in str(m.get("content")) for m in r.body["messages"])
    )


@pytest.mark.asyncio
@pytest.mark.usefixtures("ag2_instrumented")
async def test_an_ag2_agent_stops_at_its_policy_file_limit_while_the_other_goes_on(
    server: FakeLLMServer, ag2_http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    path = tmp_path / "policy.toml"
    path.write_text('[agents."critic"]\nmax_steps = 2\n')
    pipeline = PolicyPipeline([FilePolicy(PolicyFile(path))])
    config = OpenAIConfig(
        model="gpt-4o-mini", base_url=server.openai_base_url, api_key="test", http_client=ag2_http
    )
    planner = Agent("planner", "You write plans.", config=config)
    critic = Agent("critic", "You reject plans.", config=config)
    denied: list[BudgetExceededError] = []
    async with ExecutionContext(ExecutionConfig(max_steps=100), pipeline) as ctx:
        for round_ in range(5):
            try:
                await critic.ask(f"Critique plan {round_}")
            except BudgetExceededError as exc:
                denied.append(exc)
            await planner.ask(f"Write plan {round_ + 1}")
        assert ctx.trip is None
    assert sent_with(server, "You reject plans.") == 2
    assert sent_with(server, "You write plans.") == 5
    assert [e.agent for e in denied] == ["critic"] * 3
    assert denied[0].reason == "steps" and denied[0].limit == 2
