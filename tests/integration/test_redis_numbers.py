"""Numbers at the edges (issue 12): what the shared ledger does with absurd amounts.

Lua numbers are doubles, exact only below 2**53. The RedisLedger keeps every
sum its scripts compute below that (limits and single amounts at most
STORE_MAX + 1, spent saturating at 2**51; see ``_scripts.py``). Usage too
large for the store is clamped, trips the chain, never raises into the caller
and never leaves a reservation. Real SDKs against FakeLLMServer, real Valkey.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import openai
import pytest
import redis

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel._errors import TripEvent
from veronica_otel._ledger import Level, Limits, LocalLedger, Reservation
from veronica_otel.distributed import RedisLedger
from veronica_otel.distributed._scripts import STORE_MAX
from veronica_otel.instrumentors.anthropic import AnthropicInstrumentor
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer

HUGE = 10**26
SATURATED = 2 * STORE_MAX  # spent cost and tokens stop here (COMMIT's SATURATE)


@pytest.fixture
def ledger(redis_url: str, redis_prefix: str) -> Iterator[RedisLedger]:
    shared = RedisLedger.from_url(redis_url, key_prefix=redis_prefix)
    try:
        yield shared
    finally:
        shared.client.close()


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        yield client
    finally:
        client.close()


def stored(raw: redis.Redis, ledger: RedisLedger, chain_id: str) -> dict[str, int]:
    """The chain's counters as the store holds them (every one an exact int)."""
    values = raw.hgetall(ledger.key(chain_id))
    return {k: int(v) for k, v in values.items() if k not in ("trip", "e")}


# -- through the SDKs -----------------------------------------------------------------


@pytest.fixture
def huge_server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(input_tokens=HUGE, output_tokens=3) as fake:
        yield fake


@pytest.mark.parametrize("kind", ["redis", "local"])
def test_openai_usage_of_1e26_tokens_is_clamped_and_trips(
    kind: str, huge_server: FakeLLMServer, redis_url: str, redis_prefix: str
) -> None:
    chain_ledger: RedisLedger | LocalLedger = (
        RedisLedger.from_url(redis_url, key_prefix=redis_prefix)
        if kind == "redis"
        else LocalLedger()
    )
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    try:
        with (
            openai.OpenAI(
                base_url=huge_server.openai_base_url, api_key="test", max_retries=0
            ) as client,
            ExecutionContext(
                ExecutionConfig(max_cost_usd=1.0), chain_id="huge", ledger=chain_ledger
            ) as ctx,
        ):
            reply = client.chat.completions.create(
                model="gpt-4o-mini",
                messages=[{"role": "user", "content": "hi"}],
                max_completion_tokens=5,
            )
            assert reply.usage is not None and reply.usage.prompt_tokens == HUGE  # the reply
            assert ctx.trip is not None and ctx.trip.reason in ("cost", "tokens")
            snap = chain_ledger.snapshot("huge")
            assert (snap.reserved_nano, snap.reserved_tokens) == (0, 0)
            if kind == "redis":
                assert snap.cost_nano == STORE_MAX + 1  # clamped, and over any ceiling
            with pytest.raises(BudgetExceededError):  # tripped: the next call is denied
                client.chat.completions.create(
                    model="gpt-4o-mini",
                    messages=[{"role": "user", "content": "hi"}],
                    max_completion_tokens=5,
                )
        assert huge_server.count("/v1/chat/completions") == 1
    finally:
        instrumentor.uninstrument()
        if isinstance(chain_ledger, RedisLedger):
            chain_ledger.client.close()


def test_anthropic_usage_of_1e26_tokens_is_clamped_and_trips(
    huge_server: FakeLLMServer, ledger: RedisLedger
) -> None:
    import anthropic  # here, not at the top: collection on every worker would import it

    instrumentor = AnthropicInstrumentor()
    instrumentor.instrument()
    try:
        with (
            anthropic.Anthropic(
                base_url=huge_server.anthropic_base_url, api_key="test", max_retries=0
            ) as client,
            ExecutionContext(
                ExecutionConfig(max_cost_usd=1.0), chain_id="huge", ledger=ledger
            ) as ctx,
        ):
            message = client.messages.create(
                model="claude-3-5-haiku-latest",
                max_tokens=5,
                messages=[{"role": "user", "content": "hi"}],
            )
            assert message.usage.input_tokens == HUGE
            assert ctx.trip is not None and ctx.trip.reason in ("cost", "tokens")
            snap = ledger.snapshot("huge")
            assert (snap.reserved_nano, snap.reserved_tokens) == (0, 0)
            assert snap.cost_nano == STORE_MAX + 1
    finally:
        instrumentor.uninstrument()


# -- the ledger itself --------------------------------------------------------------------


def test_a_huge_commit_never_raises_and_settles_its_reservation(
    ledger: RedisLedger, raw: redis.Redis
) -> None:
    path = (Level("c", Limits(cost_nano=10**9, tokens=10**6)),)
    reservation = ledger.reserve(path, 1_000, 10)
    assert isinstance(reservation, Reservation)
    trip = ledger.commit(path, reservation, 10**30, 10**30)
    assert trip is not None and trip.reason == "cost"
    assert stored(raw, ledger, "c") == {
        "c": STORE_MAX + 1,
        "t": STORE_MAX + 1,
        "rc": 0,
        "rt": 0,
        "s": 1,
    }
    denied = ledger.reserve(path, 0, 0)
    assert denied is trip  # sticky


def test_spent_saturates_and_every_counter_stays_exact(
    ledger: RedisLedger, raw: redis.Redis
) -> None:
    free = (Level("free", Limits()),)
    for _ in range(5):  # unlimited: nothing trips, the counters stop at 2**51
        reservation = ledger.reserve(free, HUGE, HUGE)
        assert isinstance(reservation, Reservation)
        assert (reservation.cost_nano, reservation.tokens) == (STORE_MAX + 1, STORE_MAX + 1)
        assert ledger.commit(free, reservation, HUGE, HUGE) is None
    counters = stored(raw, ledger, "free")
    assert (counters["c"], counters["t"]) == (SATURATED, SATURATED)
    assert (counters["rc"], counters["rt"]) == (0, 0)
    assert max(counters.values()) < 2**53


def test_an_absurd_reservation_is_denied_and_leaves_nothing(ledger: RedisLedger) -> None:
    path = (Level("r", Limits(cost_nano=10**18)),)  # max_cost_usd=1e9: above STORE_MAX
    denied = ledger.reserve(path, HUGE, 0)
    assert isinstance(denied, TripEvent) and denied.reason == "cost"
    assert ledger.snapshot("r").reserved_nano == 0


def test_a_ceiling_above_store_max_counts_as_store_max(ledger: RedisLedger) -> None:
    path = (Level("big", Limits(cost_nano=10**18)),)
    first = ledger.reserve(path, STORE_MAX - 1, 0)
    assert isinstance(first, Reservation)
    second = ledger.reserve(path, 1, 0)  # exactly STORE_MAX: allowed
    assert isinstance(second, Reservation)
    third = ledger.reserve(path, 1, 0)  # fits 1e18, not STORE_MAX: denied earlier, safely
    assert isinstance(third, TripEvent) and third.reason == "cost"
    assert third.sticky is False  # committed spend is 0: only the reservations deny it
    ledger.release(path, first)
    ledger.release(path, second)
    assert ledger.snapshot("big").reserved_nano == 0
    assert isinstance(ledger.reserve(path, STORE_MAX, 0), Reservation)


def test_counting_stays_exact_at_the_largest_ceiling(ledger: RedisLedger) -> None:
    """STORE_MAX + override + one amount: one unit over the ceiling is still seen."""
    path = (Level("edge", Limits(cost_nano=STORE_MAX)),)
    held = ledger.reserve(path, STORE_MAX, 0)
    assert isinstance(held, Reservation)
    assert ledger.commit(path, held, STORE_MAX, 0) is None
    ledger.override("edge", expires_at=time.time() + 3600, add_cost_nano=HUGE)  # -> STORE_MAX
    almost = ledger.reserve(path, STORE_MAX, 0)  # 2 * STORE_MAX: exactly the widened ceiling
    assert isinstance(almost, Reservation)
    over = ledger.reserve(path, 1, 0)  # one nano-USD past 2 * STORE_MAX
    assert isinstance(over, TripEvent) and over.reason == "cost"
    assert over.observed == (2 * STORE_MAX + 1) / 1e9


@pytest.mark.parametrize("name", ["reservation_ttl_s", "chain_ttl_s"])
def test_absurd_ttls_are_refused_naming_the_argument(ledger: RedisLedger, name: str) -> None:
    kwargs = {"reservation_ttl_s": 600.0, "chain_ttl_s": 1e12}
    if name == "reservation_ttl_s":
        kwargs["reservation_ttl_s"] = 1e12
    with pytest.raises(ValueError, match=name):
        RedisLedger(ledger.client, **kwargs)
