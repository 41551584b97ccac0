"""What a ledger is told about a call's path: each level's limits, in ledger units.

A leaf: the ledger and its pool accounts both read these (``_ledger`` re-exports them).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GRANT_MARK", "Level", "Limits", "PoolLevel"]

# Between a caller's chain id and a grant's nonce in the id of the request
# chain a service joins under that grant; no user-given chain id holds "/"
# (see distributed/_keys.py: the kinds of ids are disjoint by construction).
GRANT_MARK = ":grant/"


@dataclass(frozen=True, slots=True)
class Limits:
    """One chain's ceilings in ledger units (nano-USD, counts); None = unlimited."""

    cost_nano: int | None = None
    steps: int | None = None
    retries: int | None = None
    tokens: int | None = None
    repeats: int | None = None


@dataclass(frozen=True, slots=True)
class Level:
    """One chain on a call's path: its id and its limits."""

    chain_id: str
    limits: Limits


@dataclass(frozen=True, slots=True)
class PoolLevel:
    """One budget pool a call is also reserved in (see ``BudgetPool``).

    ``window_s`` None is a lifetime budget; else spend counts for
    ``window_s`` seconds after it was committed, kept in buckets of
    ``bucket_s`` (at most 1/60 of the window). Only ``cost_nano``, ``steps``
    and ``tokens`` of ``limits`` apply to a pool.
    """

    name: str
    limits: Limits
    window_s: float | None = None
    bucket_s: float | None = None
