"""The demo's tenant scenario: acme's runaway agents stop at acme's daily pool, bob works on.

The scenario function runs as the demo runs it: the real openai SDK against
the fake server (40 output tokens a reply), whose count is the truth.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from veronica_otel.cli._demo_scenarios import (
    DEMO_ROUND_CAP,
    RUNAWAY_AGENTS,
    SCENARIOS,
    STEADY_CALLS,
    TENANT_DAILY_USD,
    tenant_pools,
)
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer

CHAT = "/v1/chat/completions"
SCENARIO = next(s for s in SCENARIOS if s.key == "tenants")


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=40) as fake:  # as the demo's
        yield fake


@pytest.fixture
def client(server: FakeLLMServer) -> Iterator[openai.OpenAI]:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    try:
        with openai.OpenAI(base_url=server.openai_base_url, api_key="demo", max_retries=0) as oai:
            yield oai
    finally:
        instrumentor.uninstrument()


def test_uncontained_acmes_agents_run_to_the_demo_cap(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    run = tenant_pools(client, None)
    assert run.acme_calls == RUNAWAY_AGENTS * DEMO_ROUND_CAP == 160
    assert run.bob_calls == STEADY_CALLS == 10
    assert run.acme_stopped == 0 and str(run) == "-"
    assert server.count(CHAT) == 170


def test_contained_acme_stops_at_its_daily_pool_and_bob_finishes(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    run = tenant_pools(client, SCENARIO.config)
    assert run.bob_calls == STEADY_CALLS  # the other tenant is untouched
    assert run.acme_stopped == RUNAWAY_AGENTS  # every runaway agent was stopped
    assert run.acme_calls == 20  # the demo's number: $0.01 buys 20 of these calls
    assert server.count(CHAT) == run.acme_calls + run.bob_calls == 30
    # The pool is never overspent, and it was nearly used up when it said no.
    per_call = run.acme_spent_usd / run.acme_calls
    assert TENANT_DAILY_USD - 2 * per_call < run.acme_spent_usd <= TENANT_DAILY_USD
    assert run.retry_after_s is not None and 86_000 < run.retry_after_s <= 86_400
    assert str(run) == "acme pool, bob 10/10"
