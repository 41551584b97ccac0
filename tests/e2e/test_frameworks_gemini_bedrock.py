"""Google ADK (Gemini API through google-genai) and Strands (Bedrock through
boto3, streamed), contained with zero code, each in its own venv
(:data:`tests._venvs.FRAMEWORK_ADK`, :data:`tests._venvs.FRAMEWORK_STRANDS`).

As in ``test_frameworks_openai_3.py``: a real agent with one tool against the
runaway fake server under ``VERONICA_MAX_STEPS=3``, counted at the server
after the process exited: Strands' and ADK's tool runs are steps too (2 model
requests), and nothing is sent after the denial. google-adk pins
``opentelemetry-api<=1.44``: it must resolve beside us (the newest ADK, not a
fallback to an older one with looser pins). Each framework is imported once for its tests
(:class:`FrameworkApp`).
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e._frameworks import FrameworkApp, agent_policy, framework_venv
from veronica_otel.testing import FakeLLMServer

STEPS = 3
SENT = 2  # under max_steps=3: model, tool, model; the second tool run is denied
GEMINI = "/v1beta/models/gemini-2.5-flash:generateContent"
BEDROCK = "/model/us.anthropic.claude-sonnet-4-20250514-v1%3A0/converse-stream"
CHAT = "/v1/chat/completions"  # a llama.cpp server's, OpenAI-compatible
# The newest google-adk on the package index when this test was written: a
# resolution that picks anything older fell back to dodge a conflict with us.
ADK_NEWEST = (2, 13, 0)


@pytest.fixture(scope="module")
def adk() -> Path:
    return framework_venv("FRAMEWORK_ADK")


@pytest.fixture(scope="module")
def strands() -> Path:
    return framework_venv("FRAMEWORK_STRANDS")


@pytest.fixture(scope="module")
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=5, runaway=True) as server:
        yield server


@pytest.fixture
def llm(server: FakeLLMServer) -> FakeLLMServer:
    server.reset()  # counts from this test's run alone
    return server


@pytest.fixture(scope="module")
def adk_app(adk: Path, server: FakeLLMServer) -> Iterator[FrameworkApp]:
    with FrameworkApp(
        adk,
        "google_adk_app.py",
        server,
        GOOGLE_GEMINI_BASE_URL=server.base_url,
        GOOGLE_API_KEY="test-key",
    ) as app:
        yield app


@pytest.fixture(scope="module")
def strands_app(strands: Path, server: FakeLLMServer) -> Iterator[FrameworkApp]:
    with FrameworkApp(
        strands,
        "strands_app.py",
        server,
        AWS_ENDPOINT_URL_BEDROCK_RUNTIME=server.base_url,
        AWS_ACCESS_KEY_ID="x",
        AWS_SECRET_ACCESS_KEY="x",
        AWS_REGION="us-east-1",
    ) as app:
        yield app


def _adk(app: FrameworkApp, **env: str) -> dict[str, object]:
    result, done = app.run(**env)
    assert result["how"] == "itself", (result, done.stderr[-2000:])  # ADK does not wrap it
    return result


def test_google_adk_resolves_beside_us_at_its_newest(adk: Path) -> None:
    # pip chose these, unpinned (the venv's only other requirement is us): the
    # ADK app's tests above and below run in it, so its start-up imports our
    # distro beside google.adk, and its calls are contained.
    site = next((adk / "lib").glob("python*/site-packages"))
    found = {
        re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower(): dist.version
        for dist in importlib.metadata.distributions(path=[str(site)])
    }
    assert "veronica-otel" in found, found
    adk_version = tuple(int(part) for part in found["google-adk"].split(".")[:3])
    assert adk_version >= ADK_NEWEST, found  # no fall-back to an old google-adk
    api = tuple(int(part) for part in found["opentelemetry-api"].split(".")[:2])
    assert (1, 41) <= api <= (1, 44), found  # within google-adk's pin and our floor


def test_google_adk_runaway_stops_at_max_steps(adk_app: FrameworkApp, llm: FakeLLMServer) -> None:
    result = _adk(adk_app, VERONICA_MAX_STEPS=str(STEPS))
    assert llm.stats() == {"total": SENT, "routes": {GEMINI: SENT}}
    assert result["reason"] == "steps" and result["agent"] is None


def test_google_adk_agent_limit_by_its_own_name(
    adk_app: FrameworkApp, llm: FakeLLMServer, tmp_path: Path
) -> None:
    # ADK's spans carry gen_ai.agent.name (its model requests), and its tool
    # runs are Looper's steps (tool_context.agent_name): [agents."Looper"] applies.
    policy = agent_policy(tmp_path, "Looper", STEPS)
    result = _adk(adk_app, VERONICA_POLICY_FILE=policy)
    assert llm.request_count == SENT
    assert result["agent"] == "Looper", result


def _strands(app: FrameworkApp, *args: str, **env: str) -> tuple[dict[str, Any], str]:
    result, done = app.run(*args, **env)
    return result, done.stderr[-2000:]


def test_strands_bedrock_runaway_stops_at_max_steps(
    strands_app: FrameworkApp, llm: FakeLLMServer
) -> None:
    result, stderr = _strands(strands_app, VERONICA_MAX_STEPS=str(STEPS))
    assert llm.stats() == {"total": SENT, "routes": {BEDROCK: SENT}}, stderr
    # Strands wraps any error of its event loop: ours is the __cause__ of its
    # EventLoopException.
    assert result["raised"] == "EventLoopException" and result["how"] == "cause", result
    assert result["reason"] == "steps"


def test_strands_agent_limit_by_its_name(
    strands_app: FrameworkApp, llm: FakeLLMServer, tmp_path: Path
) -> None:
    # Only the agent is limited: without StrandsInstrumentor naming it, the
    # runaway loop ran until Python's recursion limit (317 requests).
    policy = agent_policy(tmp_path, "Looper", STEPS)
    result, stderr = _strands(strands_app, VERONICA_POLICY_FILE=policy)
    assert llm.request_count == SENT, stderr
    assert result["how"] == "cause" and result["agent"] == "Looper", result


def test_strands_stream_async_is_named(
    strands_app: FrameworkApp, llm: FakeLLMServer, tmp_path: Path
) -> None:
    # stream_async iterated directly runs under the agent's name too.
    policy = agent_policy(tmp_path, "Looper", STEPS)
    result, stderr = _strands(strands_app, "stream", VERONICA_POLICY_FILE=policy)
    assert llm.request_count == SENT, stderr
    assert result["how"] == "cause" and result["agent"] == "Looper", result


def test_strands_never_retries_a_denial_whose_text_reads_as_throttling(
    strands_app: FrameworkApp, llm: FakeLLMServer
) -> None:
    # Strands' llama.cpp (and Mistral) model makes any error whose text holds
    # "429" or "rate" a ModelThrottledException, retried after 4 s, 8 s, ... 64 s;
    # a denial's text names its chain, here with "429" in its id. The app cuts
    # the sleeps and shows each retry: there must be none. One step: the
    # second call's model request is denied.
    result, done = strands_app.run(
        "throttled", VERONICA_MAX_STEPS="1", VERONICA_CHAIN_ID="runaway-429"
    )
    assert "delaying before next retry" not in done.stdout, done.stdout[-3000:]
    assert llm.stats() == {"total": 1, "routes": {CHAT: 1}}, done.stderr[-2000:]
    assert result["how"] == "cause" and result["reason"] == "steps", result
    assert "runaway-429" in result["message"], result
