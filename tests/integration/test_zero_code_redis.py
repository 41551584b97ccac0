"""Zero code across processes: one chain in Redis/Valkey, named by VERONICA_CHAIN_ID."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from veronica_otel.distributed import RedisLedger
from veronica_otel.testing import FakeLLMServer

APP = Path(__file__).parents[1] / "e2e" / "apps" / "unchanged_agent.py"
INSTRUMENT = Path(sys.executable).parent / "opentelemetry-instrument"


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=5) as srv:
        yield srv


def run_agent(llm: FakeLLMServer, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("VERONICA_", "OTEL_", "OPENAI_", "ANTHROPIC_"))
    }
    environ.update(
        OPENAI_BASE_URL=llm.openai_base_url,
        OPENAI_API_KEY="k",
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        **env,
    )
    return subprocess.run(
        [str(INSTRUMENT), sys.executable, str(APP)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


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
