"""Agent frameworks that pin openai<3, contained with zero code: crewAI and
LlamaIndex (one venv, :data:`tests._venvs.FRAMEWORKS_OPENAI_2`).

As in ``test_frameworks_openai_3.py``: a real agent with one tool against the
runaway fake server under ``VERONICA_MAX_STEPS=3``, counted at the server
after the process exited, the run ends with ours and nothing is sent after it:
crewAI's and LlamaIndex's tool runs are steps too (2 model requests). Each
framework is imported once for its tests, both in one process
(:meth:`FrameworkApp.hosting`); each test's run is still a process of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e._frameworks import FrameworkApp, HostedApp, agent_policy, framework_venv
from veronica_otel.testing import FakeLLMServer

STEPS = 3
SENT = 2  # under max_steps=3: model, tool, model; the second tool run is denied
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def venv() -> Path:
    return framework_venv("FRAMEWORKS_OPENAI_2")


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
        venv, ("crewai_app.py", "llama_index_app.py"), server, CREWAI_DISABLE_TELEMETRY="true"
    ) as host:
        yield host


@pytest.fixture
def crewai(apps: FrameworkApp) -> HostedApp:
    return apps.app("crewai_app.py")


@pytest.fixture
def llama_index(apps: FrameworkApp) -> HostedApp:
    return apps.app("llama_index_app.py")


def test_crewai_runaway_stops_at_max_steps(crewai: HostedApp, llm: FakeLLMServer) -> None:
    result, done = crewai.run(VERONICA_MAX_STEPS=str(STEPS))
    assert llm.stats() == {"total": SENT, "routes": {CHAT: SENT}}, done.stderr
    # crewAI logs the failed call and retries it; the trip is sticky, so the
    # retry is refused before it leaves, and ours leaves kickoff() as itself.
    assert result["how"] == "itself", result
    assert result["reason"] == "steps"


def test_llama_index_runaway_stops_at_max_steps(llama_index: HostedApp, llm: FakeLLMServer) -> None:
    result, done = llama_index.run(VERONICA_MAX_STEPS=str(STEPS))
    assert llm.stats() == {"total": SENT, "routes": {CHAT: SENT}}, done.stderr
    assert all(r.body.get("stream") is True for r in llm.requests)  # it streams by default
    assert result["how"] == "itself", result
    assert result["reason"] == "steps"


def test_crewai_agent_limit_by_its_role(
    crewai: HostedApp, llm: FakeLLMServer, tmp_path: Path
) -> None:
    policy = agent_policy(tmp_path, "Looper", STEPS)
    result, done = crewai.run(VERONICA_POLICY_FILE=policy)
    assert llm.request_count == SENT, done.stderr[-2000:]
    assert result["how"] == "itself" and result["agent"] == "Looper", result


def test_llama_index_agent_limit_by_its_name(
    llama_index: HostedApp, llm: FakeLLMServer, tmp_path: Path
) -> None:
    # FunctionAgent(name="Looper"): its model calls and its tool runs are Looper's.
    policy = agent_policy(tmp_path, "Looper", STEPS)
    result, done = llama_index.run(VERONICA_POLICY_FILE=policy)
    assert llm.request_count == SENT, done.stderr[-2000:]
    assert result["how"] == "itself" and result["agent"] == "Looper", result
