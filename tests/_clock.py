"""A clock for tests: they move it by hand, never sleep for a state change."""

from __future__ import annotations

from collections.abc import Callable

import pytest


class FakeClock:
    """Monotonic seconds that only :meth:`advance` moves."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# The kernel modules that read the monotonic clock (ExecutionContext's parts).
CHAIN_CLOCK_MODULES = (
    "veronica_otel._chain_state",
    "veronica_otel._chain_poll",
    "veronica_otel._admission",
)


def patch_chain_clock(monkeypatch: pytest.MonkeyPatch, clock: Callable[[], float]) -> None:
    """Make every chain read ``clock`` for its deadline and elapsed time."""
    for module in CHAIN_CLOCK_MODULES:
        monkeypatch.setattr(f"{module}._monotonic", clock)
