"""Garbage collection can fire inside our own critical sections.

The cyclic collector runs at any allocation, including one made while this
thread holds the ledger's lock; a finaliser that takes that lock again would
deadlock the process (it did: a chain dropped in a reference cycle, collected
during the next call's reservation). Each test runs the dangerous moment in a
thread and fails, instead of hanging, if it blocks.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

from veronica_otel import ExecutionConfig, ExecutionContext, LocalLedger
from veronica_otel._gc_safe import defer, drain, pending


def finishes(fn: Callable[[], None], timeout: float = 10.0) -> bool:
    worker = threading.Thread(target=fn, daemon=True)
    worker.start()
    worker.join(timeout)
    return not worker.is_alive()


def test_a_chain_collected_while_the_ledger_lock_is_held_does_not_deadlock() -> None:
    ledger = LocalLedger()

    def drop_in_a_cycle() -> None:
        ctx = ExecutionContext(ExecutionConfig(max_steps=5), ledger=ledger)
        ctx.cycle = ctx  # type: ignore[attr-defined]  # only the cyclic collector frees it

    drop_in_a_cycle()
    assert len(ledger) == 1

    def collect_inside_the_lock() -> None:
        with ledger._lock:
            gc.collect()  # the chain's finaliser runs here, on this thread

    assert finishes(collect_inside_the_lock)
    survivor = ExecutionContext(ledger=ledger)  # the next acquire applies the drop
    assert len(ledger) == 1
    assert survivor.snapshot().steps == 0


def test_discard_with_the_lock_free_is_immediate() -> None:
    ledger = LocalLedger()
    ctx = ExecutionContext(ledger=ledger)
    del ctx
    assert len(ledger) == 0


def test_deferred_work_runs_at_the_next_check_not_in_the_finaliser() -> None:
    ran: list[str] = []
    defer(ran.append, "settled")
    assert ran == []
    with ExecutionContext() as ctx:
        ctx.begin_call().finish()
    assert ran == ["settled"]
    assert not pending


def test_a_failing_deferred_task_does_not_stop_the_others() -> None:
    ran: list[int] = []

    def boom() -> None:
        raise RuntimeError("clean-up failed")

    defer(boom)
    defer(ran.append, 1)
    drain()
    assert ran == [1]
