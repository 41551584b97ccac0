"""Zero code across processes: one chain in Redis/Valkey, named by VERONICA_CHAIN_ID."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests._zero_code import UNCHANGED_AGENT, run_instrumented
from veronica_otel.distributed import RedisLedger
from veronica_otel.testing import FakeLLMServer


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=5) as srv:
        yield srv


def run_agent(llm: FakeLLMServer, **env: str) -> subprocess.CompletedProcess[str]:
    return run_instrumented(UNCHANGED_AGENT, llm, **env)


def test_two_unchanged_processes_share_one_chain(
    llm: FakeLLMServer, redis_url: str, redis_prefix: str
) -> None:
    shared = {
        "VERONICA_REDIS_URL": redis_url,
        "VERONICA_REDIS_PREFIX": redis_prefix,
        "VERONICA_CHAIN_ID": "nightly-report",
        "VERONICA_MAX_STEPS": "6",
    }
    first = run_agent(llm, **shared)
    assert first.returncode == 0, first.stderr  # 5 steps of 6
    second = run_agent(llm, **shared)
    assert second.returncode != 0
    assert second.stdout.splitlines() == ["step 0 ok"]  # the 6th step, then the trip
    assert "steps limit reached" in second.stderr
    assert llm.count("/v1/chat/completions") == 6
    snap = RedisLedger.from_url(redis_url, key_prefix=redis_prefix).snapshot("nightly-report")
    assert snap.steps == 6
    assert snap.trip is not None and snap.trip.reason == "steps"


def test_bad_chain_id_fails_closed_naming_the_variable(llm: FakeLLMServer) -> None:
    result = run_agent(llm, VERONICA_CHAIN_ID="has spaces", VERONICA_MAX_STEPS="3")
    assert result.returncode != 0
    assert "VERONICA_CHAIN_ID='has spaces'" in result.stderr
    assert llm.request_count == 0
