"""One shared timer thread for every chain's deadline, and a cancellation token.

A thread per context would cost a thread per agent run; instead one daemon
thread sleeps until the earliest deadline in a heap. Callbacks hold only weak
references to their owners, so a forgotten context is still collected.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable

__all__ = ["CancellationToken", "TimerHandle", "schedule"]

_logger = logging.getLogger(__name__)


class CancellationToken:
    """A one-way flag with callbacks, set when a chain is cancelled or times out."""

    __slots__ = ("_callbacks", "_lock", "cancelled")

    def __init__(self) -> None:
        self.cancelled = False
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def cancel(self) -> bool:
        """Set the flag and run callbacks once. Returns True on the first call."""
        with self._lock:
            if self.cancelled:
                return False
            self.cancelled = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                _logger.exception("cancellation callback failed")
        return True

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on cancellation (at once if already cancelled)."""
        with self._lock:
            if not self.cancelled:
                self._callbacks.append(callback)
                return
        callback()


class TimerHandle:
    """A scheduled deadline; :meth:`cancel` removes it lazily."""

    __slots__ = ("active", "callback", "deadline")

    def __init__(self, deadline: float, callback: Callable[[], None]) -> None:
        self.deadline = deadline
        self.callback = callback
        self.active = True

    def cancel(self) -> None:
        self.active = False


class _SharedTimer:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, TimerHandle]] = []
        self._cond = threading.Condition(threading.Lock())
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def schedule(self, deadline: float, callback: Callable[[], None]) -> TimerHandle:
        handle = TimerHandle(deadline, callback)
        with self._cond:
            heapq.heappush(self._heap, (deadline, next(self._seq), handle))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="veronica-otel-timer", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return handle

    def pending(self) -> int:
        with self._cond:
            return sum(1 for _, _, handle in self._heap if handle.active)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and not self._heap[0][2].active:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                delay = self._heap[0][0] - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                _, _, handle = heapq.heappop(self._heap)
            if handle.active:
                handle.active = False
                try:
                    handle.callback()
                except Exception:
                    _logger.exception("deadline callback failed")


_TIMER = _SharedTimer()


def _reset_after_fork() -> None:
    # The timer thread does not survive fork(); its lock may be held by it.
    global _TIMER
    _TIMER = _SharedTimer()


os.register_at_fork(after_in_child=_reset_after_fork)


def schedule(deadline: float, callback: Callable[[], None]) -> TimerHandle:
    """Call ``callback`` from the shared timer thread at ``deadline`` (monotonic)."""
    return _TIMER.schedule(deadline, callback)


def timer_thread_count() -> int:
    """How many veronica timer threads are alive (one at most)."""
    return sum(1 for t in threading.enumerate() if t.name == "veronica-otel-timer")
