"""Calls naming made-up models cannot flush an open endpoint breaker.

The issue's repro: 4,096 denied calls naming made-up models emptied the
breaker table (``_breakers.clear()`` at 4,096 entries, breakers made before
pricing), and the failing endpoint then got 3 requests inside its recovery
window. The table is shrunk here to ``TABLE`` entries (the sweep reads the
module's limits on each new endpoint), so a flood past it takes a few hundred
calls through the SDK, not four thousand. What reached the fake server, read
from its ``GET /stats``, is the truth.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import openai
import pytest

from veronica_otel import BudgetExceededError, CircuitBreaker, ExecutionConfig, ExecutionContext
from veronica_otel.instrumentors import _breakers
from veronica_otel.instrumentors._breakers import configure_endpoint_breakers
from veronica_otel.testing import FakeLLMServer

THRESHOLD = 2
TABLE = 64  # the table's size in these tests (4,096 in the package)
FLOOD = TABLE + 100


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Clock]:
    monkeypatch.setattr(_breakers, "_MAX_ENDPOINTS", TABLE)
    monkeypatch.setattr(_breakers, "_SWEEP_TO", TABLE * 3 // 4)
    fake = _Clock()
    configure_endpoint_breakers(
        lambda provider, model: CircuitBreaker(THRESHOLD, recovery_timeout=30.0, clock=fake)
    )
    yield fake
    configure_endpoint_breakers(None)


def _sent(server: FakeLLMServer) -> int:
    return int(httpx2.get(server.base_url + "/stats").json()["total"])


def _call(client: openai.OpenAI, model: str) -> str:
    try:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8
        )
    except BudgetExceededError as exc:
        return exc.reason
    except openai.APIStatusError as exc:
        return str(exc.status_code)
    return "sent"


def _open_the_endpoint(server: FakeLLMServer, client: openai.OpenAI) -> None:
    server.fail_always(500)
    assert [_call(client, "gpt-4o-mini") for _ in range(THRESHOLD)] == ["500"] * THRESHOLD
    server.clear_failures()
    assert _call(client, "gpt-4o-mini") == "circuit_open"
    assert _sent(server) == THRESHOLD


def test_made_up_models_do_not_flush_an_open_breaker(
    server: FakeLLMServer, client: openai.OpenAI, clock: _Clock
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)):
        _open_the_endpoint(server, client)
        flood = {_call(client, f"made-up-{i}") for i in range(FLOOD)}
        assert flood == {"cost"}  # no price under a cost ceiling: refused, never sent
        assert len(_breakers._breakers) == 1  # a call refused before pricing makes no breaker
        clock.now += 29.0  # still inside the recovery window
        assert [_call(client, "gpt-4o-mini") for _ in range(3)] == ["circuit_open"] * 3
        assert _sent(server) == THRESHOLD
        clock.now += 1.0  # the window has passed: one probe goes, and closes it
        assert [_call(client, "gpt-4o-mini") for _ in range(3)] == ["sent"] * 3
    assert _sent(server) == THRESHOLD + 3


def test_a_full_table_of_live_endpoints_keeps_the_open_one(
    server: FakeLLMServer, client: openai.OpenAI, clock: _Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Sent calls (no cost ceiling: unpriced models go out) do make breakers; a
    # full table drops those that remember nothing, never the open one.
    monkeypatch.setattr(_breakers, "_MAX_ENDPOINTS", 16)
    monkeypatch.setattr(_breakers, "_SWEEP_TO", 12)  # over the clock fixture's table
    with ExecutionContext(ExecutionConfig(max_steps=1000)):
        _open_the_endpoint(server, client)
        assert {_call(client, f"live-{i}") for i in range(40)} == {"sent"}
        assert len(_breakers._breakers) <= 16
        assert _call(client, "gpt-4o-mini") == "circuit_open"
    assert _sent(server) == THRESHOLD + 40
