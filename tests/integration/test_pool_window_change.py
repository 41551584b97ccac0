"""A window change under the same pool name never drops spend, in process and on Valkey.

The issue's repro: a full daily pool admitted one more call the same day
after a call through a ``1h`` pool of the same name (``RollingWindow.rebucket``
expired with the shorter window; the Valkey script kept the spend). On
Valkey the same happens one step later: once the ``1h`` window slides past
what it moved in, the day's spend was gone. Real ``openai`` SDK, the fake
server's ``GET /stats`` counts what was sent, time moved by injected clocks.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import httpx2
import openai
import pytest

from veronica_otel import BudgetExceededError, BudgetPool, ExecutionConfig, ExecutionContext
from veronica_otel._ledger import Ledger, LocalLedger
from veronica_otel.distributed import RedisLedger
from veronica_otel.testing import FakeLLMServer

HOUR = 3600.0
DAILY_STEPS = 3


class _Clock:
    def __init__(self) -> None:
        self.now = 1_796_000_000.0  # seconds; a server-like clock

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(params=["local", "valkey"])
def ledger_and_clock(
    request: pytest.FixtureRequest,
) -> Iterator[tuple[Ledger, _Clock]]:
    clock = _Clock()
    if request.param == "local":
        yield LocalLedger(clock=lambda: clock.now), clock
        return
    url = request.getfixturevalue("redis_url")
    store = RedisLedger.from_url(url, key_prefix=f"pw{uuid.uuid4().hex[:10]}:")
    store._pools.clock = lambda: int(clock.now * 1_000_000)
    try:
        yield store, clock
    finally:
        store.close()
        store.client.close()


def _sent(server: FakeLLMServer) -> int:
    return int(httpx2.get(server.base_url + "/stats").json()["total"])


def _through(
    ledger: Ledger, client: openai.OpenAI, window: str | None, max_steps: int
) -> Callable[[], str]:
    def call() -> str:
        pool = BudgetPool("tenant:acme", max_steps=max_steps, window=window, ledger=ledger)
        try:
            with ExecutionContext(ExecutionConfig(max_steps=100), ledger=ledger, pools=[pool]):
                client.chat.completions.create(
                    model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=8
                )
        except BudgetExceededError as exc:
            assert exc.pool == "tenant:acme"
            return "pool"
        return "sent"

    return call


def test_a_shorter_window_in_between_never_frees_the_days_spend(
    server: FakeLLMServer, client: openai.OpenAI, ledger_and_clock: tuple[Ledger, _Clock]
) -> None:
    ledger, clock = ledger_and_clock
    daily = _through(ledger, client, "1d", DAILY_STEPS)
    hourly = _through(ledger, client, "1h", 100)
    assert [daily() for _ in range(DAILY_STEPS + 1)] == ["sent"] * DAILY_STEPS + ["pool"]
    clock.advance(2 * HOUR)
    assert hourly() == "sent"  # the 1h pool's own window holds none of the day's spend
    assert daily() == "pool"  # the same day: the daily pool is still full
    clock.advance(0.5 * HOUR)
    assert hourly() == "sent"
    clock.advance(1.5 * HOUR)  # the 1h window has slid past everything spent so far
    assert hourly() == "sent"
    clock.advance(0.5 * HOUR)
    assert daily() == "pool"
    assert _sent(server) == DAILY_STEPS + 3
    # A day after the last change the daily window has room again (on Valkey what
    # a change moves counts from the change: later than exact, never earlier).
    clock.advance(25 * HOUR)
    assert daily() == "sent"
    assert _sent(server) == DAILY_STEPS + 4


def test_a_lifetime_pool_named_again_with_a_window_keeps_its_spend(
    server: FakeLLMServer, client: openai.OpenAI, ledger_and_clock: tuple[Ledger, _Clock]
) -> None:
    ledger, clock = ledger_and_clock
    lifetime = _through(ledger, client, None, 2)
    hourly = _through(ledger, client, "1h", 100)
    assert [lifetime() for _ in range(3)] == ["sent", "sent", "pool"]
    assert hourly() == "sent"
    clock.advance(30 * 24 * HOUR)  # long past the hour
    assert hourly() == "sent"
    assert lifetime() == "pool"  # a lifetime budget never frees
    assert _sent(server) == 4
