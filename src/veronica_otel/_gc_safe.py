"""Work that garbage collection triggers, run where taking a lock is safe.

Finalisers (``weakref.finalize`` callbacks, ``__del__``) run inside whatever
code allocated when the cyclic collector fired: possibly while this very
thread holds the ledger's lock, where settling a call or dropping a chain
would take that lock again and deadlock. So finalisers only queue their work
here (``deque.append`` is atomic and takes no lock), and the queue is drained
where no lock is held: before each call's check, on ``snapshot()`` and when
a chain is created.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["defer", "drain", "pending"]

_logger = logging.getLogger("veronica_otel")
pending: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()


def defer(fn: Callable[..., Any], *args: Any) -> None:
    """Queue ``fn(*args)``: safe to call from a finaliser."""
    pending.append((fn, args))


def drain() -> None:
    """Run the queued work (call only where no veronica lock is held)."""
    while pending:
        try:
            fn, args = pending.popleft()
        except IndexError:  # another thread took the last one
            return
        try:
            fn(*args)
        except Exception:
            _logger.exception("deferred clean-up %r failed", fn)
