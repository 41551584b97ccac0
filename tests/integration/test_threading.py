"""The chain follows into threads and thread pools, with no ``copy_context`` in user code."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from veronica_otel import (
    BudgetExceededError,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    current_context,
)
from veronica_otel.instrumentors.threading import ThreadingInstrumentor

STEP = WrapOptions(operation_name="worker step")


@pytest.fixture
def instrumented() -> Iterator[None]:
    ThreadingInstrumentor().instrument()
    yield
    ThreadingInstrumentor().uninstrument()


def step() -> str | None:
    """One contained step in whatever chain is active here; its chain id."""
    ctx = current_context()
    if ctx is None:
        return None
    ctx.begin_call("tool", STEP).finish()
    return ctx.chain_id


@pytest.mark.usefixtures("instrumented")
def test_chain_follows_into_pool_workers_and_threads_with_exact_counts() -> None:
    class Worker(threading.Thread):  # overrides run(): followed too
        def run(self) -> None:
            self.seen = step()

    seen: list[str | None] = []
    with ExecutionContext(ExecutionConfig(max_steps=10)) as ctx:
        with ThreadPoolExecutor(max_workers=3) as pool:
            seen.extend(pool.map(lambda _: step(), range(4)))
            seen.append(pool.submit(step).result())
        thread = threading.Thread(target=lambda: seen.append(step()))
        thread.start()
        thread.join()
        worker = Worker()
        worker.start()
        worker.join()
        seen.append(worker.seen)
        assert seen == [ctx.chain_id] * 7
        assert ctx.snapshot().steps == 7


@pytest.mark.usefixtures("instrumented")
def test_limits_hold_across_threads() -> None:
    def attempt() -> bool:
        try:
            step()
        except BudgetExceededError:
            return False
        return True

    with ExecutionContext(ExecutionConfig(max_steps=5)) as ctx:
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(lambda _: attempt(), range(8)))
        threads = [threading.Thread(target=attempt) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert results.count(True) == 5
    assert ctx.snapshot().steps == 5


@pytest.mark.usefixtures("instrumented")
def test_each_task_runs_in_the_chain_that_submitted_it() -> None:
    with ThreadPoolExecutor(max_workers=1) as pool:  # one worker serves both chains
        with ExecutionContext(ExecutionConfig(max_steps=3)) as first:
            assert pool.submit(step).result() == first.chain_id
        with ExecutionContext(ExecutionConfig(max_steps=3)) as second:
            assert pool.submit(step).result() == second.chain_id
        assert pool.submit(step).result() is None  # submitted outside any chain
    assert (first.snapshot().steps, second.snapshot().steps) == (1, 1)


def test_without_the_instrumentor_threads_start_outside_the_chain() -> None:
    # In process: tests/conftest.py fails any test that leaves propagation on.
    with ExecutionContext(ExecutionConfig(max_steps=3)) as ctx, ThreadPoolExecutor(1) as pool:
        assert pool.submit(step).result() is None
    assert ctx.snapshot().steps == 0
