"""The kernel when the shared store is down: fail closed, never wedge, never crash on exit."""

from __future__ import annotations

import socket

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from veronica_otel import (
    BudgetExceededError,
    CircuitBreaker,
    CircuitState,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    PolicyPipeline,
)
from veronica_otel.distributed import LedgerUnavailableError, RedisLedger


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once the socket closes


@pytest.fixture
def dead_ledger() -> RedisLedger:
    return RedisLedger.from_url(f"redis://127.0.0.1:{closed_port()}/0", fail_open=False)


def test_calls_fail_closed_and_exit_does_not_raise(
    dead_ledger: RedisLedger, span_exporter: InMemorySpanExporter
) -> None:
    ran = []
    with ExecutionContext(ExecutionConfig(max_steps=5), ledger=dead_ledger, name="down") as ctx:
        assert ctx.wrap_llm_call(lambda: ran.append(1)) is Decision.HALT
        with pytest.raises(LedgerUnavailableError, match=r"127\.0\.0\.1"):
            ctx.begin_call()
    assert ran == []
    with pytest.raises(LedgerUnavailableError):
        ctx.snapshot()  # reading the chain needs the store too: no made-up zeros
    assert [s.name for s in span_exporter.get_finished_spans()] == ["invoke_workflow down"]


def test_half_open_probe_is_given_back_when_the_store_fails(dead_ledger: RedisLedger) -> None:
    now = [0.0]
    breaker = CircuitBreaker(failure_threshold=1, recovery_timeout=10, clock=lambda: now[0])
    breaker.record_failure()
    now[0] = 10.0
    ctx = ExecutionContext(pipeline=PolicyPipeline([breaker]), ledger=dead_ledger)
    with pytest.raises(BudgetExceededError):
        ctx.begin_call()  # the breaker lent its probe, then the ledger failed
    assert breaker.state is CircuitState.HALF_OPEN
    assert breaker.check().allowed  # the probe slot is free again
