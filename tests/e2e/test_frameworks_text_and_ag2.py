"""smolagents, AG2 and dspy, contained with zero code, in one venv
(:data:`tests._venvs.FRAMEWORKS_TEXT`).

As in ``test_frameworks_openai_3.py``: a real agent with one tool against the
runaway fake server under ``VERONICA_MAX_STEPS=3``, counted at the server
after the process exited. dspy's ReAct asks for tools in its own text fields,
not the API's tool calls, so its runaway model is a responder answering in
dspy's chat format with another ``lookup`` every turn; and dspy sends through
its own raw-socket client unless the call goes through LiteLLM, which
``DSPyInstrumentor`` makes every call in a chain do. The three are imported
once for their tests, in one process (:meth:`FrameworkApp.hosting`): each
test's run is still a process of its own. AG2's tests include an unchanged
agent's tool runs counted as steps and two agents of which a policy file
bounds one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e._frameworks import FrameworkApp, HostedApp, agent_policy, framework_venv
from veronica_otel.testing import FakeLLMServer, RecordedRequest

STEPS = 3
SENT = 2  # under max_steps=3: model, tool, model; the second tool run is denied
CHAT = "/v1/chat/completions"
DSPY_TURN = (
    "[[ ## next_thought ## ]]\nOnce more.\n\n[[ ## next_tool_name ## ]]\nlookup\n\n"
    '[[ ## next_tool_args ## ]]\n{"city": "Paris"}\n\n[[ ## completed ## ]]'
)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=5, runaway=True) as server:
        yield server


@pytest.fixture
def llm(server: FakeLLMServer) -> FakeLLMServer:
    server.reset()  # counts from this test's run alone
    return server


@pytest.fixture(scope="module")
def apps(server: FakeLLMServer) -> Iterator[FrameworkApp]:
    venv = framework_venv("FRAMEWORKS_TEXT")
    with FrameworkApp.hosting(
        venv, ("smolagents_app.py", "ag2_app.py", "dspy_app.py"), server
    ) as host:
        yield host


@pytest.fixture
def smolagents(apps: FrameworkApp) -> HostedApp:
    return apps.app("smolagents_app.py")


@pytest.fixture
def ag2(apps: FrameworkApp) -> HostedApp:
    return apps.app("ag2_app.py")


@pytest.fixture
def dspy(apps: FrameworkApp) -> HostedApp:
    return apps.app("dspy_app.py")


def test_smolagents_runaway_stops_at_max_steps(smolagents: HostedApp, llm: FakeLLMServer) -> None:
    result, done = smolagents.run(VERONICA_MAX_STEPS=str(STEPS))
    assert llm.stats() == {"total": SENT, "routes": {CHAT: SENT}}, done.stderr[-2000:]
    # smolagents wraps a model error: ours is the __cause__ of its AgentGenerationError.
    assert result["raised"] == "AgentGenerationError" and result["how"] == "cause", result
    assert result["reason"] == "steps"


def test_smolagents_agent_limit_by_its_name(
    smolagents: HostedApp, llm: FakeLLMServer, tmp_path: Path
) -> None:
    policy = agent_policy(tmp_path, "Looper", STEPS)
    result, done = smolagents.run(VERONICA_POLICY_FILE=policy)
    assert llm.request_count == SENT, done.stderr[-2000:]
    assert result["how"] == "cause" and result["agent"] == "Looper", result


def test_smolagents_streamed_run_is_named(
    smolagents: HostedApp, llm: FakeLLMServer, tmp_path: Path
) -> None:
    policy = agent_policy(tmp_path, "Looper", STEPS)
    result, done = smolagents.run("stream", VERONICA_POLICY_FILE=policy)
    assert llm.request_count == SENT, done.stderr[-2000:]
    assert result["how"] == "cause" and result["agent"] == "Looper", result


def test_smolagents_never_retries_a_denial_whose_text_reads_as_a_rate_limit(
    smolagents: HostedApp, llm: FakeLLMServer
) -> None:
    # smolagents retries an error whose text holds "429" twice, after 2-4 and then
    # 4-16 minutes; a denial's text names its chain, here with "429" in its id (a
    # random one holds it about once in 140 runs: the streamed run that hung). The
    # app cuts the sleeps and shows each retry: there must be none.
    result, done = smolagents.run(
        "retries", VERONICA_MAX_STEPS=str(STEPS), VERONICA_CHAIN_ID="runaway-429"
    )
    assert "Retrying create" not in done.stdout, done.stdout[-3000:]
    assert llm.stats() == {"total": SENT, "routes": {CHAT: SENT}}, done.stderr[-2000:]
    assert result["how"] == "cause" and result["reason"] == "steps", result
    assert "runaway-429" in result["message"], result


def test_ag2_runaway_stops_at_max_steps(ag2: HostedApp, llm: FakeLLMServer) -> None:
    result, done = ag2.run(VERONICA_MAX_STEPS=str(STEPS))
    # AG2 tool runs are steps too (AG2Instrumentor): model, tool, model, then
    # the second tool run is denied; 2 model requests were sent.
    assert llm.stats() == {"total": 2, "routes": {CHAT: 2}}, done.stderr[-2000:]
    assert result["how"] == "itself", result
    assert result["reason"] == "steps"


def test_ag2_agent_limit_by_its_name(ag2: HostedApp, llm: FakeLLMServer, tmp_path: Path) -> None:
    policy = agent_policy(tmp_path, "Looper", 3)
    result, done = ag2.run(VERONICA_POLICY_FILE=policy)
    # Looper's model, tool, model; its second tool run is denied, and so is
    # the model call AG2 makes with the error: Looper sent exactly 2.
    assert llm.request_count == 2, done.stderr[-2000:]
    assert result["how"] == "itself" and result["agent"] == "Looper", result


def test_ag2_tool_runs_are_steps_and_the_next_model_call_is_never_sent(
    ag2: HostedApp, llm: FakeLLMServer
) -> None:
    result, done = ag2.run(VERONICA_MAX_STEPS="4")
    # Model, tool, model, tool: both tools ran, and the 5th step (a model call) is never sent.
    assert done.stdout.count("tool ran ") == 2, done.stdout
    assert llm.stats() == {"total": 2, "routes": {CHAT: 2}}, done.stderr[-2000:]
    assert result["how"] == "itself" and result["reason"] == "steps", result


def test_ag2_agents_get_their_limits_from_the_policy_file(
    ag2: HostedApp, llm: FakeLLMServer, tmp_path: Path
) -> None:
    # The critic is bounded by its table, the planner by the file's [limits] only.
    policy = tmp_path / "policy.toml"
    policy.write_text('[limits]\nmax_steps = 100\n\n[agents."critic"]\nmax_steps = 2\n')
    result, done = ag2.run("team", VERONICA_POLICY_FILE=str(policy))
    assert result["raised"] is None, (result, done.stderr[-2000:])
    assert _sent_with(llm, "You reject plans.") == 2
    assert _sent_with(llm, "You write plans.") == 4
    assert done.stdout.count("critic ok") == 2
    assert done.stdout.count("critic stopped: BudgetExceededError critic") == 2
    assert done.stdout.count("planner ok") == 4


def _sent_with(server: FakeLLMServer, prompt: str) -> int:
    return sum(
        1
        for r in server.requests
        if r.path == CHAT and any(prompt in str(m.get("content")) for m in r.body["messages"])
    )


def test_dspy_react_runaway_stops_at_max_steps(dspy: HostedApp, llm: FakeLLMServer) -> None:
    def dspy_turn(request: RecordedRequest) -> str:
        return DSPY_TURN

    llm.set_responder(dspy_turn)
    result, done = dspy.run(
        VERONICA_MAX_STEPS=str(STEPS),
        LITELLM_LOCAL_MODEL_COST_MAP="True",  # no network fetch at import
        OPENAI_BASE_URL=None,  # no environment gateway: dspy would choose its native client
        OPENAI_API_BASE=None,
    )
    assert llm.stats() == {"total": SENT, "routes": {CHAT: SENT}}, done.stderr[-2000:]
    # Its native client (own sockets, no HTTP hook sees it) is not used in a
    # chain: DSPyInstrumentor sends the calls through LiteLLM, contained.
    assert all(r.headers.get("user-agent") != "lm15/stdlib" for r in llm.requests)
    # dspy wraps a model error: ours is the __cause__ of its LMUnexpectedError.
    assert result["raised"] == "LMUnexpectedError" and result["how"] == "cause", result
    assert result["reason"] == "steps"
    # Then an LM pinned to the native engine, called directly: its send is
    # refused at lm15's transport, loudly, and nothing more reached the server.
    assert "cannot contain dspy's native lm15 transport" in str(result["native"]), result
