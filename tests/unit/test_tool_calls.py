"""Tool calls are chain steps: ToolCall and contained_tool.

Each test counts how often the tool body really ran, so a denial that let
the tool run anyway (or a repeat that was not caught) fails here.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from veronica_otel import (
    BudgetExceededError,
    CircuitBreaker,
    ExecutionConfig,
    ExecutionContext,
    ToolCall,
    contained_tool,
    set_tool_prices,
)
from veronica_otel._tools import tool_signature


@pytest.fixture(autouse=True)
def _no_tool_prices() -> Iterator[None]:
    yield
    set_tool_prices(None)


def test_same_tool_same_arguments_trips_loop_at_max_repeats() -> None:
    ran: list[int] = []

    @contained_tool
    def search(query: str, limit: int = 5) -> int:
        ran.append(limit)
        return limit

    with ExecutionContext(ExecutionConfig(max_repeats=2)) as ctx:
        search("cats")
        search(query="cats", limit=5)  # same call, spelled differently
        search("dogs")  # other arguments: not a repeat
        with pytest.raises(BudgetExceededError) as err:
            search("cats", 5)
    assert err.value.reason == "loop"
    assert ran == [5, 5, 5]
    assert ctx.snapshot().steps == 3


def test_signature_ignores_key_order_and_tells_values_apart() -> None:
    assert tool_signature("t", {"a": 1, "b": [1, 2]}) == tool_signature("t", {"b": [1, 2], "a": 1})
    assert tool_signature("t", {"a": 1}) != tool_signature("t", {"a": 2})
    assert tool_signature("t", {"a": 1}) != tool_signature("u", {"a": 1})
    assert tool_signature("t", {1: "x", "1": "y"})  # unsortable keys still sign


@given(st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=6))
def test_signature_is_stable_under_reordering(arguments: dict[str, object]) -> None:
    reordered = dict(reversed(list(arguments.items())))
    assert tool_signature("tool", arguments) == tool_signature("tool", reordered)


def test_denied_tool_never_runs_and_its_span_says_halt(
    span_exporter: InMemorySpanExporter,
) -> None:
    ran = 0

    @contained_tool(name="fetch")
    def fetch() -> None:
        nonlocal ran
        ran += 1

    span_exporter.clear()
    with ExecutionContext(ExecutionConfig(max_steps=1)):
        fetch()
        with pytest.raises(BudgetExceededError):
            fetch()
    assert ran == 1
    spans = [s for s in span_exporter.get_finished_spans() if s.name == "execute_tool fetch"]
    assert [s.attributes["veronica.decision"] for s in spans] == ["ALLOW", "HALT"]
    assert spans[1].attributes["veronica.trip.reason"] == "steps"
    assert spans[0].attributes["gen_ai.operation.name"] == "execute_tool"


def test_tool_price_is_reserved_and_committed() -> None:
    set_tool_prices({"paid": 0.4})

    @contained_tool(name="paid")
    def paid() -> None:
        return None

    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        paid()
        paid()
        with pytest.raises(BudgetExceededError) as err:
            paid()  # 0.8 spent, 0.4 more would cross 1.0
    assert err.value.reason == "cost"
    assert ctx.snapshot().cost_usd == pytest.approx(0.8)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_bad_tool_prices_are_rejected_by_name(bad: float) -> None:
    with pytest.raises(ValueError, match="price of tool 'x'"):
        set_tool_prices({"x": bad})
    with pytest.raises(ValueError, match="cost_usd"):
        contained_tool(cost_usd=bad)


def test_tool_breaker_opens_after_failures_and_denies_without_running() -> None:
    breaker = CircuitBreaker(failure_threshold=2, recovery_timeout=60.0)
    ran = 0

    def flaky() -> None:
        nonlocal ran
        ran += 1
        raise RuntimeError("tool down")

    with ExecutionContext() as ctx:
        for _ in range(2):
            with pytest.raises(RuntimeError), ToolCall("flaky", breaker=breaker):
                flaky()
        with pytest.raises(BudgetExceededError) as err, ToolCall("flaky", breaker=breaker):
            flaky()
        # An error *result* counts as a failure too, without an exception.
        ok_breaker = CircuitBreaker(failure_threshold=1, recovery_timeout=60.0)
        with ToolCall("soft", breaker=ok_breaker) as call:
            call.mark_failed("isError result")
        with pytest.raises(BudgetExceededError), ToolCall("soft", breaker=ok_breaker):
            pass
    assert err.value.reason == "circuit_open"
    assert ran == 2
    assert ctx.snapshot().steps == 3  # breaker denials take no step


def test_record_usage_inside_a_tool_call_is_its_cost() -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx, ToolCall("t", cost_usd=0.5):
        ctx.record_usage(cost_usd=0.1)
    assert ctx.snapshot().cost_usd == pytest.approx(0.1)


def test_no_chain_means_no_check_and_no_span(span_exporter: InMemorySpanExporter) -> None:
    span_exporter.clear()
    with ToolCall("free") as call:
        assert not call.active
    assert span_exporter.get_finished_spans() == ()


def test_async_tools_share_the_chain_across_tasks() -> None:
    ran = 0

    @contained_tool
    async def lookup(key: int) -> int:
        nonlocal ran
        ran += 1
        await asyncio.sleep(0)
        return key

    async def main() -> list[BaseException | int]:
        async with ExecutionContext(ExecutionConfig(max_steps=5)):
            return await asyncio.gather(*(lookup(i) for i in range(8)), return_exceptions=True)

    results = asyncio.run(main())
    assert ran == 5
    assert sum(isinstance(r, BudgetExceededError) for r in results) == 3


def test_bad_tool_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="tool name"):
        ToolCall("")


def test_threads_share_one_chain_exactly() -> None:
    ran = 0
    lock = threading.Lock()

    @contained_tool
    def work(i: int) -> int:
        nonlocal ran
        with lock:
            ran += 1
        return i

    ctx = ExecutionContext(ExecutionConfig(max_steps=100))

    def worker(base: int) -> int:
        denied = 0
        with ctx:
            for i in range(50):
                try:
                    work(base * 1000 + i)
                except BudgetExceededError:
                    denied += 1
        return denied

    with ThreadPoolExecutor(8) as pool:
        denied = sum(pool.map(worker, range(8)))
    assert ran == 100
    assert denied == 300
    assert ctx.snapshot().steps == 100
