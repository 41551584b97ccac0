"""Agent frameworks on openai 3.x, contained with zero code: openai-agents,
pydantic-ai, LangGraph with langchain-openai (one venv, :data:`tests._venvs.FRAMEWORKS_OPENAI_3`).

Each runs a real agent with one tool against the runaway fake server (every
reply asks for another tool call, so the loop never ends on its own) under
``VERONICA_MAX_STEPS=3``: a step is a model call or a tool run, so exactly 2
model requests reach the server (model, tool, model; the second tool run is
denied), the run ends with our denial, and the count is taken after the process exited, so
nothing was sent after it. Each framework is imported once for its tests
(:class:`FrameworkApp`), all three in one process
(:meth:`FrameworkApp.hosting`): each test's run is still a process of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e._frameworks import FrameworkApp, HostedApp, agent_policy, framework_venv
from veronica_otel.testing import FakeLLMServer

STEPS = 3
SENT = 2  # under max_steps=3: model, tool, model; the second tool run is denied


@pytest.fixture(scope="module")
def venv() -> Path:
    return framework_venv("FRAMEWORKS_OPENAI_3")


@pytest.fixture(scope="module")
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=5, runaway=True) as server:
        yield server


@pytest.fixture
def llm(server: FakeLLMServer) -> FakeLLMServer:
    server.reset()  # counts from this test's run alone
    return server


@pytest.fixture(scope="module")
def apps(venv: Path, server: FakeLLMServer) -> Iterator[FrameworkApp]:
    with FrameworkApp.hosting(
        venv, ("openai_agents_app.py", "pydantic_ai_app.py", "langgraph_app.py"), server
    ) as host:
        yield host


@pytest.fixture
def openai_agents(apps: FrameworkApp) -> HostedApp:
    return apps.app("openai_agents_app.py")


@pytest.fixture
def pydantic_ai(apps: FrameworkApp) -> HostedApp:
    return apps.app("pydantic_ai_app.py")


@pytest.fixture
def langgraph(apps: FrameworkApp) -> HostedApp:
    return apps.app("langgraph_app.py")


def test_openai_agents_runaway_stops_at_max_steps(
    openai_agents: HostedApp, llm: FakeLLMServer
) -> None:
    result, done = openai_agents.run("runaway", VERONICA_MAX_STEPS=str(STEPS))
    assert llm.stats() == {"total": SENT, "routes": {"/v1/responses": SENT}}, done.stderr
    # The denied step is the second tool run: openai-agents wraps a tool's
    # error, so ours is the __cause__ of its UserError (a denied model call
    # would reach the caller as itself, as in the handoff test below).
    assert result["raised"] == "UserError" and result["how"] == "cause", result
    assert result["reason"] == "steps"


def test_openai_agents_handoff_loop_per_agent_limit(
    openai_agents: HostedApp, llm: FakeLLMServer, tmp_path: Path
) -> None:
    policy = agent_policy(tmp_path, "Alpha", 2)
    result, done = openai_agents.run("handoffs", VERONICA_POLICY_FILE=policy)
    models = [r.body.get("instructions") for r in llm.requests]
    # Alpha, Beta, Alpha, Beta, then Alpha's third call is denied: Alpha sent exactly 2.
    assert llm.request_count == 4, (models, done.stderr)
    assert result["how"] == "itself", result
    assert result["agent"] == "Alpha", result


def test_openai_agents_streamed_run_is_named(
    openai_agents: HostedApp, llm: FakeLLMServer, tmp_path: Path
) -> None:
    policy = agent_policy(tmp_path, "Looper", STEPS)
    result, done = openai_agents.run("streamed", VERONICA_POLICY_FILE=policy)
    assert llm.request_count == SENT, done.stderr[-2000:]
    # Looper's second tool run is denied; stream_events() raises the UserError.
    assert result["raised"] == "UserError" and result["how"] == "cause", result
    assert result["agent"] == "Looper", result


def test_pydantic_ai_runaway_stops_at_max_steps(pydantic_ai: HostedApp, llm: FakeLLMServer) -> None:
    result, done = pydantic_ai.run(VERONICA_MAX_STEPS=str(STEPS))
    assert llm.stats() == {"total": SENT, "routes": {"/v1/responses": SENT}}, done.stderr
    # Not a ModelAPIError, so no retry and no FallbackModel fallback: it leaves
    # run_sync as itself (under FallbackModel(fallback_on=(Exception,)) it would
    # come inside a FallbackExceptionGroup: ``except* BudgetExceededError``).
    assert result["how"] == "itself", result
    assert result["reason"] == "steps"


def test_langgraph_runaway_stops_at_max_steps(langgraph: HostedApp, llm: FakeLLMServer) -> None:
    result, done = langgraph.run(VERONICA_MAX_STEPS=str(STEPS))
    # LangChain tool runs are steps too (LangChainInstrumentor): model, tool,
    # model, then the second tool run is denied; 2 model requests were sent.
    assert llm.stats() == {"total": 2, "routes": {"/v1/chat/completions": 2}}, done.stderr
    assert result["how"] == "itself", result
    assert result["reason"] == "steps"


def test_pydantic_ai_agent_limit_by_its_name(
    pydantic_ai: HostedApp, llm: FakeLLMServer, tmp_path: Path
) -> None:
    policy = agent_policy(tmp_path, "Looper", STEPS)
    result, done = pydantic_ai.run(VERONICA_POLICY_FILE=policy)
    assert llm.request_count == SENT, done.stderr[-2000:]
    assert result["how"] == "itself" and result["agent"] == "Looper", result


def test_langgraph_node_limit_by_its_name(
    langgraph: HostedApp, llm: FakeLLMServer, tmp_path: Path
) -> None:
    # The ReAct graph is the node "Looper" of an outer graph (a supervisor's
    # sub-agent): its model and tool runs are Looper's. Model, tool, model,
    # then the tool run that would be Looper's fourth step is denied.
    policy = agent_policy(tmp_path, "Looper", 3)
    result, done = langgraph.run("nested", VERONICA_POLICY_FILE=policy)
    assert llm.request_count == 2, done.stderr[-2000:]
    assert result["how"] == "itself" and result["agent"] == "Looper", result
