"""Zero code with hostile configuration: the unchanged app's LLM calls are refused, loudly.

The app, the SDK and the HTTP traffic are real; the fake server's request
count is the truth of what was sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._zero_code import UNCHANGED_AGENT, run_instrumented
from veronica_otel.testing import FakeLLMServer

CHAT = "/v1/chat/completions"


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=10) as srv:
        yield srv


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("deep.toml", "x = " + "[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ("huge.toml", "[limits]\nmax_steps = " + "9" * 5000 + "\n", "too many digits"),
    ],
)
def test_a_hostile_policy_file_refuses_every_call_naming_the_variable_and_file(
    tmp_path: Path, server: FakeLLMServer, name: str, text: str, problem: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    result = run_instrumented(UNCHANGED_AGENT, server, VERONICA_POLICY_FILE=str(path))
    assert result.returncode != 0
    assert result.stdout == ""  # not one step ran uncontained
    assert server.count(CHAT) == 0
    assert f"policy file {path} (VERONICA_POLICY_FILE): cannot be loaded" in result.stderr
    assert problem in result.stderr
    assert "PolicyFileError" in result.stderr  # what the app's call raised


def test_a_bad_propagation_variable_is_named_and_calls_are_refused(server: FakeLLMServer) -> None:
    result = run_instrumented(
        UNCHANGED_AGENT,
        server,
        VERONICA_MAX_STEPS="3",
        VERONICA_PROPAGATE_HOSTS="svc:99999",
        VERONICA_GRANT_KEY="k" * 16,
    )
    assert result.returncode != 0
    assert result.stdout == ""
    assert server.count(CHAT) == 0
    assert "VERONICA_PROPAGATE_HOSTS: bad port in host pattern 'svc:99999'" in result.stderr
    # The instrumentors that read the variable say which one stopped them.
    failures = [line for line in result.stderr.splitlines() if "could not install" in line]
    assert failures
    assert all("VERONICA_PROPAGATE_HOSTS" in line for line in failures)


def test_a_bad_vendor_guard_mode_is_named_and_calls_are_refused(server: FakeLLMServer) -> None:
    result = run_instrumented(
        UNCHANGED_AGENT, server, VERONICA_MAX_STEPS="3", VERONICA_VENDOR_GUARD="contian"
    )
    assert result.returncode != 0
    assert result.stdout == ""  # not one step ran uncontained
    assert server.count(CHAT) == 0
    assert "VERONICA_VENDOR_GUARD must be one of contain, refuse, off, got 'contian'" in (
        result.stderr
    )
