"""Utilisation at a cost ceiling: at least 99 % of the calls it affords go out, never one more.

The real ``openai`` and ``anthropic`` SDKs against the fake server, which
bills every call the same fixed usage. "Affordable" is the ceiling over that
actual cost; what was sent is counted at the server. One after another, and
50 asyncio tasks at once (where a call refused only because the others'
reservations hold the budget waits for them to settle), on the in-process
ledger and on a real Valkey.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import openai
import pytest

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel._ledger import LocalLedger
from veronica_otel._pricing import UnitPrices, default_price_table
from veronica_otel._units import nano_to_usd, usd_to_nano
from veronica_otel.instrumentors._admit import input_bound
from veronica_otel.instrumentors.anthropic import AnthropicInstrumentor
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer

CEILING_USD = 0.01
TASKS = 50
PROMPT = [{"role": "user", "content": "Say hi."}]
# What the providers report for that prompt (text, framing), and a full reply.
OPENAI_MODEL, OPENAI_INPUT = "gpt-4o-mini", 10
CLAUDE_MODEL, CLAUDE_INPUT = "claude-haiku-4-5", 14
OUTPUT = 100
CHAT, MESSAGES = "/v1/chat/completions", "/v1/messages"


def _prices(provider: str, model: str) -> UnitPrices:
    prices = default_price_table().lookup(provider, model)
    assert prices is not None
    return prices


def _affordable(ceiling_nano: int, actual_nano: int) -> int:
    return ceiling_nano // actual_nano


def _assert_utilised(sent: int, ceiling_nano: int, actual_nano: int, ctx: ExecutionContext) -> None:
    affordable = _affordable(ceiling_nano, actual_nano)
    assert affordable >= 10  # the test means something
    assert sent <= affordable  # never one more
    assert sent >= math.ceil(0.99 * affordable), f"{sent} of {affordable} affordable calls"
    assert usd_to_nano(ctx.snapshot().cost_usd) == sent * actual_nano <= ceiling_nano


async def _fifty_until_refused(call: Callable[[], Awaitable[object]]) -> list[BudgetExceededError]:
    """Fifty tasks call until each is refused; their refusals."""

    async def worker() -> BudgetExceededError:
        while True:
            try:
                await call()
            except BudgetExceededError as exc:
                return exc

    return await asyncio.gather(*(worker() for _ in range(TASKS)))


@pytest.fixture
def instrumented() -> Iterator[None]:
    oai, claude = OpenAIInstrumentor(), AnthropicInstrumentor()
    oai.instrument()
    claude.instrument()
    yield
    claude.uninstrument()
    oai.uninstrument()


# -- openai ------------------------------------------------------------------------------


@pytest.fixture
def openai_server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(input_tokens=OPENAI_INPUT, output_tokens=OUTPUT) as fake:
        yield fake


def _openai_actual() -> int:
    return _prices("openai", OPENAI_MODEL).cost_nano(OPENAI_INPUT, OUTPUT)


def test_openai_one_after_another(
    instrumented: None, openai_server: FakeLLMServer, ledger: Any
) -> None:
    ceiling = usd_to_nano(CEILING_USD)
    config = ExecutionConfig(max_cost_usd=CEILING_USD)
    with (
        openai.OpenAI(base_url=openai_server.openai_base_url, api_key="t", max_retries=0) as oai,
        ExecutionContext(config, ledger=ledger) as ctx,
    ):
        with pytest.raises(BudgetExceededError) as denied:
            while True:
                oai.chat.completions.create(
                    model=OPENAI_MODEL, messages=PROMPT, max_completion_tokens=OUTPUT
                )
        assert denied.value.trip.sticky  # refused on committed spend, not on a hold
        _assert_utilised(openai_server.count(CHAT), ceiling, _openai_actual(), ctx)


@pytest.mark.asyncio
async def test_openai_fifty_tasks_at_once(
    instrumented: None, openai_server: FakeLLMServer, ledger: Any
) -> None:
    ceiling = usd_to_nano(CEILING_USD)
    config = ExecutionConfig(max_cost_usd=CEILING_USD)
    async with openai.AsyncOpenAI(
        base_url=openai_server.openai_base_url, api_key="t", max_retries=0
    ) as oai:
        with ExecutionContext(config, ledger=ledger) as ctx:
            denials = await _fifty_until_refused(
                lambda: oai.chat.completions.create(
                    model=OPENAI_MODEL, messages=PROMPT, max_completion_tokens=OUTPUT
                )
            )
            assert all(exc.reason == "cost" for exc in denials)
            _assert_utilised(openai_server.count(CHAT), ceiling, _openai_actual(), ctx)


# -- anthropic ---------------------------------------------------------------------------


@pytest.fixture
def claude_server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(input_tokens=CLAUDE_INPUT, output_tokens=OUTPUT) as fake:
        yield fake


def _claude_actual() -> int:
    return _prices("anthropic", CLAUDE_MODEL).cost_nano(CLAUDE_INPUT, OUTPUT)


def _claude_calls(ceiling_usd: float, server: FakeLLMServer, ledger: Any) -> ExecutionContext:
    import anthropic

    config = ExecutionConfig(max_cost_usd=ceiling_usd)
    with (
        anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="t", max_retries=0) as cl,
        ExecutionContext(config, ledger=ledger) as ctx,
    ):
        with pytest.raises(BudgetExceededError) as denied:
            while True:
                cl.messages.create(model=CLAUDE_MODEL, messages=PROMPT, max_tokens=OUTPUT)  # type: ignore[arg-type]
        assert denied.value.trip.sticky
    return ctx


def test_anthropic_one_after_another(
    instrumented: None, claude_server: FakeLLMServer, ledger: Any
) -> None:
    ctx = _claude_calls(CEILING_USD, claude_server, ledger)
    _assert_utilised(claude_server.count(MESSAGES), usd_to_nano(CEILING_USD), _claude_actual(), ctx)


def test_anthropic_input_is_not_reserved_at_the_cache_write_price(
    instrumented: None, claude_server: FakeLLMServer
) -> None:
    # A ceiling that leaves the last affordable call exactly its worst case:
    # reserved at the cache-write price (a request that marks nothing to
    # cache cannot pay it), that call would be refused.
    prices = _prices("anthropic", CLAUDE_MODEL)
    assert prices.cache_write is not None and prices.cache_write > prices.input
    worst = prices.max_cost_nano(input_bound([PROMPT], 1), OUTPUT, cache_writes=False)
    actual, calls = _claude_actual(), 20
    ceiling = calls * actual + (worst - actual)
    assert prices.max_cost_nano(input_bound([PROMPT], 1), OUTPUT) > worst  # what it used to be
    ctx = _claude_calls(nano_to_usd(ceiling), claude_server, LocalLedger())
    assert claude_server.count(MESSAGES) == calls
    _assert_utilised(calls, usd_to_nano(nano_to_usd(ceiling)), actual, ctx)


@pytest.mark.asyncio
async def test_anthropic_fifty_tasks_at_once(
    instrumented: None, claude_server: FakeLLMServer, ledger: Any
) -> None:
    import anthropic

    ceiling = usd_to_nano(CEILING_USD)
    config = ExecutionConfig(max_cost_usd=CEILING_USD)
    async with anthropic.AsyncAnthropic(
        base_url=claude_server.anthropic_base_url, api_key="t", max_retries=0
    ) as cl:
        with ExecutionContext(config, ledger=ledger) as ctx:
            await _fifty_until_refused(
                lambda: cl.messages.create(
                    model=CLAUDE_MODEL,
                    messages=PROMPT,  # type: ignore[arg-type]
                    max_tokens=OUTPUT,
                )
            )
            _assert_utilised(claude_server.count(MESSAGES), ceiling, _claude_actual(), ctx)


async def _one_call_each(server: FakeLLMServer, ctx: ExecutionContext) -> list[Any]:
    """Fifty tasks make one call each at once; what each got (a reply or its denial)."""
    async with openai.AsyncOpenAI(
        base_url=server.openai_base_url, api_key="t", max_retries=0
    ) as oai:

        async def one() -> Any:
            try:
                return await oai.chat.completions.create(
                    model=OPENAI_MODEL, messages=PROMPT, max_completion_tokens=OUTPUT
                )
            except BudgetExceededError as exc:
                return exc

        with ctx:
            return await asyncio.gather(*(one() for _ in range(TASKS)))


@pytest.mark.asyncio
async def test_a_call_refused_only_by_others_holds_waits_for_them(
    instrumented: None, openai_server: FakeLLMServer, ledger: Any
) -> None:
    # Room for ten calls, fifty asked at once (each reply takes 5 ms): the
    # forty calls over the first ten's reservations wait, ten go out, and the
    # rest are refused on committed spend.
    openai_server.set_latency(0.005)
    actual = _openai_actual()
    ceiling = 10 * actual + actual // 2
    config = ExecutionConfig(max_cost_usd=nano_to_usd(ceiling))
    ctx = ExecutionContext(config, ledger=ledger)
    results = await _one_call_each(openai_server, ctx)
    assert openai_server.count(CHAT) == 10
    denials = [r for r in results if isinstance(r, BudgetExceededError)]
    assert len(denials) == TASKS - 10 and all(exc.trip.sticky for exc in denials)


@pytest.mark.asyncio
async def test_without_waiting_the_holds_of_others_refuse_affordable_calls(
    instrumented: None, openai_server: FakeLLMServer
) -> None:
    # The same fifty calls with reservation_wait_s=0: refused while the first
    # ones hold the budget, affordable calls are lost (what the wait fixes).
    openai_server.set_latency(0.005)
    actual = _openai_actual()
    ceiling = 10 * actual + actual // 2
    config = ExecutionConfig(max_cost_usd=nano_to_usd(ceiling), reservation_wait_s=0)
    results = await _one_call_each(openai_server, ExecutionContext(config))
    assert openai_server.count(CHAT) < 10
    assert any(isinstance(r, BudgetExceededError) and not r.trip.sticky for r in results)
