"""Zero code changes: an unchanged script under ``opentelemetry-instrument``.

The script, the SDK and the HTTP traffic are real; the LLM is the embedded
fake server, whose request count is the ground truth of what was sent.

What start-up itself does with the environment (a malformed value, a
configurator that fails, hostile propagation and vendor-guard variables, read
by the instrumentors' own installation) is tested in a process of its own per
run, each forked before start-up from one process that imported what start-up
imports and then started as ``opentelemetry-instrument`` starts it
(:func:`tests._zero_code.start_runs`); one run is the real
``opentelemetry-instrument`` from start to end. The tests that vary only the
limits, the pools (``VERONICA_POOLS``), the policy file and the script run as
scenarios of one zero-code process (``apps/unchanged_scripts.py``, a
:class:`FrameworkApp` the worker's modules share: the ``zero_code_scripts``
fixture): each in a process forked from it after openai's import, its default
chain built from its own ``VERONICA_*`` variables.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests._zero_code import (
    UNCHANGED_AGENT,
    ScriptRuns,
    environment,
    printed,
    run_instrumented,
    start_runs,
)
from veronica_otel.testing import FakeLLMServer

APPS = Path(__file__).parent / "apps"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def module_server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=10) as srv:
        yield srv


@pytest.fixture
def server(module_server: FakeLLMServer) -> FakeLLMServer:
    module_server.reset()  # counts from this test's run alone
    return module_server


@pytest.fixture(scope="module")
def scripts(zero_code_scripts: ScriptRuns, module_server: FakeLLMServer) -> ScriptRuns:
    return ScriptRuns(zero_code_scripts, module_server)


def run_app(server: FakeLLMServer, **env: str) -> subprocess.CompletedProcess[str]:
    return run_instrumented(UNCHANGED_AGENT, server, **env)


# The unchanged agent's runs whose start-up is under test: name -> its variables.
STARTED = {
    # The default OTLP exporter is not installed: the SDK configurator raises.
    "exporter-fails": {"VERONICA_MAX_STEPS": "2", "OTEL_TRACES_EXPORTER": "otlp"},
    "malformed": {"VERONICA_MAX_STEPS": "three"},
    "bad-propagation": {
        "VERONICA_MAX_STEPS": "3",
        "VERONICA_PROPAGATE_HOSTS": "svc:99999",
        "VERONICA_GRANT_KEY": "k" * 16,
    },
    "bad-vendor-guard": {"VERONICA_MAX_STEPS": "3", "VERONICA_VENDOR_GUARD": "contian"},
}
Started = dict[str, tuple[subprocess.CompletedProcess[str], FakeLLMServer]]


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    """Each run of :data:`STARTED`, a process of its own with an LLM of its own."""
    with ExitStack() as stack:
        servers = {name: stack.enter_context(FakeLLMServer(output_tokens=10)) for name in STARTED}
        done = start_runs(
            Path(sys.executable),
            {
                name: (
                    (UNCHANGED_AGENT,),
                    {"OPENAI_BASE_URL": servers[name].openai_base_url, **env},
                )
                for name, env in STARTED.items()
            },
            tmp_path_factory.mktemp("started"),
            environment(None),
        )
        yield {name: (done[name], servers[name]) for name in STARTED}


def test_unchanged_app_trips_at_exactly_max_steps(server: FakeLLMServer) -> None:
    result = run_app(server, VERONICA_MAX_STEPS="3")
    assert result.returncode != 0
    assert result.stdout.splitlines() == [f"step {i} ok" for i in range(3)]
    assert "BudgetExceededError" in result.stderr
    assert "steps limit reached" in result.stderr
    assert server.count("/v1/chat/completions") == 3


def test_unchanged_mcp_agent_trips_at_exactly_max_steps(
    scripts: ScriptRuns, server: FakeLLMServer
) -> None:
    # The distro patches the mcp client when the app imports it: no code, no entry point.
    agent = APPS / "unchanged_mcp_agent.py"
    result, done = scripts.run(str(agent), VERONICA_MAX_STEPS="3")
    assert printed(done) == [f"step {i} ok" for i in range(3)], done.stderr[-2000:]
    assert result["reason"] == "steps", result  # ours, raised or inside the task group's


def test_unchanged_langchain_tools_trip_at_exactly_max_steps(
    scripts: ScriptRuns, server: FakeLLMServer
) -> None:
    # The distro patches BaseTool when the app imports langchain_core.
    app = APPS / "unchanged_langchain_tools.py"
    result, done = scripts.run(str(app), VERONICA_MAX_STEPS="3")
    assert printed(done) == [f"step {i} ok" for i in range(3)], done.stderr[-2000:]
    assert result["raised"] == "BudgetExceededError" and result["reason"] == "steps", result


CLIENTS = ("google-genai", "bedrock", "mistralai", "cohere", "ollama", "litellm", "requests")


def test_every_provider_client_is_contained_with_zero_code(
    scripts: ScriptRuns, server: FakeLLMServer
) -> None:
    # One script calls google-genai, Bedrock (boto3), mistralai, cohere, ollama,
    # litellm and a plain ``requests.post`` to a provider path (the vendor
    # guard), each once, then each again, under VERONICA_MAX_STEPS equal to the
    # number of clients: each first call reaches the fake server, no second one
    # does. It imports those SDKs itself, after start-up, as an app does.
    clients = CLIENTS
    result, done = scripts.run(
        str(APPS / "unchanged_providers.py"),  # FAKE_LLM_URL: the server's (ScriptRuns)
        VERONICA_MAX_STEPS=str(len(clients)),
        # the local model is priced at zero only by configuration; no cost ceiling here
    )
    assert result["raised"] is None, (result, done.stderr[-3000:])
    # The app's own lines (litellm prints banners of its own on stdout).
    lines = [line for line in printed(done) if line.split(" ")[0] in clients]
    first, second = lines[: len(clients)], lines[len(clients) :]
    assert first == [f"{name} sent" for name in clients], done.stdout + done.stderr
    # Every second call refused, each as our own error (no SDK wrapper of it).
    assert second == [f"{name} refused BudgetExceededError" for name in clients], done.stdout
    assert server.request_count == len(clients)


def test_cost_ceiling_from_env(scripts: ScriptRuns, server: FakeLLMServer) -> None:
    # Each call reserves (clamped) the whole remaining budget, so a tiny ceiling
    # admits calls only while what is left can still buy an answer.
    result, done = scripts.run(str(UNCHANGED_AGENT), VERONICA_MAX_COST_USD="0.0000001")
    assert result["raised"] == "BudgetExceededError" and result["reason"] == "cost", result
    assert printed(done) == []
    assert server.count(CHAT) == 0


def test_enforcement_holds_when_the_exporter_configuration_fails(started: Started) -> None:
    # The SDK configurator raises and opentelemetry-instrument skips every
    # instrumentor. Ours are already in.
    result, server = started["exporter-fails"]
    assert "Failed to auto initialize OpenTelemetry" in result.stderr or (
        "Configuration of" in result.stderr
    )
    assert result.stdout.splitlines() == ["step 0 ok", "step 1 ok"]
    assert server.count("/v1/chat/completions") == 2


def test_malformed_env_fails_closed_naming_the_variable(started: Started) -> None:
    result, server = started["malformed"]
    assert result.returncode != 0
    assert "VERONICA_MAX_STEPS='three'" in result.stderr
    assert result.stdout == ""
    assert server.count("/v1/chat/completions") == 0


def test_a_bad_propagation_variable_is_named_and_calls_are_refused(started: Started) -> None:
    result, server = started["bad-propagation"]
    assert result.returncode != 0
    assert result.stdout == ""
    assert server.count(CHAT) == 0
    assert "VERONICA_PROPAGATE_HOSTS: bad port in host pattern 'svc:99999'" in result.stderr
    # The instrumentors that read the variable say which one stopped them.
    failures = [line for line in result.stderr.splitlines() if "could not install" in line]
    assert failures
    assert all("VERONICA_PROPAGATE_HOSTS" in line for line in failures)


def test_a_bad_vendor_guard_mode_is_named_and_calls_are_refused(started: Started) -> None:
    result, server = started["bad-vendor-guard"]
    assert result.returncode != 0
    assert result.stdout == ""  # not one step ran uncontained
    assert server.count(CHAT) == 0
    assert "VERONICA_VENDOR_GUARD must be one of contain, refuse, off, got 'contian'" in (
        result.stderr
    )


def test_no_limits_set_runs_everything(scripts: ScriptRuns, server: FakeLLMServer) -> None:
    result, done = scripts.run(str(UNCHANGED_AGENT))
    assert result["raised"] is None and done.returncode == 0, (result, done.stderr[-2000:])
    assert printed(done) == [f"step {i} ok" for i in range(5)]
    assert server.count(CHAT) == 5


def test_the_zero_code_example_runs_as_its_readme_says(
    scripts: ScriptRuns, server: FakeLLMServer
) -> None:
    example = Path(__file__).parents[2] / "examples" / "zero_code" / "agent.py"
    result, done = scripts.run(str(example), VERONICA_MAX_STEPS="5", VERONICA_MAX_COST_USD="0.01")
    assert [line.split(":")[0] for line in printed(done)] == [f"round {i}" for i in range(5)]
    assert result["raised"] == "BudgetExceededError", result
    assert "steps limit reached (limit 5, this call would make it 6)" in result["message"]
    assert server.count(CHAT) == 5
    assert all("max_completion_tokens" in r.body for r in server.requests)  # clamped


# -- VERONICA_POOLS: the default chain joins the pools the variable names


def pools_policy(tmp_path: Path) -> str:
    path = tmp_path / "policy.toml"
    path.write_text(
        "[limits]\nmax_steps = 100\n"
        '[pools."tenant:acme"]\nmax_steps = 3\nwindow = "1d"\n'
        '[pools."user:alice"]\nmax_steps = 50\n',
        encoding="utf-8",
    )
    return str(path)


def test_the_default_chain_stops_at_the_pool_the_variable_names(
    scripts: ScriptRuns, server: FakeLLMServer, tmp_path: Path
) -> None:
    result, done = scripts.run(
        str(UNCHANGED_AGENT),
        VERONICA_POLICY_FILE=pools_policy(tmp_path),
        VERONICA_POOLS="tenant:acme,user:alice",
    )
    assert server.count(CHAT) == 3
    assert printed(done) == [f"step {i} ok" for i in range(3)], done.stderr[-2000:]
    assert result["raised"] == "BudgetExceededError", result
    assert "pool tenant:acme" in result["message"], result


def test_a_pool_the_file_does_not_define_refuses_every_call(
    scripts: ScriptRuns, server: FakeLLMServer, tmp_path: Path
) -> None:
    result, done = scripts.run(
        str(UNCHANGED_AGENT),
        VERONICA_POLICY_FILE=pools_policy(tmp_path),
        VERONICA_POOLS="tenant:acme,tenant:bob",
    )
    assert server.count(CHAT) == 0
    assert printed(done) == [] and result["raised"] is not None, result
    assert "VERONICA_POOLS: pool 'tenant:bob' is not defined" in done.stderr


# -- VERONICA_POLICY_FILE: the default chain follows the file


def test_zero_code_follows_the_policy_file(
    scripts: ScriptRuns, server: FakeLLMServer, tmp_path: Path
) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(
        '[limits]\nmax_cost_usd = 1.0\n[models."gpt-4o-mini"]\n'
        'fallback = "gpt-4o"\nmax_tokens = 7\nmax_calls = 3\n'
    )
    result, done = scripts.run(str(UNCHANGED_AGENT), VERONICA_POLICY_FILE=str(path))
    assert printed(done) == [f"step {i} ok" for i in range(3)], done.stderr[-2000:]
    assert result["raised"] == "BudgetExceededError", result
    assert 'models."gpt-4o-mini".max_calls = 3 reached' in result["message"], result
    bodies = [r.body for r in server.requests]
    assert [(b["model"], b["max_completion_tokens"]) for b in bodies] == [("gpt-4o", 7)] * 3


def test_zero_code_fails_closed_on_a_malformed_policy_file(
    scripts: ScriptRuns, server: FakeLLMServer, tmp_path: Path
) -> None:
    path = tmp_path / "policy.toml"
    path.write_text('[models."gpt-4o-mini"]\nmax_calls = -1\n')
    result, done = scripts.run(str(UNCHANGED_AGENT), VERONICA_POLICY_FILE=str(path))
    problem = f'policy file {path} (VERONICA_POLICY_FILE): models."gpt-4o-mini".max_calls = -1'
    assert problem in done.stderr
    assert printed(done) == [] and result["raised"] is not None, result
    assert server.count(CHAT) == 0


# -- a hostile policy file: every call refused, naming the variable and the file


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("deep.toml", "x = " + "[" * 100_000 + "]" * 100_000, "is nested too deeply (over 64"),
        (
            "huge.toml",
            "[limits]\nmax_steps = " + "9" * 5000 + "\n",
            "cannot be loaded (ValueError: an integer with too many digits)",
        ),
    ],
    ids=["deep", "huge"],
)
def test_a_hostile_policy_file_refuses_every_call_naming_the_variable_and_file(
    scripts: ScriptRuns, server: FakeLLMServer, tmp_path: Path, name: str, text: str, problem: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    result, done = scripts.run(str(UNCHANGED_AGENT), VERONICA_POLICY_FILE=str(path))
    assert printed(done) == []  # not one step ran uncontained
    assert server.count(CHAT) == 0
    assert f"policy file {path} (VERONICA_POLICY_FILE): {problem}" in done.stderr
    assert result["raised"] == "PolicyFileError", result  # what the app's call raised


def test_a_hung_scenario_fails_saying_where_each_thread_stood(
    scripts: ScriptRuns, server: FakeLLMServer, tmp_path: Path
) -> None:
    # The harness's own watchdog (apps/frameworks/_report.py), cut from minutes to a
    # second: a run that hangs dumps every thread's stack and ends, and the app goes on.
    hangs = tmp_path / "hangs.py"
    hangs.write_text(
        "import threading\n\n\ndef stuck_here():\n    threading.Event().wait()\n\n\nstuck_here()\n"
    )
    with pytest.raises(AssertionError, match=r"no RESULT line; exit 1\n") as failed:
        scripts.run(str(hangs), FRAMEWORK_DUMP_AFTER_S="1")
    assert "Timeout (0:00:01)!" in str(failed.value)
    assert f'File "{hangs}", line 5 in stuck_here' in str(failed.value)
    result, done = scripts.run(str(UNCHANGED_AGENT), VERONICA_MAX_STEPS="1")
    assert result["reason"] == "steps" and printed(done) == ["step 0 ok"], done.stderr[-2000:]
