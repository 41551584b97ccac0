"""ExecutionContext behaviour beyond the counted guarantees: OpenTelemetry
propagation and spans, the pipeline's place in the check, errors, results."""

from __future__ import annotations

import asyncio
import contextvars
import pickle
from concurrent.futures import ThreadPoolExecutor

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests._clock import FakeClock
from veronica_otel import (
    BudgetExceededError,
    CircuitBreaker,
    CircuitState,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    PolicyContext,
    PolicyDecision,
    PolicyPipeline,
    WrapOptions,
    contained_tool,
    current_context,
)


class Deny:
    policy_type = "custom"

    def check(self, context: PolicyContext) -> PolicyDecision:
        return PolicyDecision(False, self.policy_type, "no", trip_reason="steps")

    def reset(self) -> None:
        return None


class Degrade:
    policy_type = "degrade"

    def check(self, context: PolicyContext) -> PolicyDecision:
        return PolicyDecision(True, self.policy_type, fallback_model="gpt-4o-mini", max_tokens=64)

    def reset(self) -> None:
        return None


def test_current_context_follows_with_blocks() -> None:
    assert current_context() is None
    with ExecutionContext() as outer:
        assert current_context() is outer
        with outer.spawn_child() as inner:
            assert current_context() is inner  # the innermost wins
        assert current_context() is outer
    assert current_context() is None


@pytest.mark.asyncio
async def test_context_travels_into_asyncio_tasks() -> None:
    async def probe() -> ExecutionContext | None:
        await asyncio.sleep(0)
        return current_context()

    async with ExecutionContext() as ctx:
        found = await asyncio.gather(*(asyncio.create_task(probe()) for _ in range(5)))
    assert found == [ctx] * 5


def test_context_travels_with_copied_contextvars_into_threads() -> None:
    with ExecutionContext(ExecutionConfig(max_steps=4)) as ctx, ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(contextvars.copy_context().run, current_context) for _ in range(4)]
        assert [f.result() for f in futures] == [ctx] * 4


def test_root_span_makes_one_trace(span_exporter: InMemorySpanExporter) -> None:
    @contained_tool
    def search(q: str) -> str:
        return q.upper()

    with ExecutionContext(name="planner") as ctx:
        assert search("a") == "A"
        with ctx.spawn_child(name="critic"):
            search("b")
    spans = {s.name: s for s in span_exporter.get_finished_spans()}
    assert set(spans) == {"invoke_workflow planner", "invoke_agent critic", "execute_tool search"}
    root = spans["invoke_workflow planner"]
    assert root.parent is None
    assert {s.context.trace_id for s in span_exporter.get_finished_spans()} == {
        root.context.trace_id
    }
    assert spans["invoke_agent critic"].parent.span_id == root.context.span_id  # type: ignore[union-attr]
    assert root.attributes is not None
    assert root.attributes["veronica.chain.id"] == ctx.chain_id
    assert root.attributes["veronica.steps"] == 2


def test_no_root_span_under_an_active_span(span_exporter: InMemorySpanExporter) -> None:
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("request"), ExecutionContext():
        pass
    assert [s.name for s in span_exporter.get_finished_spans()] == ["request"]


def test_trip_is_a_span_event(span_exporter: InMemorySpanExporter) -> None:
    @contained_tool(name="fetch")
    def fetch() -> None:
        return None

    with ExecutionContext(ExecutionConfig(max_steps=1)):
        fetch()
        with pytest.raises(BudgetExceededError) as info:
            fetch()
    assert info.value.reason == "steps"
    denied = [s for s in span_exporter.get_finished_spans() if s.name == "execute_tool fetch"][1]
    event = denied.events[0]
    assert event.name == "veronica.trip"
    assert event.attributes is not None and event.attributes["veronica.trip.reason"] == "steps"
    assert denied.status.status_code is trace.StatusCode.ERROR


@pytest.mark.asyncio
async def test_contained_tool_async() -> None:
    calls = []

    @contained_tool(cost_usd=0.4)
    async def tool() -> int:
        calls.append(1)
        return 7

    async with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)):
        assert await tool() == 7
        assert await tool() == 7
        with pytest.raises(BudgetExceededError):
            await tool()
    assert len(calls) == 2
    assert await tool() == 7  # no active chain: runs unchanged


def test_user_errors_propagate_unchanged() -> None:
    ctx = ExecutionContext()
    err = KeyError("mine")

    def fail() -> None:
        raise err

    with pytest.raises(KeyError) as info:
        ctx.wrap_llm_call(fail)
    assert info.value is err


def test_inner_budget_error_becomes_halt() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_steps=1))

    def nested() -> None:
        ctx.begin_call("llm").finish()  # a second step inside the first: denied

    assert ctx.wrap_llm_call(nested) is Decision.HALT


def test_partial_result_is_the_last_result() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_steps=2))
    ctx.wrap_llm_call(lambda: "draft 1")
    ctx.wrap_llm_call(lambda: "draft 2")
    assert ctx.wrap_llm_call(lambda: "draft 3") is Decision.HALT
    assert ctx.get_partial_result() == "draft 2"


def test_pipeline_denial_is_not_dispatched_and_not_sticky() -> None:
    calls: list[int] = []
    ctx = ExecutionContext(pipeline=PolicyPipeline([Deny()]))
    assert ctx.wrap_llm_call(lambda: calls.append(1)) is Decision.HALT
    assert calls == []
    assert ctx.snapshot().steps == 0
    assert not ctx.aborted  # a policy's "no" is per call; ceilings are what stick


def test_pipeline_degradation_reaches_the_call() -> None:
    ctx = ExecutionContext(pipeline=PolicyPipeline([Degrade()]))
    call = ctx.begin_call("llm", WrapOptions(model="gpt-4o"))
    try:
        assert call.decision.fallback_model == "gpt-4o-mini"
        assert call.decision.max_tokens == 64
    finally:
        call.finish()


def test_breaker_in_pipeline_is_fed_outcomes_and_probe_released_on_ledger_denial() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failure_threshold=2, recovery_timeout=10, clock=clock)
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0), PolicyPipeline([breaker]))

    def fail() -> None:
        raise TimeoutError

    for _ in range(2):
        with pytest.raises(TimeoutError):
            ctx.wrap_llm_call(fail)
    assert breaker.state is CircuitState.OPEN
    assert ctx.wrap_llm_call(lambda: None) is Decision.HALT  # open: denied, not dispatched
    clock.now += 10
    # The probe is allowed by the breaker but its reservation does not fit:
    # the ledger denies it, and the probe slot must come back.
    assert ctx.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=2.0)) is Decision.HALT
    other = ExecutionContext(pipeline=PolicyPipeline([breaker]))
    assert other.wrap_llm_call(lambda: None) is Decision.ALLOW  # got the probe
    assert breaker.state is CircuitState.CLOSED


def test_budget_error_carries_the_trip_and_pickles() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_steps=0))
    with pytest.raises(BudgetExceededError) as info:
        ctx.begin_call()
    err = info.value
    assert (err.reason, err.limit, err.observed, err.chain_id) == ("steps", 0, 1, ctx.chain_id)
    assert err.trip is ctx.trip
    again = pickle.loads(pickle.dumps(err))
    assert again.trip == err.trip


def test_snapshot_is_frozen_and_consistent() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1))
    ctx.wrap_llm_call(lambda: ctx.record_usage(cost_usd=0.2, input_tokens=5, output_tokens=7))
    snap = ctx.snapshot()
    assert (snap.cost_usd, snap.steps, snap.tokens, snap.aborted) == (0.2, 1, 12, False)
    with pytest.raises(AttributeError):
        snap.steps = 5  # type: ignore[misc]


def test_record_usage_prices_known_models() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1))
    ctx.wrap_llm_call(
        lambda: ctx.record_usage(
            model="gpt-4o", provider="openai", input_tokens=1_000_000, output_tokens=0
        ),
        WrapOptions(cost_estimate_hint=0.9),
    )
    assert ctx.snapshot().cost_usd == pytest.approx(2.5)  # over: truth recorded, chain tripped
    assert ctx.aborted


def test_record_usage_outside_a_call_commits_directly() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1))
    ctx.record_usage(cost_usd=0.4)
    assert ctx.snapshot().cost_usd == 0.4
    assert ctx.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.7)) is Decision.HALT


def test_shared_chain_id_shares_the_budget() -> None:
    a = ExecutionContext(ExecutionConfig(max_steps=3), chain_id="shared-1")
    b = ExecutionContext(ExecutionConfig(max_steps=3), chain_id="shared-1")
    results = [ctx.wrap_llm_call(lambda: None) for ctx in (a, b, a, b)]
    assert results == [Decision.ALLOW] * 3 + [Decision.HALT]
