"""VERONICA_POOLS with VERONICA_REDIS_URL: unchanged processes, separate chains, one pool."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._zero_code import UNCHANGED_AGENT, run_instrumented
from veronica_otel.testing import FakeLLMServer


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=5) as srv:
        yield srv


def test_two_processes_with_chains_of_their_own_share_the_tenants_pool(
    llm: FakeLLMServer, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[pools."tenant:acme"]\nmax_steps = 7\nwindow = "1d"\n', encoding="utf-8")
    shared = {
        "VERONICA_REDIS_URL": redis_url,
        "VERONICA_REDIS_PREFIX": redis_prefix,
        "VERONICA_POLICY_FILE": str(policy),
        "VERONICA_POOLS": "tenant:acme",
        "VERONICA_MAX_STEPS": "100",  # each process's own chain: far from its limit
    }
    first = run_instrumented(UNCHANGED_AGENT, llm, **shared)
    assert first.returncode == 0, first.stderr  # 5 of the pool's 7
    second = run_instrumented(UNCHANGED_AGENT, llm, **shared)
    assert second.returncode != 0
    assert second.stdout.splitlines() == ["step 0 ok", "step 1 ok"]
    assert "pool tenant:acme" in second.stderr
    assert llm.count("/v1/chat/completions") == 7
