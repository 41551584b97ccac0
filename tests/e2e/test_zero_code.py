"""Zero code changes: an unchanged script under ``opentelemetry-instrument``.

The script, the SDK and the HTTP traffic are real; the LLM is the embedded
fake server, whose request count is the ground truth of what was sent.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._zero_code import UNCHANGED_AGENT, run_instrumented
from veronica_otel.testing import FakeLLMServer


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=10) as srv:
        yield srv


def run_app(server: FakeLLMServer, **env: str) -> subprocess.CompletedProcess[str]:
    return run_instrumented(UNCHANGED_AGENT, server, **env)


def test_unchanged_app_trips_at_exactly_max_steps(server: FakeLLMServer) -> None:
    result = run_app(server, VERONICA_MAX_STEPS="3")
    assert result.returncode != 0
    assert result.stdout.splitlines() == [f"step {i} ok" for i in range(3)]
    assert "BudgetExceededError" in result.stderr
    assert "steps limit reached" in result.stderr
    assert server.count("/v1/chat/completions") == 3


def test_unchanged_mcp_agent_trips_at_exactly_max_steps(server: FakeLLMServer) -> None:
    # The distro patches the mcp client when the app imports it: no code, no entry point.
    agent = Path(__file__).parent / "apps" / "unchanged_mcp_agent.py"
    result = run_instrumented(agent, server, VERONICA_MAX_STEPS="3")
    assert result.returncode != 0
    assert result.stdout.splitlines() == [f"step {i} ok" for i in range(3)]
    assert "steps limit reached" in result.stderr


def test_unchanged_langchain_tools_trip_at_exactly_max_steps(server: FakeLLMServer) -> None:
    # The distro patches BaseTool when the app imports langchain_core.
    app = Path(__file__).parent / "apps" / "unchanged_langchain_tools.py"
    result = run_instrumented(app, server, VERONICA_MAX_STEPS="3")
    assert result.returncode != 0
    assert result.stdout.splitlines() == [f"step {i} ok" for i in range(3)]
    assert "BudgetExceededError" in result.stderr


def test_cost_ceiling_from_env(server: FakeLLMServer) -> None:
    # Each call reserves (clamped) the whole remaining budget, so a tiny ceiling
    # admits calls only while what is left can still buy an answer.
    result = run_app(server, VERONICA_MAX_COST_USD="0.0000001")
    assert result.returncode != 0
    assert "BudgetExceededError" in result.stderr
    assert server.count("/v1/chat/completions") == 0


def test_enforcement_holds_when_the_exporter_configuration_fails(server: FakeLLMServer) -> None:
    # The default OTLP exporter is not installed: the SDK configurator raises and
    # opentelemetry-instrument skips every instrumentor. Ours are already in.
    result = run_app(server, VERONICA_MAX_STEPS="2", OTEL_TRACES_EXPORTER="otlp")
    assert "Failed to auto initialize OpenTelemetry" in result.stderr or (
        "Configuration of" in result.stderr
    )
    assert result.stdout.splitlines() == ["step 0 ok", "step 1 ok"]
    assert server.count("/v1/chat/completions") == 2


def test_malformed_env_fails_closed_naming_the_variable(server: FakeLLMServer) -> None:
    result = run_app(server, VERONICA_MAX_STEPS="three")
    assert result.returncode != 0
    assert "VERONICA_MAX_STEPS='three'" in result.stderr
    assert result.stdout == ""
    assert server.count("/v1/chat/completions") == 0


def test_no_limits_set_runs_everything(server: FakeLLMServer) -> None:
    result = run_app(server)
    assert result.returncode == 0, result.stderr
    assert server.count("/v1/chat/completions") == 5


def test_the_zero_code_example_runs_as_its_readme_says(server: FakeLLMServer) -> None:
    example = Path(__file__).parents[2] / "examples" / "zero_code" / "agent.py"
    result = run_instrumented(example, server, VERONICA_MAX_STEPS="5", VERONICA_MAX_COST_USD="0.01")
    assert [line.split(":")[0] for line in result.stdout.splitlines()] == [
        f"round {i}" for i in range(5)
    ]
    assert "steps limit reached (limit 5, this call would make it 6)" in result.stderr
    assert server.count("/v1/chat/completions") == 5
    assert all("max_completion_tokens" in r.body for r in server.requests)  # clamped
