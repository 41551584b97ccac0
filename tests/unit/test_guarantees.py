"""Each DESIGN.md guarantee (G1-G9, exact money, no-SDK enforcement) under test.

Every test here would fail if its guarantee broke: the counts asserted are
exact, under threads and asyncio tasks as well as sequentially.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Callable

import pytest

from tests._clock import patch_chain_clock
from veronica_otel import (
    BudgetExceededError,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    LocalLedger,
    WrapOptions,
)

THREADS = 8


def run_threads(count: int, target: Callable[[], None]) -> None:
    barrier = threading.Barrier(count)

    def body() -> None:
        barrier.wait()
        target()

    threads = [threading.Thread(target=body) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


class Counter:
    """Counts how many wrapped calls actually ran (were "dispatched")."""

    def __init__(self) -> None:
        self.n = 0
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            self.n += 1


# -- G1 cost -----------------------------------------------------------------


def test_g1_three_tenths_allow_exactly_three_calls() -> None:
    calls = Counter()
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=0.3))
    tenth = WrapOptions(cost_estimate_hint=0.1)
    decisions = [ctx.wrap_llm_call(calls, tenth) for _ in range(4)]
    assert decisions == [Decision.ALLOW] * 3 + [Decision.HALT]
    assert calls.n == 3
    snap = ctx.snapshot()
    assert snap.cost_usd == 0.3  # integer ledger: 0.1 + 0.1 + 0.1 is exactly 0.3
    assert snap.trip is not None and snap.trip.reason == "cost"


def test_g1_eight_threads_dispatch_exactly_33() -> None:
    calls = Counter()
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0))
    opts = WrapOptions(cost_estimate_hint=0.03)
    run_threads(THREADS, lambda: [ctx.wrap_llm_call(calls, opts) for _ in range(200)])
    assert calls.n == 33
    assert ctx.snapshot().cost_usd == pytest.approx(0.99, abs=1e-12)
    assert ctx.snapshot().reserved_usd == 0


async def test_g1_asyncio_tasks_dispatch_exactly_33() -> None:
    calls = Counter()
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0))
    opts = WrapOptions(cost_estimate_hint=0.03)

    async def call() -> None:
        await asyncio.sleep(0)  # yield inside the call: reservations overlap
        calls()

    async def worker() -> None:
        for _ in range(50):
            await ctx.awrap_llm_call(call, opts)

    await asyncio.gather(*(worker() for _ in range(THREADS)))
    assert calls.n == 33


test_g1_asyncio_tasks_dispatch_exactly_33 = pytest.mark.asyncio(
    test_g1_asyncio_tasks_dispatch_exactly_33
)


def test_g1_reservation_blocks_while_in_flight() -> None:
    """The worst case is held before dispatch: a concurrent call cannot use it
    (and, with no wait for room, is refused at once: the hold is its caller's)."""
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0, reservation_wait_s=0))
    inner: list[Decision] = []

    def outer() -> None:
        inner.append(ctx.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.5)))

    assert ctx.wrap_llm_call(outer, WrapOptions(cost_estimate_hint=0.6)) is Decision.ALLOW
    assert inner == [Decision.HALT]


def test_g1_commit_actual_and_release_the_rest() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0))

    def cheap() -> None:
        ctx.record_usage(cost_usd=0.25)

    assert ctx.wrap_llm_call(cheap, WrapOptions(cost_estimate_hint=0.9)) is Decision.ALLOW
    snap = ctx.snapshot()
    assert snap.cost_usd == 0.25 and snap.reserved_usd == 0
    # the unused 0.65 is available again
    assert ctx.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.75)) is Decision.ALLOW


def test_g10_failed_call_commits_its_reservation() -> None:
    # G10: the call ran and may have been billed, so its worst case is spent,
    # and nothing stays reserved.
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0))

    def boom() -> None:
        raise ConnectionError("provider down")

    with pytest.raises(ConnectionError):
        ctx.wrap_llm_call(boom, WrapOptions(cost_estimate_hint=0.9))
    assert ctx.snapshot().cost_usd == 0.9 and ctx.snapshot().reserved_usd == 0


def test_g1_priced_worst_case_from_model_and_max_tokens() -> None:
    """With model + max_tokens and no hint, the reservation is the priced worst case."""
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=0.01))
    seen: list[float] = []
    opts = WrapOptions(model="gpt-4o", provider="openai", input_tokens=1000, max_tokens=500)
    assert ctx.wrap_llm_call(lambda: seen.append(ctx.snapshot().reserved_usd), opts) is (
        Decision.ALLOW
    )
    # gpt-4o: 2.5 USD/M in, 10 USD/M out -> 0.0025 + 0.005
    assert seen == [pytest.approx(0.0075)]
    assert ctx.snapshot().cost_usd == pytest.approx(0.0075)
    # a second worst case does not fit into what is left
    assert ctx.wrap_llm_call(lambda: None, opts) is Decision.HALT


def test_g1_unknown_model_is_never_free() -> None:
    calls = Counter()
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=10.0))
    opts = WrapOptions(model="no-such-model-xyz", max_tokens=10)
    with pytest.raises(BudgetExceededError, match="no-such-model-xyz"):
        ctx.begin_call("llm", opts)
    assert ctx.wrap_llm_call(calls, opts) is Decision.HALT
    assert calls.n == 0


def test_g1_usage_above_reservation_trips_at_once() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0))
    ctx.wrap_llm_call(lambda: ctx.record_usage(cost_usd=1.5), WrapOptions(cost_estimate_hint=0.1))
    snap = ctx.snapshot()
    assert snap.cost_usd == 1.5  # the truth is recorded, not hidden
    assert snap.trip is not None and snap.trip.reason == "cost"
    assert ctx.wrap_llm_call(lambda: None) is Decision.HALT


# -- G2 steps ----------------------------------------------------------------


def test_g2_max_steps_10_under_8_threads() -> None:
    calls = Counter()
    ctx = ExecutionContext(ExecutionConfig(max_steps=10))
    run_threads(THREADS, lambda: [ctx.wrap_llm_call(calls) for _ in range(50)])
    assert calls.n == 10
    assert ctx.snapshot().steps == 10


@pytest.mark.asyncio
async def test_g2_max_steps_under_asyncio_tasks() -> None:
    calls = Counter()
    ctx = ExecutionContext(ExecutionConfig(max_steps=10))

    async def call() -> None:
        await asyncio.sleep(0)
        calls()

    async def worker() -> None:
        for _ in range(20):
            await ctx.awrap_tool_call(call)

    await asyncio.gather(*(asyncio.create_task(worker()) for _ in range(THREADS)))
    assert calls.n == 10


def test_g2_tool_and_llm_calls_share_steps() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_steps=3))
    assert ctx.wrap_llm_call(lambda: None) is Decision.ALLOW
    assert ctx.wrap_tool_call(lambda: None) is Decision.ALLOW
    assert ctx.wrap_llm_call(lambda: None) is Decision.ALLOW
    assert ctx.wrap_tool_call(lambda: None) is Decision.HALT


# -- G3 retries --------------------------------------------------------------


def test_g3_retries_exact_under_threads() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_retries_total=7))
    granted = Counter()

    def draw() -> None:
        for _ in range(10):
            try:
                ctx.consume_retry()
            except BudgetExceededError as exc:
                assert exc.reason == "retries"
            else:
                granted()

    run_threads(THREADS, draw)
    assert granted.n == 7
    assert ctx.snapshot().retries == 7


def test_g3_retry_attempt_counts_step_and_retry() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_retries_total=1))
    retry = WrapOptions(retry=True)
    assert ctx.wrap_llm_call(lambda: None) is Decision.ALLOW
    assert ctx.wrap_llm_call(lambda: None, retry) is Decision.ALLOW
    assert ctx.wrap_llm_call(lambda: None, retry) is Decision.HALT
    snap = ctx.snapshot()
    assert (snap.steps, snap.retries) == (2, 1)


# -- G5 timeout ----------------------------------------------------------------


def test_g5_no_dispatch_after_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    patch_chain_clock(monkeypatch, lambda: now[0])
    calls = Counter()
    ctx = ExecutionContext(ExecutionConfig(timeout_ms=500))
    assert ctx.wrap_llm_call(calls) is Decision.ALLOW
    now[0] += 0.499
    assert ctx.wrap_llm_call(calls) is Decision.ALLOW
    now[0] += 0.001
    assert ctx.wrap_llm_call(calls) is Decision.HALT
    assert calls.n == 2
    assert ctx.trip is not None and ctx.trip.reason == "timeout"


def test_g5_shared_timer_cancels_token() -> None:
    """The one timer thread fires the deadline; we wait on an event, not a sleep."""
    ctx = ExecutionContext(ExecutionConfig(timeout_ms=20))
    fired = threading.Event()
    ctx.cancellation.add_callback(fired.set)
    assert fired.wait(timeout=10)
    assert ctx.aborted
    assert ctx.wrap_llm_call(lambda: None) is Decision.HALT


def test_g5_one_timer_thread_for_many_contexts() -> None:
    from veronica_otel._timer import timer_thread_count

    contexts = [ExecutionContext(ExecutionConfig(timeout_ms=60_000)) for _ in range(200)]
    assert timer_thread_count() == 1
    assert len(contexts) == 200


def test_g5_cancel_stops_chain_and_children() -> None:
    parent = ExecutionContext()
    child = parent.spawn_child()
    parent.cancel()
    assert parent.wrap_llm_call(lambda: None) is Decision.HALT
    assert child.wrap_llm_call(lambda: None) is Decision.HALT
    assert child.cancellation.cancelled


# -- G6 invalid configuration --------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_cost_usd": float("nan")},
        {"max_cost_usd": float("inf")},
        {"max_cost_usd": -0.01},
        {"max_steps": True},
        {"max_steps": "10"},
        {"timeout_ms": -1},
        {"max_repeats": 0},
    ],
)
def test_g6_invalid_config_cannot_be_built(kwargs: dict[str, object]) -> None:
    with pytest.raises((ValueError, TypeError), match=next(iter(kwargs))):
        ExecutionConfig(**kwargs)  # type: ignore[arg-type]


# -- G7 tokens, G8 repeats, G9 depth ------------------------------------------------


def test_g7_tokens_exact_under_threads() -> None:
    calls = Counter()
    ctx = ExecutionContext(ExecutionConfig(max_tokens=100))
    opts = WrapOptions(input_tokens=10, max_tokens=20)  # 30 tokens reserved per call
    run_threads(THREADS, lambda: [ctx.wrap_llm_call(calls, opts) for _ in range(10)])
    assert calls.n == 3
    assert ctx.snapshot().tokens == 90


def test_g7_reported_tokens_are_committed() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_tokens=100))
    opts = WrapOptions(input_tokens=10, max_tokens=10)  # reserves 20, uses 10

    def small() -> None:
        ctx.record_usage(input_tokens=8, output_tokens=2)

    for _ in range(9):
        assert ctx.wrap_llm_call(small, opts) is Decision.ALLOW
    assert ctx.snapshot().tokens == 90
    assert ctx.wrap_llm_call(small, WrapOptions(input_tokens=10)) is Decision.ALLOW
    assert ctx.snapshot().tokens == 100
    assert ctx.wrap_llm_call(small, WrapOptions(input_tokens=1)) is Decision.HALT


def test_g8_repeats_exact_under_threads() -> None:
    calls = Counter()
    ctx = ExecutionContext(ExecutionConfig(max_repeats=5))
    same = WrapOptions(signature="search:weather in Paris")
    run_threads(THREADS, lambda: [ctx.wrap_tool_call(calls, same) for _ in range(5)])
    assert calls.n == 5
    assert ctx.trip is not None and ctx.trip.reason == "loop"


def test_g8_distinct_signatures_do_not_trip() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_repeats=2))
    for i in range(100):
        assert ctx.wrap_tool_call(lambda: None, WrapOptions(signature=f"q{i}")) is Decision.ALLOW


def test_g9_depth_limit() -> None:
    root = ExecutionContext(ExecutionConfig(max_depth=2))
    child = root.spawn_child()
    grandchild = child.spawn_child()
    assert grandchild.depth == 2
    with pytest.raises(BudgetExceededError) as info:
        grandchild.spawn_child()
    assert info.value.reason == "depth"
    assert info.value.limit == 2 and info.value.observed == 3


def test_g9_joined_depth_over_limit_is_denied() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_depth=3), _depth=4)
    assert ctx.wrap_llm_call(lambda: None) is Decision.HALT
    assert ctx.trip is not None and ctx.trip.reason == "depth"


# -- sticky trips, children ------------------------------------------------------------


def test_trips_are_sticky_even_when_budget_frees_up() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=0.1, max_steps=100))
    assert ctx.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.2)) is Decision.HALT
    # a call that would fit is still denied: no timed or implicit reset
    assert ctx.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.01)) is Decision.HALT
    assert ctx.snapshot().steps == 0


def test_child_spending_counts_in_parent_and_is_carved() -> None:
    parent = ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=10))
    parent.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.7))
    child = parent.spawn_child(ExecutionConfig(max_cost_usd=5.0))
    assert child.config.max_cost_usd == pytest.approx(0.3)  # carved from what is left
    assert child.config.max_steps == 9
    assert child.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.2)) is Decision.ALLOW
    assert parent.snapshot().cost_usd == pytest.approx(0.9)
    assert parent.snapshot().steps == 2
    # the parent spends the rest; the child's own ceiling (0.3) is not what stops it
    parent.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.1))
    assert child.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.05)) is Decision.HALT


def test_child_never_spends_more_than_parent_has_left_under_threads() -> None:
    parent = ExecutionContext(ExecutionConfig(max_cost_usd=1.0))
    children = [parent.spawn_child(ExecutionConfig(max_cost_usd=1.0)) for _ in range(THREADS)]
    calls = Counter()
    opts = WrapOptions(cost_estimate_hint=0.01)
    lock = threading.Lock()
    queue = list(children)

    def work() -> None:
        with lock:
            child = queue.pop()
        for _ in range(100):
            child.wrap_llm_call(calls, opts)

    run_threads(THREADS, work)
    assert calls.n == 100
    assert parent.snapshot().cost_usd == pytest.approx(1.0)


def test_parent_trip_stops_children_child_trip_does_not_stop_parent() -> None:
    parent = ExecutionContext(ExecutionConfig(max_steps=5))
    child = parent.spawn_child(ExecutionConfig(max_steps=1))
    assert child.wrap_llm_call(lambda: None) is Decision.ALLOW
    assert child.wrap_llm_call(lambda: None) is Decision.HALT  # the child's own ceiling
    assert parent.wrap_llm_call(lambda: None) is Decision.ALLOW  # parent unaffected
    sibling = parent.spawn_child()
    parent.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0))
    for _ in range(5):
        parent.wrap_llm_call(lambda: None)
    assert parent.aborted
    assert sibling.aborted
    assert sibling.wrap_llm_call(lambda: None) is Decision.HALT


# -- bounded memory, no-SDK enforcement ---------------------------------------------------


def test_memory_per_chain_is_bounded() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1e6, max_repeats=3, max_steps=10**9))
    opts = [WrapOptions(cost_estimate_hint=1e-6, signature=f"s{i}") for i in range(50_000)]
    for o in opts[:1000]:  # warm caches and the signature table
        ctx.wrap_llm_call(lambda: None, o)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for o in opts[1000:]:
        ctx.wrap_llm_call(lambda: None, o)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    growth = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert ctx.snapshot().steps == 50_000
    assert growth < 2 * 1024 * 1024


def test_finished_chains_leave_the_local_ledger() -> None:
    ledger = LocalLedger()
    for _ in range(100):
        with ExecutionContext(ExecutionConfig(max_steps=3), ledger=ledger) as ctx:
            ctx.wrap_llm_call(lambda: None)
        del ctx
    assert len(ledger) == 0


def test_enforcement_without_any_sdk() -> None:
    """No TracerProvider, no exporter: still contained (fresh interpreter)."""
    code = (
        "from opentelemetry import trace\n"
        "from veronica_otel import ExecutionConfig, ExecutionContext, Decision\n"
        "assert type(trace.get_tracer_provider()).__name__ == 'ProxyTracerProvider'\n"
        "with ExecutionContext(ExecutionConfig(max_steps=3)) as ctx:\n"
        "    r = [ctx.wrap_llm_call(lambda: None) for _ in range(5)]\n"
        "assert r.count(Decision.ALLOW) == 3, r\n"
        "print('contained')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "contained"
