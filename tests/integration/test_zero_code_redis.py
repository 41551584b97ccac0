"""Zero code across processes: one chain, or one pool, in Redis/Valkey.

Each run of the unchanged agent is a process of its own, forked from one
zero-code process after openai's import (:func:`tests._zero_code.script_scenarios`,
shared with ``test_zero_code.py``),
with its default chain built from its own ``VERONICA_*`` variables as start-up
builds it: ``VERONICA_CHAIN_ID`` names one chain both processes share,
``VERONICA_POOLS`` a pool the chains of their own draw from.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._zero_code import UNCHANGED_AGENT, ScriptRuns, printed
from tests.e2e._frameworks import FrameworkApp
from veronica_otel.distributed import RedisLedger
from veronica_otel.testing import FakeLLMServer

AGENT = str(UNCHANGED_AGENT)
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def module_llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=5) as srv:
        yield srv


@pytest.fixture
def llm(module_llm: FakeLLMServer) -> FakeLLMServer:
    module_llm.reset()  # counts from this test's runs alone
    return module_llm


@pytest.fixture(scope="module")
def agents(zero_code_scripts: FrameworkApp, module_llm: FakeLLMServer) -> ScriptRuns:
    return ScriptRuns(zero_code_scripts, module_llm)


def test_two_unchanged_processes_share_one_chain(
    agents: ScriptRuns, llm: FakeLLMServer, redis_url: str, redis_prefix: str
) -> None:
    shared = {
        "VERONICA_REDIS_URL": redis_url,
        "VERONICA_REDIS_PREFIX": redis_prefix,
        "VERONICA_CHAIN_ID": "nightly-report",
        "VERONICA_MAX_STEPS": "6",
    }
    first, done = agents.run(AGENT, **shared)
    assert first["raised"] is None and done.returncode == 0, (first, done.stderr[-2000:])
    assert len(printed(done)) == 5  # 5 steps of 6
    second, done = agents.run(AGENT, **shared)
    assert printed(done) == ["step 0 ok"]  # the 6th step, then the trip
    assert second["raised"] == "BudgetExceededError" and second["reason"] == "steps", second
    assert "steps limit reached" in second["message"]
    assert llm.count(CHAT) == 6
    snap = RedisLedger.from_url(redis_url, key_prefix=redis_prefix).snapshot("nightly-report")
    assert snap.steps == 6
    assert snap.trip is not None and snap.trip.reason == "steps"


def test_bad_chain_id_fails_closed_naming_the_variable(
    agents: ScriptRuns, llm: FakeLLMServer
) -> None:
    result, done = agents.run(AGENT, VERONICA_CHAIN_ID="has spaces", VERONICA_MAX_STEPS="3")
    assert result["raised"] is not None and printed(done) == [], result
    assert "VERONICA_CHAIN_ID='has spaces'" in done.stderr
    assert llm.request_count == 0


def test_two_processes_with_chains_of_their_own_share_the_tenants_pool(
    agents: ScriptRuns, llm: FakeLLMServer, redis_url: str, redis_prefix: str, tmp_path: Path
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
    first, done = agents.run(AGENT, **shared)
    assert first["raised"] is None, (first, done.stderr[-2000:])  # 5 of the pool's 7
    second, done = agents.run(AGENT, **shared)
    assert printed(done) == ["step 0 ok", "step 1 ok"]
    assert second["raised"] == "BudgetExceededError", second
    assert "pool tenant:acme" in second["message"]
    assert llm.count(CHAT) == 7
