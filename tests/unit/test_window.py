"""The rolling window against a plain reference: a list of timestamped amounts.

An amount added at ``t`` must count while ``now < t + window`` (never dropped
early) and no longer than one bucket past that (the resolution); memory stays
within the bucket count; ``retry_after_s`` names the moment enough is freed,
not a microsecond later than the bucket that frees it, never earlier.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests._clock import FakeClock
from veronica_otel._window import LifetimeCounter, RollingWindow, check_window

WINDOWS = st.sampled_from([1.0, 2.0, 7.5, 60.0, 3600.0, 86400.0])


def steps_for(window: float) -> st.SearchStrategy[tuple[float, int]]:
    """(advance the clock by, then add) pairs; times land on and beside bucket edges."""
    bucket = window / 60
    dt = st.one_of(
        st.sampled_from([0.0, 1e-9, bucket / 3, bucket, window / 2, window - bucket / 2]),
        st.sampled_from([window, window + bucket]),
        st.floats(min_value=0.0, max_value=2 * window, allow_nan=False),
    )
    amount = st.one_of(st.integers(0, 10), st.integers(0, 10**15))
    return st.tuples(dt, amount)


def reference(spent: list[tuple[float, int]], now: float, window: float) -> int:
    return sum(amount for t, amount in spent if now < t + window)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), window=WINDOWS, start=st.floats(0.0, 1e6, allow_nan=False))
def test_window_counts_like_the_reference_within_one_bucket(
    data: st.DataObject, window: float, start: float
) -> None:
    clock = FakeClock(start)
    counter = RollingWindow(window, clock=clock)
    bucket = counter.bucket_s
    spent: list[tuple[float, int]] = []
    for dt, amount in data.draw(st.lists(steps_for(window), max_size=80)):
        clock.advance(dt)
        counter.add(amount)
        spent.append((clock.now, amount))
        total = counter.total()
        exact = reference(spent, clock.now, window)
        # Never early: everything the reference still counts is counted ...
        assert total >= exact
        # ... and nothing longer than one bucket past its window.
        assert total <= reference(spent, clock.now, window + bucket * (1 + 1e-9))
        assert len(counter) <= window / bucket + 2  # memory: the bucket count
    # Once the whole window has passed, all of it is gone.
    clock.advance(window + bucket)
    assert counter.total() == 0
    assert len(counter) == 0


@settings(max_examples=300, deadline=None)
@given(data=st.data(), window=WINDOWS)
def test_retry_after_is_when_enough_is_freed(data: st.DataObject, window: float) -> None:
    clock = FakeClock(1000.0)
    counter = RollingWindow(window, clock=clock)
    for dt, amount in data.draw(st.lists(steps_for(window), min_size=1, max_size=40)):
        clock.advance(dt)
        counter.add(amount)
    total = counter.total()
    needed = data.draw(st.integers(-5, total + 5))
    after = counter.retry_after_s(needed)
    now = clock.now
    if needed <= 0:
        assert after == 0.0
        return
    if needed > total:
        assert after is None  # emptying the window would not free that much
        return
    assert after is not None and after >= 0
    if after > 2e-6:
        clock.now = now + after - 2e-6  # a moment before: not freed yet
        assert total - counter.total() < needed
    clock.now = now + after  # exactly then: freed
    assert total - counter.total() >= needed


@settings(max_examples=200, deadline=None)
@given(data=st.data(), first=WINDOWS, second=WINDOWS)
def test_rebucketing_to_a_new_window_never_forgets_early(
    data: st.DataObject, first: float, second: float
) -> None:
    clock = FakeClock(50.0)
    counter = RollingWindow(first, clock=clock)
    spent: list[tuple[float, int]] = []
    for dt, amount in data.draw(st.lists(steps_for(first), max_size=40)):
        clock.advance(dt)
        counter.add(amount)
        spent.append((clock.now, amount))
    # What the old window forgot is gone; the rest keeps its times.
    kept = [(t, a) for t, a in spent if clock.now < t + first + counter.bucket_s * (1 + 1e-9)]
    must_keep = [(t, a) for t, a in spent if clock.now < t + first]
    moved = counter.rebucket(second)
    slack = (counter.bucket_s + moved.bucket_s) * (1 + 1e-9)
    for dt in data.draw(st.lists(st.floats(0.0, 2 * second, allow_nan=False), max_size=10)):
        clock.advance(dt)
        total = moved.total()
        assert total >= reference(must_keep, clock.now, second)
        assert total <= reference(kept, clock.now, second + slack)
        assert len(moved) <= second / moved.bucket_s + 2


def test_a_bucket_goes_with_its_newest_amount() -> None:
    clock = FakeClock(0.0)
    counter = RollingWindow(60.0, clock=clock)  # buckets of 1 s
    counter.add(5)
    clock.advance(0.9)
    counter.add(7)  # same bucket as the 5
    clock.advance(59.0)  # t = 59.9: the 5 is 59.9 s old, the 7 is 59 s old
    assert counter.total() == 12
    clock.now = 60.0  # the 5 is exactly a window old; it shares a bucket with the 7
    assert counter.total() == 12  # kept with the 7 (never drop the 7 early)
    assert counter.retry_after_s(12) == pytest.approx(0.9)
    clock.now = 60.9
    assert counter.total() == 0


def test_many_adds_keep_memory_bounded() -> None:
    clock = FakeClock(0.0)
    counter = RollingWindow(2.0, clock=clock)
    for _ in range(100_000):
        clock.advance(0.0007)
        counter.add(1)
    assert len(counter) <= 62
    # Exactly the adds of the last 2 s count (within one bucket of 1/30 s).
    assert 2.0 / 0.0007 - 1 <= counter.total() <= (2.0 + 1 / 30) / 0.0007 + 1


def test_a_clock_that_steps_back_never_frees_early() -> None:
    clock = FakeClock(100.0)
    counter = RollingWindow(10.0, clock=clock)
    counter.add(3)
    clock.now = 95.0  # an injected clock stepped back: folded into the newest bucket
    counter.add(4)
    clock.now = 109.99
    assert counter.total() == 7
    clock.now = 110.0
    assert counter.total() == 0


def test_lifetime_counter_never_frees() -> None:
    counter = LifetimeCounter()
    counter.add(5)
    counter.add(0)
    assert counter.total() == 5
    assert counter.retry_after_s(1) is None
    assert counter.retry_after_s(0) == 0.0


@pytest.mark.parametrize(
    ("window", "bucket", "error"),
    [
        (0, None, ValueError),
        (-1.0, None, ValueError),
        (math.nan, None, ValueError),
        (math.inf, None, ValueError),
        (0.5, None, ValueError),
        (367 * 86400.0, None, ValueError),
        (True, None, TypeError),
        ("60", None, TypeError),
        (60.0, 2.0, ValueError),  # coarser than 1/60 of the window
        (60.0, 0.0, ValueError),
        (60.0, math.nan, ValueError),
        (60.0, False, TypeError),
    ],
)
def test_bad_windows_are_refused(window: object, bucket: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"window|bucket_s"):
        check_window(window, bucket)  # type: ignore[arg-type]


def test_default_bucket_is_a_sixtieth() -> None:
    assert check_window(3600) == (3600.0, 60.0)
    assert check_window(60.0, 0.5) == (60.0, 0.5)


@settings(max_examples=200, deadline=None)
@given(
    plan=st.lists(
        st.tuples(
            st.sampled_from([60.0, 3600.0, 86400.0]),  # the window of the next call
            st.floats(0.0, 30_000.0, allow_nan=False),  # time before it
            st.integers(1, 9),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_window_changes_back_and_forth_never_drop_spend(
    plan: list[tuple[float, float, int]],
) -> None:
    """A pool named with 1d, then 1h, then 1d again (issue 22): at every
    point, an amount counts while it is younger than both the window it was
    spent under and the window now (a shorter window in between frees nothing
    for the longer one)."""
    clock = FakeClock(1000.0)
    counter = RollingWindow(plan[0][0], clock=clock)
    spent: list[tuple[float, int, float]] = []
    for window, dt, amount in plan:
        clock.advance(dt)
        if window != counter.window_s:
            counter = counter.rebucket(window)
        counter.add(amount)
        spent.append((clock.now, amount, window))
        owed = sum(a for t, a, w in spent if clock.now < t + min(w, window))
        assert counter.total() >= owed
