"""What a process forked with ``os.fork`` (or multiprocessing's fork start) inherits.

A child gets a copy of the parent's memory, in-process ledgers included. A
copy of a chain is a second budget: a parent at $0.50 of $1 and three
children could each spend the remaining $0.50. So, in the child:

- every chain inherited on an in-process :class:`~veronica_otel.LocalLedger`
  is tripped (sticky, reason ``cost``, the message says why and points to
  the Redis ledger), so it can never be spent twice;
- the process default chain (zero code, ``VERONICA_*``) is per process: the
  child builds a fresh one with the same limits. To share one budget across
  processes, use the shared ledger (``VERONICA_REDIS_URL``): chains on it are
  counted atomically by the store and go on working in the child;
- locks that a thread of the parent may have held at the fork are made anew
  (the ledgers', the price table's, the tool prices', the policy file's),
  since that thread does not exist in the child to release them.

Nothing here runs on the hot path: only ``os.register_at_fork``'s child hook.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

# Imported first so that its own at-fork reset (a new timer thread) runs
# before ours, which may schedule the new default chain's deadline.
from . import _timer  # noqa: F401

__all__ = ["FORK_MESSAGE", "on_fork_in_child", "remake_locks_after_fork", "track_ledger"]

FORK_MESSAGE = (
    "chain {chain_id} was inherited across os.fork() on an in-process ledger: the child "
    "process (pid {pid}) would get a second copy of its budget, so the chain is stopped "
    "here; use veronica_otel.distributed.RedisLedger (VERONICA_REDIS_URL) to share a "
    "chain between processes"
)

# LocalLedger instances (each has after_fork_in_child()).
_ledgers: weakref.WeakSet[Any] = weakref.WeakSet()
# object -> names of its lock attributes, re-made in the child.
_locks: weakref.WeakKeyDictionary[Any, tuple[str, ...]] = weakref.WeakKeyDictionary()


def track_ledger(ledger: Any) -> None:
    """Have the child trip ``ledger``'s inherited chains and re-make its lock."""
    _ledgers.add(ledger)


def remake_locks_after_fork(owner: Any, *names: str) -> None:
    """Give ``owner`` a new ``threading.Lock`` in each attribute ``names`` in a forked child.

    ``owner`` may be a module (its global locks).
    """
    _locks[owner] = names or ("_lock",)


# Hooks of the modules that own chains (the default chain's renewal), run after
# every lock is made anew. They register themselves, so this module, which sits
# under the ledger, imports none of them.
_child_hooks: list[Callable[[], None]] = []


def on_fork_in_child(hook: Callable[[], None]) -> None:
    """Run ``hook`` in a forked child, after the locks and the ledgers are made anew."""
    _child_hooks.append(hook)


def _after_fork_in_child() -> None:
    # Locks first: everything below takes them.
    for owner, names in list(_locks.items()):
        for name in names:
            setattr(owner, name, threading.Lock())
    pid = os.getpid()
    for ledger in list(_ledgers):
        ledger.after_fork_in_child(pid)
    for hook in _child_hooks:
        hook()


os.register_at_fork(after_in_child=_after_fork_in_child)
