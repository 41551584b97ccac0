"""Per-endpoint circuit breakers in the instrumentors, with the real openai SDK."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests._clock import FakeClock
from veronica_otel import BudgetExceededError, CircuitBreaker, ExecutionConfig, ExecutionContext
from veronica_otel.instrumentors._breakers import (
    configure_endpoint_breakers,
    endpoint_breaker,
)
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    fake = FakeClock()
    configure_endpoint_breakers(lambda p, m: CircuitBreaker(3, 30.0, clock=fake))
    yield fake
    configure_endpoint_breakers(None)


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=5) as srv:
        yield srv


@pytest.fixture
def client(server: FakeLLMServer) -> Iterator[openai.OpenAI]:
    OpenAIInstrumentor().instrument()
    c = openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0, timeout=5)
    yield c
    c.close()
    OpenAIInstrumentor().uninstrument()


def call(client: openai.OpenAI, model: str = "gpt-4o-mini") -> None:
    client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=5)


def test_failing_endpoint_opens_and_denies_before_sending(
    clock: FakeClock, server: FakeLLMServer, client: openai.OpenAI
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=100)):
        server.fail_always(503)
        for _ in range(3):
            with pytest.raises(openai.InternalServerError):
                call(client)
        sent = server.request_count
        with pytest.raises(BudgetExceededError) as info:
            call(client)
        assert info.value.reason == "circuit_open"
        assert "openai/gpt-4o-mini" in str(info.value)
        assert server.request_count == sent  # not sent
        server.clear_failures()
        with pytest.raises(BudgetExceededError):
            call(client)  # still open: recovery is time, not the server's word
        call(client, model="gpt-4o")  # another endpoint is unaffected
        assert server.request_count == sent + 1
    assert endpoint_breaker("openai", "gpt-4o-mini").state.value == "open"


def test_half_open_probe_closes_the_breaker(
    clock: FakeClock, server: FakeLLMServer, client: openai.OpenAI
) -> None:
    with ExecutionContext():
        server.fail_always(500)
        for _ in range(3):
            with pytest.raises(openai.InternalServerError):
                call(client)
        server.clear_failures()
        clock.now += 30
        call(client)  # the probe succeeds
        call(client)
    assert endpoint_breaker("openai", "gpt-4o-mini").state.value == "closed"


def test_client_errors_do_not_count(
    clock: FakeClock, server: FakeLLMServer, client: openai.OpenAI
) -> None:
    with ExecutionContext():
        server.fail_always(400)
        for _ in range(5):
            with pytest.raises(openai.BadRequestError):
                call(client)
    assert endpoint_breaker("openai", "gpt-4o-mini").state.value == "closed"


def test_a_denied_call_does_not_keep_the_probe(
    clock: FakeClock, server: FakeLLMServer, client: openai.OpenAI
) -> None:
    with ExecutionContext():
        server.fail_always(500)
        for _ in range(3):
            with pytest.raises(openai.InternalServerError):
                call(client)
    server.clear_failures()
    clock.now += 30
    with ExecutionContext(ExecutionConfig(max_steps=0)), pytest.raises(BudgetExceededError):
        call(client)  # took the probe, then the ledger said no: the probe comes back
    with ExecutionContext():
        call(client)
    assert endpoint_breaker("openai", "gpt-4o-mini").state.value == "closed"


def test_a_timed_out_call_is_charged_its_worst_case(server: FakeLLMServer) -> None:
    OpenAIInstrumentor().instrument()
    slow = openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0, timeout=0.2)
    try:
        server.set_latency(1.0)
        with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
            with pytest.raises(openai.APITimeoutError):
                slow.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=100)
            snap = ctx.snapshot()
        # The provider may have generated (and billed) it all: the reservation is committed.
        assert snap.tokens >= 100
        assert snap.cost_usd > 0
        assert snap.reserved_usd == 0
    finally:
        server.set_latency(0.0)
        slow.close()
        OpenAIInstrumentor().uninstrument()
