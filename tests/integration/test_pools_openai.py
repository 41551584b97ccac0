"""Budget pools with the real ``openai`` SDK against FakeLLMServer (issue 15).

The server's request counts are the truth: chains in sequence and chains on
threads share one pool exactly; nested org/user pools each bound their
share; a two-second window refuses, then admits a new chain once it slides
(an injected clock, no sleeps); a call the chain affords but the pool does
not is never sent and leaves nothing held; an uncapped call is clamped to
what the pool can buy.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests._bounds import input_bound
from tests._clock import FakeClock
from veronica_otel import (
    BudgetExceededError,
    BudgetPool,
    ExecutionConfig,
    ExecutionContext,
    PoolSnapshot,
)
from veronica_otel._ledger import LocalLedger
from veronica_otel._pricing import UnitPrices, default_price_table
from veronica_otel._units import nano_to_usd
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer

MODEL = "gpt-4o-mini"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]
CHAT = "/v1/chat/completions"
CAP = 50  # max_completion_tokens of a capped call
INPUT = 12  # input tokens the server reports
OUTPUT = 5  # output tokens the server reports


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(input_tokens=INPUT, output_tokens=OUTPUT) as fake:
        yield fake


@pytest.fixture
def client(server: FakeLLMServer) -> Iterator[openai.OpenAI]:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    try:
        with openai.OpenAI(
            base_url=server.openai_base_url, api_key="test", max_retries=0
        ) as sdk_client:
            yield sdk_client
    finally:
        instrumentor.uninstrument()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(500.0)


@pytest.fixture
def ledger(clock: FakeClock) -> LocalLedger:
    return LocalLedger(clock=clock)


def prices() -> UnitPrices:
    found = default_price_table().lookup("openai", MODEL)
    assert found is not None
    return found


def worst_nano() -> int:
    """What one capped call reserves."""
    return prices().max_cost_nano(input_bound([MESSAGES], 1), CAP)


def actual_nano() -> int:
    """What one call commits (the server's usage)."""
    return prices().cost_nano(INPUT, OUTPUT)


def ask(client: openai.OpenAI, capped: bool = True) -> None:
    if capped:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=CAP)
    else:
        client.chat.completions.create(model=MODEL, messages=MESSAGES)


class Settled:
    """Counts calls that came back, so a thread can wait for the next one."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.count = 0

    def bump(self) -> None:
        with self._cond:
            self.count += 1
            self._cond.notify_all()

    def wait_past(self, seen: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self.count > seen, timeout=30)


def run_until_denied(
    client: openai.OpenAI, ctx: ExecutionContext, settled: Settled | None = None
) -> BudgetExceededError:
    """Call in ``ctx`` until a sticky denial; a denial that only other calls in
    flight cause waits for one of them to come back, then tries again."""
    settled = settled or Settled()
    with ctx:
        for _ in range(1000):
            seen = settled.count
            try:
                ask(client)
                settled.bump()
            except BudgetExceededError as denied:
                if denied.trip.sticky:
                    return denied
                settled.wait_past(seen)
    raise AssertionError("never denied")


def chain(ledger: LocalLedger, *pools: BudgetPool) -> ExecutionContext:
    return ExecutionContext(ExecutionConfig(max_cost_usd=5.0), ledger=ledger, pools=list(pools))


def test_two_chains_in_sequence_share_one_pool(
    client: openai.OpenAI, server: FakeLLMServer, ledger: LocalLedger
) -> None:
    pool = BudgetPool("tenant:acme", max_steps=7, window="1d", ledger=ledger)
    with chain(ledger, pool):
        for _ in range(5):
            ask(client)
    assert server.count(CHAT) == 5
    denied = run_until_denied(client, chain(ledger, pool))
    assert server.count(CHAT) == 7
    assert denied.pool == "tenant:acme" and denied.reason == "steps"
    assert denied.retry_after_s == pytest.approx(86400.0)  # all seven at one (fake) instant
    snap = pool.snapshot()
    assert (snap.steps, snap.tokens, snap.reserved_steps) == (7, 7 * (INPUT + OUTPUT), 0)
    assert snap.cost_usd == pytest.approx(nano_to_usd(7 * actual_nano()))


def test_four_chains_on_eight_threads_spend_exactly_the_pool(
    client: openai.OpenAI, server: FakeLLMServer, ledger: LocalLedger
) -> None:
    pool = BudgetPool("tenant:acme", max_steps=23, ledger=ledger)
    chains = [chain(ledger, pool) for _ in range(4)]
    start = threading.Barrier(8, timeout=10)
    settled = Settled()
    denials: list[BudgetExceededError] = []
    errors: list[BaseException] = []

    def worker(ctx: ExecutionContext) -> None:
        try:
            start.wait()
            denials.append(run_until_denied(client, ctx, settled))
        except BaseException as exc:  # surfaced below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(chains[i % 4],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert server.count(CHAT) == 23  # exact, whatever the interleaving
    assert len(denials) == 8 and all(d.pool == "tenant:acme" for d in denials)
    snap = pool.snapshot()
    assert (snap.steps, snap.reserved_steps, snap.reserved_cost_usd) == (23, 0, 0.0)
    for ctx in chains:  # every chain stopped; nothing left held in any
        assert ctx.trip is not None
        assert ctx.snapshot().reserved_usd == 0
    assert sum(ctx.snapshot().steps for ctx in chains) == 23


def test_nested_org_and_user_pools_bound_at_both_levels(
    client: openai.OpenAI, server: FakeLLMServer, ledger: LocalLedger
) -> None:
    limit = 8 * worst_nano()
    org = BudgetPool("org:acme", max_cost_usd=nano_to_usd(limit), ledger=ledger)
    alice = BudgetPool("user:alice", max_steps=3, ledger=ledger)
    bob = BudgetPool("user:bob", max_steps=1000, ledger=ledger)
    # Alice's own pool stops her first.
    denied = run_until_denied(client, chain(ledger, org, alice))
    assert (denied.pool, denied.reason, server.count(CHAT)) == ("user:alice", "steps", 3)
    # Bob runs until the organisation's budget is spent (reservations at the
    # worst case, commits at the server's usage).
    spent, expected = 3 * actual_nano(), 0
    while spent + worst_nano() <= limit:
        spent += actual_nano()
        expected += 1
    denied = run_until_denied(client, chain(ledger, org, bob))
    assert (denied.pool, denied.reason) == ("org:acme", "cost")
    assert server.count(CHAT) == 3 + expected
    assert org.snapshot().cost_usd == pytest.approx(nano_to_usd(spent))
    assert (alice.snapshot().steps, bob.snapshot().steps) == (3, expected)


def test_a_two_second_window_refuses_then_admits_a_new_chain(
    client: openai.OpenAI, server: FakeLLMServer, ledger: LocalLedger, clock: FakeClock
) -> None:
    pool = BudgetPool("burst", max_steps=3, window="2s", ledger=ledger)
    first = run_until_denied(client, chain(ledger, pool))
    assert server.count(CHAT) == 3
    assert first.retry_after_s is not None and 2.0 <= first.retry_after_s < 2.0 + 1e-6
    clock.advance(1.0)
    refused = run_until_denied(client, chain(ledger, pool))  # a new chain: still full
    assert server.count(CHAT) == 3
    assert refused.retry_after_s is not None
    clock.advance(refused.retry_after_s)  # the window has slid past the three
    again = run_until_denied(client, chain(ledger, pool))
    assert server.count(CHAT) == 6
    assert again.pool == "burst"


def test_a_call_the_chain_affords_but_the_pool_does_not_is_never_sent(
    client: openai.OpenAI,
    server: FakeLLMServer,
    ledger: LocalLedger,
    span_exporter: InMemorySpanExporter,
) -> None:
    roomy = BudgetPool("roomy", max_cost_usd=1.0, max_steps=10, ledger=ledger)
    tight = BudgetPool("tight", max_cost_usd=nano_to_usd(worst_nano() - 1), ledger=ledger)
    with chain(ledger, roomy, tight) as ctx:
        with pytest.raises(BudgetExceededError) as denied:
            ask(client)
        assert denied.value.pool == "tight"
        snap = ctx.snapshot()
    assert server.count(CHAT) == 0
    assert (snap.steps, snap.reserved_usd, snap.cost_usd) == (0, 0.0, 0.0)
    assert roomy.snapshot() == PoolSnapshot(name="roomy")
    assert tight.snapshot() == PoolSnapshot(name="tight")
    (span,) = [s for s in span_exporter.get_finished_spans() if s.name == f"chat {MODEL}"]
    attributes = span.attributes or {}
    assert attributes["veronica.decision"] == "HALT"
    assert attributes["veronica.pool"] == "tight"
    (trip,) = [e for e in span.events if e.name == "veronica.trip"]
    assert (trip.attributes or {})["veronica.pool"] == "tight"


def test_an_uncapped_call_buys_only_what_the_pool_affords(
    client: openai.OpenAI,
    server: FakeLLMServer,
    ledger: LocalLedger,
    span_exporter: InMemorySpanExporter,
) -> None:
    bound = input_bound([MESSAGES], 1)
    budget = prices().max_cost_nano(bound, 100)  # buys exactly 100 output tokens
    pool = BudgetPool("tenant:acme", max_cost_usd=nano_to_usd(budget), ledger=ledger)
    with chain(ledger, pool):  # the chain's own $5 buys far more
        ask(client, capped=False)
    assert server.requests[-1].body["max_completion_tokens"] == 100
    with ExecutionContext(
        ExecutionConfig(max_cost_usd=nano_to_usd(prices().max_cost_nano(bound, 40))),
        ledger=ledger,
        pools=[BudgetPool("roomy", max_cost_usd=1.0, ledger=ledger)],
    ):  # here the chain is the tighter: no pool named
        ask(client, capped=False)
    assert server.requests[-1].body["max_completion_tokens"] == 40
    first, second = [s for s in span_exporter.get_finished_spans() if s.name == f"chat {MODEL}"]
    assert (first.attributes or {})["veronica.clamped.max_tokens"] == 100
    assert (first.attributes or {})["veronica.pool"] == "tenant:acme"
    assert (second.attributes or {})["veronica.clamped.max_tokens"] == 40
    assert "veronica.pool" not in (second.attributes or {})
    assert pool.snapshot().reserved_cost_usd == 0


def test_pools_on_the_default_ledger(client: openai.OpenAI, server: FakeLLMServer) -> None:
    """No ledger anywhere: the pool and the chain meet on the process's default."""
    pool = BudgetPool("default-ledger-pool", max_steps=2)
    denied = run_until_denied(client, ExecutionContext(pools=[pool]))
    assert server.count(CHAT) == 2 and denied.pool == "default-ledger-pool"


@pytest.mark.asyncio
async def test_chains_as_async_tasks_share_one_pool_exactly(
    server: FakeLLMServer, ledger: LocalLedger
) -> None:
    pool = BudgetPool("tenant:async", max_steps=10, ledger=ledger)
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    try:
        async with openai.AsyncOpenAI(
            base_url=server.openai_base_url, api_key="test", max_retries=0
        ) as aclient:
            settled = asyncio.Event()  # set whenever a call comes back

            async def run(ctx: ExecutionContext) -> BudgetExceededError:
                async with ctx:
                    for _ in range(100):
                        try:
                            await aclient.chat.completions.create(
                                model=MODEL, messages=MESSAGES, max_completion_tokens=CAP
                            )
                            settled.set()
                        except BudgetExceededError as denied:
                            if denied.trip.sticky:
                                return denied
                            # Only calls in flight held the room: wait for one to settle.
                            settled.clear()
                            await asyncio.wait_for(settled.wait(), 30)
                raise AssertionError("never denied")

            denials = await asyncio.gather(*(run(chain(ledger, pool)) for _ in range(3)))
    finally:
        instrumentor.uninstrument()
    assert server.count(CHAT) == 10
    assert all(d.pool == "tenant:async" for d in denials)
    assert pool.snapshot().reserved_steps == 0
