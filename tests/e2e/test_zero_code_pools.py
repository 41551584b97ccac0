"""VERONICA_POOLS under ``opentelemetry-instrument``: an unchanged agent stops at its pool.

The agent (five chat calls, no veronica code) runs as users run it; the fake
server's count is the truth.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._zero_code import UNCHANGED_AGENT, run_instrumented
from veronica_otel.testing import FakeLLMServer

CHAT = "/v1/chat/completions"


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


def policy(tmp_path: Path) -> str:
    path = tmp_path / "policy.toml"
    path.write_text(
        "[limits]\nmax_steps = 100\n"
        '[pools."tenant:acme"]\nmax_steps = 3\nwindow = "1d"\n'
        '[pools."user:alice"]\nmax_steps = 50\n',
        encoding="utf-8",
    )
    return str(path)


def test_the_default_chain_stops_at_the_pool_the_variable_names(
    tmp_path: Path, llm: FakeLLMServer
) -> None:
    result = run_instrumented(
        UNCHANGED_AGENT,
        llm,
        VERONICA_POLICY_FILE=policy(tmp_path),
        VERONICA_POOLS="tenant:acme,user:alice",
    )
    assert llm.count(CHAT) == 3
    assert result.stdout.splitlines() == [f"step {i} ok" for i in range(3)]
    assert result.returncode != 0
    assert "BudgetExceededError" in result.stderr and "pool tenant:acme" in result.stderr


def test_a_pool_the_file_does_not_define_refuses_every_call(
    tmp_path: Path, llm: FakeLLMServer
) -> None:
    result = run_instrumented(
        UNCHANGED_AGENT,
        llm,
        VERONICA_POLICY_FILE=policy(tmp_path),
        VERONICA_POOLS="tenant:acme,tenant:bob",
    )
    assert llm.count(CHAT) == 0
    assert result.returncode != 0
    assert "VERONICA_POOLS: pool 'tenant:bob' is not defined" in result.stderr
