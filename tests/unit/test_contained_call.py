"""Settling an instrumented call from a provider's usage report, honest or not."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace

from veronica_otel import ExecutionConfig, ExecutionContext
from veronica_otel._pricing import UnitPrices
from veronica_otel._units import MAX_COUNT
from veronica_otel.instrumentors._admit import CallSpec, admit, input_bound

MODEL = "gpt-4o-mini"
counts = st.one_of(st.integers(-(10**18), 10**18), st.sampled_from([0, 1, 7, MAX_COUNT]))


# No deadline: the first example loads the price table (about 0.4 s on a busy machine).
@settings(deadline=None)
@given(counts, counts, counts, counts, counts)
def test_any_reported_usage_settles_without_raising_and_is_priced_in_range(
    inp: int, out: int, cached: int, reasoning: int, cache_write: int
) -> None:
    # A forged usage report (cached + cache-write tokens above the input, negative or
    # absurd counts) must never raise into the caller's call: absurd counts are capped,
    # then priced; a negative one makes the report unreadable: the reservation is committed.
    with ExecutionContext(ExecutionConfig(max_steps=10)) as ctx:
        call, _, _ = admit(
            ctx,
            trace.INVALID_SPAN,
            False,
            CallSpec(
                "openai",
                "chat",
                MODEL,
                input_bound([[{"role": "user", "content": "hi"}]], 1),
                5,
                True,
            ),
        )
        # Absurd costs would swamp the process-wide cost counter that other tests
        # difference: this test checks the ledger, not the metrics.
        call.handle.metrics = False
        reservation = call.handle.reservation
        readable = call.set_usage(inp, out, cached, reasoning, cache_write)
        call.finish()
        snap = ctx.snapshot()
    assert snap.reserved_usd == 0
    assert snap.steps == 1
    if min(inp, out, cached, reasoning, cache_write) < 0:
        assert not readable
        assert snap.tokens == reservation.tokens
        assert snap.cost_usd == reservation.cost_nano / 1e9
        return
    assert readable
    i = min(inp, MAX_COUNT)
    o = min(out, MAX_COUNT)
    prices = ctx.prices_for("openai", MODEL)
    assert isinstance(prices, UnitPrices)
    assert snap.tokens == i + o
    # Never more than every token at the dearest price, never less than nothing.
    assert 0 <= snap.cost_usd <= prices.max_cost_nano(i, o) / 1e9 + 1e-9
