"""What the wrap_llm_call hot path keeps when it is made cheaper (issue 16).

* An exact commit (a call that reported no usage) is queued lock-free and
  applied under the ledger lock by the next operation that reads the split
  between spent and reserved: every read sees it, a denial after it is sticky
  (spent, not merely reserved), threads lose none, and the queue stays short.
* A plain ``async def`` is no longer inspected before admission: it is refused
  by what it returns, released, and a denied call still raises the TypeError.
* A plain in-process chain keeps few enough attributes that CPython stores
  them inline (its hot-path attribute reads are specialised).
"""

from __future__ import annotations

import threading

import pytest

from veronica_otel import Decision, ExecutionConfig, ExecutionContext, WrapOptions
from veronica_otel._ledger import _SETTLE_BATCH, LocalLedger

CENT = WrapOptions(cost_estimate_hint=0.01)


def _noop() -> None:
    return None


async def _async_call() -> None:
    return None


def test_exact_commits_show_in_every_read() -> None:
    ledger = LocalLedger()
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=10.0), ledger=ledger)
    for _ in range(100):
        assert ctx.wrap_llm_call(_noop, CENT) is Decision.ALLOW
    snap = ctx.snapshot()
    assert (snap.steps, snap.cost_usd, snap.reserved_usd) == (100, 1.0, 0.0)
    state = ledger.snapshot(ctx.chain_id)
    assert (state.cost_nano, state.reserved_nano) == (1_000_000_000, 0)
    assert ctx.remaining_cost_nano() == 9_000_000_000


def test_usage_reported_after_queued_commits_adds_up() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=10.0), ledger=LocalLedger())
    for _ in range(3):
        ctx.wrap_llm_call(_noop, CENT)  # queued
    # Reported usage differs from the reservation: the locked commit applies the queue first.
    ctx.wrap_llm_call(lambda: ctx.record_usage(cost_usd=0.5), CENT)
    snap = ctx.snapshot()
    assert (snap.steps, snap.cost_usd, snap.reserved_usd) == (4, 0.53, 0.0)


def test_a_denial_after_queued_commits_is_a_sticky_trip() -> None:
    # Five cents spent, queued as exact commits: the sixth call does not fit
    # against what was *spent*, so the chain trips (not a soft "calls in
    # flight hold the rest" denial, which is what reserved-only would give).
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=0.05), ledger=LocalLedger())
    for _ in range(5):
        assert ctx.wrap_llm_call(_noop, CENT) is Decision.ALLOW
    assert ctx.wrap_llm_call(_noop, CENT) is Decision.HALT
    trip = ctx.snapshot().trip
    assert trip is not None and trip.reason == "cost" and trip.sticky


def test_threads_lose_no_queued_commit() -> None:
    ledger = LocalLedger()
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=100.0), ledger=ledger)
    calls, threads = 300, 6

    def work() -> None:
        for _ in range(calls):
            ctx.wrap_llm_call(_noop, CENT)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    state = ledger.snapshot(ctx.chain_id)
    assert state.steps == calls * threads
    assert (state.cost_nano, state.reserved_nano) == (calls * threads * 10_000_000, 0)


def test_the_commit_queue_stays_short_without_reads() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=100.0), ledger=LocalLedger())
    for _ in range(5 * _SETTLE_BATCH + 3):
        ctx.wrap_llm_call(_noop, CENT)
    assert ctx._state.live is not None
    assert len(ctx._state.live[0].settled) < _SETTLE_BATCH


@pytest.mark.parametrize("wrapper", ["wrap_llm_call", "wrap_tool_call"])
def test_an_async_def_on_a_denied_chain_is_still_a_type_error(wrapper: str) -> None:
    ctx = ExecutionContext(ExecutionConfig(max_steps=1), ledger=LocalLedger())
    assert getattr(ctx, wrapper)(_noop) is Decision.ALLOW
    assert getattr(ctx, wrapper)(_noop) is Decision.HALT  # the chain is out of steps
    with pytest.raises(TypeError, match=rf"coroutine function .*a{wrapper}"):
        getattr(ctx, wrapper)(_async_call)


def test_an_async_def_is_refused_released_and_named() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_steps=5, max_cost_usd=1.0), ledger=LocalLedger())
    with pytest.raises(TypeError, match=r"coroutine function .*awrap_llm_call"):
        ctx.wrap_llm_call(_async_call, CENT)
    snap = ctx.snapshot()
    assert (snap.steps, snap.cost_usd, snap.reserved_usd) == (0, 0.0, 0.0)
    assert ctx.wrap_llm_call(_noop, CENT) is Decision.ALLOW  # nothing left held


def test_a_plain_chain_keeps_its_attributes_inline() -> None:
    # CPython 3.11-3.12 keep at most 29 attributes of an instance inline; past
    # that the instance gets a dict and every self.<attr> and self.<method>
    # read on the hot path is a dict lookup (about 5% of wrap_llm_call here).
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0), ledger=LocalLedger()) as ctx:
        ctx.wrap_llm_call(_noop, CENT)
        assert len(vars(ctx)) <= 29, sorted(vars(ctx))
