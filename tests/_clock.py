"""A clock for tests: they move it by hand, never sleep for a state change."""

from __future__ import annotations


class FakeClock:
    """Monotonic seconds that only :meth:`advance` moves."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
