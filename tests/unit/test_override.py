"""The override: the only way past a sticky trip; logged, time-boxed, visible."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests._clock import patch_chain_clock
from veronica_otel import Decision, ExecutionConfig, ExecutionContext, LocalLedger, WrapOptions
from veronica_otel import _ledger as ledger_module


class WallClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_override_lifts_the_trip_for_its_duration_only(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = WallClock(1_000_000.0)
    monkeypatch.setattr(ledger_module.time, "time", clock)
    monkeypatch.setattr("veronica_otel._chain_trips.time.time", clock)
    ctx = ExecutionContext(ExecutionConfig(max_steps=2), ledger=LocalLedger())
    for _ in range(3):
        ctx.wrap_llm_call(lambda: None)
    assert ctx.trip is not None and ctx.trip.reason == "steps"
    with caplog.at_level(logging.WARNING, logger="veronica_otel.overrides"):
        lifted = ctx.override("incident 42: finish the report", 60, add_steps=2)
    assert lifted is not None and lifted.reason == "steps"
    assert "incident 42" in caplog.text
    assert [ctx.wrap_llm_call(lambda: None) for _ in range(3)] == [
        Decision.ALLOW,
        Decision.ALLOW,
        Decision.HALT,
    ]
    # A fresh override, then it expires by itself: the base limit applies again.
    ctx.override("one more", 10, add_steps=5)
    assert ctx.wrap_llm_call(lambda: None) is Decision.ALLOW
    clock.now += 11
    assert ctx.wrap_llm_call(lambda: None) is Decision.HALT
    assert ctx.snapshot().steps == 5


def test_override_seen_by_another_context_of_the_chain() -> None:
    ledger = LocalLedger()
    a = ExecutionContext(ExecutionConfig(max_cost_usd=0.1), chain_id="ov-1", ledger=ledger)
    b = ExecutionContext(ExecutionConfig(max_cost_usd=0.1), chain_id="ov-1", ledger=ledger)
    opts = WrapOptions(cost_estimate_hint=0.1)
    assert a.wrap_llm_call(lambda: None, opts) is Decision.ALLOW
    assert b.wrap_llm_call(lambda: None, opts) is Decision.HALT
    assert a.wrap_llm_call(lambda: None, opts) is Decision.HALT  # sticky for a as well
    b.override("budget raised by finance", 300, add_usd=0.1)
    assert a.wrap_llm_call(lambda: None, opts) is Decision.ALLOW  # a sees the lifted trip


def test_override_is_a_span_event(span_exporter: InMemorySpanExporter) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=0), name="ov") as ctx:
        ctx.wrap_llm_call(lambda: None)
        ctx.override("approved", 5, add_steps=1)
    root = next(s for s in span_exporter.get_finished_spans() if s.name == "invoke_workflow ov")
    events = {e.name: e for e in root.events}
    assert "veronica.override" in events
    assert events["veronica.override"].attributes is not None
    assert events["veronica.override"].attributes["veronica.override.reason"] == "approved"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"reason": "", "duration_s": 5}, "reason"),
        ({"reason": "x", "duration_s": 0}, "duration_s"),
        ({"reason": "x", "duration_s": float("nan")}, "duration_s"),
        ({"reason": "x", "duration_s": 10**9}, "duration_s"),
        ({"reason": "x", "duration_s": 5, "add_usd": -1}, "add_usd"),
        ({"reason": "x", "duration_s": 5, "add_steps": True}, "add_steps"),
    ],
)
def test_override_rejects_bad_input(kwargs: dict[str, object], match: str) -> None:
    ctx = ExecutionContext(ExecutionConfig(max_steps=0))
    ctx.wrap_llm_call(lambda: None)
    with pytest.raises(ValueError, match=match):
        ctx.override(**kwargs)  # type: ignore[arg-type]
    assert ctx.aborted  # nothing lifted


def test_deadline_trip_is_not_lifted_by_a_budget_override(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    patch_chain_clock(monkeypatch, lambda: now[0])
    ctx = ExecutionContext(ExecutionConfig(timeout_ms=10))
    now[0] = 1.0
    assert ctx.wrap_llm_call(lambda: None) is Decision.HALT
    ctx.override("no", 5, add_steps=1)
    assert ctx.wrap_llm_call(lambda: None) is Decision.HALT
