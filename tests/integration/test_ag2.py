"""AG2 (``ag2`` >= 1.2) agents are contained through the ``openai`` instrumentor.

AG2 sends its model calls through the ``openai`` SDK, so no AG2-specific hook
is needed for them: a runaway tool-calling agent is stopped by ``max_steps``
and nothing is sent after the trip. (AG2's own tool runs are not chain steps
yet; this test pins what they do today.) Skipped where AG2 is not installed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("ag2")

from ag2 import Agent
from ag2.config.openai import OpenAIConfig

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer, RecordedRequest, ScriptedReply

CHAT = "/v1/chat/completions"


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=3) as fake:
        yield fake


@pytest.fixture
def instrumented() -> Iterator[OpenAIInstrumentor]:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    yield instrumentor
    instrumentor.uninstrument()


def _keep_counting(request: RecordedRequest) -> ScriptedReply:
    return ScriptedReply.tool_call("count", {"n": len(request.body["messages"])})


# AG2 does not close its openai client's connection when a run ends.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.asyncio
async def test_a_runaway_ag2_agent_is_stopped_by_max_steps(
    server: FakeLLMServer, instrumented: OpenAIInstrumentor
) -> None:
    runs: list[int] = []

    def count(n: int) -> str:
        """Count to n."""
        runs.append(n)
        return f"counted to {n}"

    server.set_responder(_keep_counting)
    config = OpenAIConfig(model="gpt-4o-mini", base_url=server.openai_base_url, api_key="test")
    agent = Agent("counter", "You count.", config=config, tools=[count])
    with pytest.raises(BudgetExceededError) as caught:
        async with ExecutionContext(ExecutionConfig(max_steps=3)) as ctx:
            await agent.ask("Count for me.")
    assert caught.value.reason == "steps"
    assert server.count(CHAT) == 3  # the fourth model call was denied, not sent
    assert ctx.snapshot().steps == 3  # model calls only: AG2 tool runs are not steps yet
    assert len(runs) == 3
