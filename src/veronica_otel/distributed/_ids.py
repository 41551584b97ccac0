"""Reservation ids: unique across processes, forks and restarts of a client.

An id is a random per-process prefix and a counter. A forked child takes a
new prefix and counter at once, so parent and child never hand out the same
id (a reply or a commit could otherwise settle the other's reservation).
"""

from __future__ import annotations

import itertools
import os

__all__ = ["new_id"]


def _new_process_token() -> str:
    return os.urandom(6).hex() + "-"


_process_token = _new_process_token()
_ids = itertools.count(1)


def _after_fork() -> None:
    global _process_token, _ids
    _process_token = _new_process_token()
    _ids = itertools.count(1)


os.register_at_fork(after_in_child=_after_fork)


def new_id() -> str:
    """A reservation id no other process or fork of this one hands out."""
    return f"{_process_token}{next(_ids):x}"
