"""One ExecutionContext entered in several threads or tasks at once, or re-entered.

Each entry keeps its own OpenTelemetry token, so each exit detaches its own:
after every exit no thread is left inside the chain and OpenTelemetry logs no
"Failed to detach context".
"""

from __future__ import annotations

import _thread
import asyncio
import logging
import threading

import pytest

from veronica_otel import ExecutionConfig, ExecutionContext, current_context

_DETACH_FAILED = "Failed to detach context"


def _detach_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if _DETACH_FAILED in r.getMessage()]


@pytest.mark.parametrize("first_out", ["first_in", "last_in"])
def test_two_threads_inside_one_context_each_leave_it(
    caplog: pytest.LogCaptureFixture, first_out: str
) -> None:
    ctx = ExecutionContext(ExecutionConfig(max_steps=10))
    entered = threading.Barrier(2)
    order = threading.Barrier(2)
    after: dict[str, object] = {}
    inside: dict[str, object] = {}
    errors: list[BaseException] = []

    def worker(name: str, leaves_first: bool) -> None:
        try:
            with ctx:
                inside[name] = current_context()
                entered.wait(timeout=10)  # both are inside now
                if not leaves_first:
                    order.wait(timeout=10)  # let the other one leave first
            if leaves_first:
                order.wait(timeout=10)
            after[name] = current_context()
        except BaseException as exc:  # reported to the test thread
            errors.append(exc)

    # "a" enters first (it is started first and waits on the barrier inside).
    caplog.set_level(logging.ERROR, logger="opentelemetry.context")
    a = threading.Thread(target=worker, args=("a", first_out == "first_in"))
    b = threading.Thread(target=worker, args=("b", first_out != "first_in"))
    a.start()
    b.start()
    a.join(timeout=30)
    b.join(timeout=30)
    assert not errors
    assert inside == {"a": ctx, "b": ctx}
    assert after == {"a": None, "b": None}
    assert _detach_errors(caplog) == []
    assert current_context() is None


def test_re_entered_in_one_thread_nests(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="opentelemetry.context")
    outer = ExecutionContext(detached=True)
    other = ExecutionContext(detached=True)
    with outer:
        with other:
            with outer:
                assert current_context() is outer
            assert current_context() is other
        assert current_context() is outer
    assert current_context() is None
    assert _detach_errors(caplog) == []


@pytest.mark.asyncio
async def test_tasks_entering_one_context_at_once_each_leave_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="opentelemetry.context")
    ctx = ExecutionContext()
    both_in = asyncio.Barrier(2)
    first_left = asyncio.Event()

    async def task(leaves_first: bool) -> object:
        async with ctx:
            await both_in.wait()
            if not leaves_first:
                await first_left.wait()
        if leaves_first:
            first_left.set()
        return current_context()

    assert await asyncio.gather(task(True), task(False)) == [None, None]
    assert _detach_errors(caplog) == []


def test_exit_in_another_thread_is_reported_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ctx = ExecutionContext()
    ctx.__enter__()
    done: list[object] = []
    finished = threading.Event()

    def leave() -> None:
        try:
            ctx.__exit__(None, None, None)
            done.append(current_context())
        finally:
            finished.set()

    try:
        with caplog.at_level(logging.WARNING, logger="veronica_otel"):
            # A bare OS thread: it starts with an empty context whether or not
            # an instrumentor carries contexts into threading.Thread.
            _thread.start_new_thread(leave, ())
            assert finished.wait(timeout=10)
        assert done == [None]
        assert any("not entered in" in r.getMessage() for r in caplog.records)
        # The entry made here is still attached here; leaving here detaches it.
        assert current_context() is ctx
    finally:
        ctx.__exit__(None, None, None)
    assert current_context() is None
