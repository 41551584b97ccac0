"""The shared timer and the trip channel: their failures never reach enforcement."""

from __future__ import annotations

import logging
import multiprocessing
import threading

import pytest

from veronica_otel import Decision, ExecutionConfig, ExecutionContext
from veronica_otel._timer import schedule
from veronica_otel._trips import add_trip_listener, remove_trip_listener


def test_broken_trip_listener_does_not_break_the_denial(caplog: pytest.LogCaptureFixture) -> None:
    seen = []

    def broken(trip: object, span: object) -> None:
        raise RuntimeError("sink down")

    def recording(trip: object, span: object) -> None:
        seen.append(trip)

    add_trip_listener(broken)
    add_trip_listener(recording)
    try:
        ctx = ExecutionContext(ExecutionConfig(max_steps=0))
        with caplog.at_level(logging.ERROR):
            assert ctx.wrap_llm_call(lambda: None) is Decision.HALT
    finally:
        remove_trip_listener(broken)
        remove_trip_listener(recording)
    assert len(seen) == 1  # the second listener still ran
    assert "trip listener" in caplog.text


def test_trip_line_on_the_trips_logger(caplog: pytest.LogCaptureFixture) -> None:
    ctx = ExecutionContext(ExecutionConfig(max_steps=0), chain_id="log-me")
    with caplog.at_level(logging.WARNING, logger="veronica_otel.trips"):
        ctx.wrap_llm_call(lambda: None)
    records = [r for r in caplog.records if r.name == "veronica_otel.trips"]
    assert len(records) == 1
    assert "chain=log-me" in records[0].getMessage()
    assert "reason=steps" in records[0].getMessage()


def test_timer_fires_in_order_and_cancelled_ones_do_not() -> None:
    import time

    fired: list[str] = []
    done = threading.Event()
    now = time.monotonic()
    schedule(now + 0.02, lambda: fired.append("b"))
    cancelled = schedule(now + 0.01, lambda: fired.append("cancelled"))
    schedule(now + 0.005, lambda: fired.append("a"))
    schedule(now + 0.03, done.set)
    cancelled.cancel()
    assert done.wait(10)
    assert fired == ["a", "b"]


def _child_schedules(queue: multiprocessing.Queue[bool]) -> None:
    import time

    done = threading.Event()
    schedule(time.monotonic() + 0.01, done.set)
    queue.put(done.wait(10))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_timer_works_after_fork() -> None:
    import time

    schedule(time.monotonic() + 3600, lambda: None)  # the parent's thread exists
    mp = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[bool] = mp.Queue()
    proc = mp.Process(target=_child_schedules, args=(queue,))
    proc.start()
    assert queue.get(timeout=30) is True
    proc.join(30)
    assert proc.exitcode == 0
