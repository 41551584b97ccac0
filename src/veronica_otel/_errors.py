"""The one exception every trip raises, and the record of a trip.

Exception tree::

    Exception
     └── BudgetExceededError   (reason: cost | steps | retries | timeout | tokens
                                | circuit_open | loop | depth)

A denial is raised on purpose, as this type, before a call is sent. Errors
raised by the user's own code are never wrapped in it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["REASONS", "BudgetExceededError", "TripEvent", "TripReason"]

TripReason = Literal[
    "cost", "steps", "retries", "timeout", "tokens", "circuit_open", "loop", "depth"
]
REASONS: frozenset[str] = frozenset(
    ("cost", "steps", "retries", "timeout", "tokens", "circuit_open", "loop", "depth")
)


@dataclass(frozen=True, slots=True)
class TripEvent:
    """Why a chain stopped.

    Attributes:
        reason: Which ceiling was hit.
        limit: The ceiling (USD for ``cost``, milliseconds for ``timeout``,
            a count otherwise).
        observed: The value the chain would have reached (or did reach).
        chain_id: The chain that tripped.
        message: A sentence a person can act on.
        time: Wall-clock time of the trip (``time.time()``).
        sticky: ``False`` for a denial caused only by other calls' in-flight
            reservations (the call would fit against committed spend alone):
            it is raised, but the chain is not stopped and later calls are
            checked afresh. Every trip that stops the chain is sticky.
        pool: The :class:`BudgetPool` whose limit denied the call, or None.
            A pool never trips: later chains run once its window frees room.
        agent: The agent (``agent(name, config=...)``) whose own limits denied
            the call, or None. Only that agent is stopped; the chain goes on.
        retry_after_s: For a denial by a windowed pool, the seconds until the
            window will have freed enough for the call; None otherwise.
    """

    reason: TripReason
    limit: float
    observed: float
    chain_id: str
    message: str = ""
    time: float = field(default_factory=time.time)
    sticky: bool = True
    pool: str | None = None
    agent: str | None = None
    retry_after_s: float | None = None


class BudgetExceededError(Exception):
    """Raised instead of sending a call that a chain's limits do not allow.

    Attributes:
        trip: The :class:`TripEvent` that denied the call: the chain's sticky
            trip, or a non-sticky denial (``trip.sticky`` is False) when only
            other calls' in-flight reservations left no room.
        reason: Shortcut for ``trip.reason``.
        limit: Shortcut for ``trip.limit``.
        observed: Shortcut for ``trip.observed``.
        chain_id: Shortcut for ``trip.chain_id``.
        pool: Shortcut for ``trip.pool`` (the denying pool's name, or None).
        agent: Shortcut for ``trip.agent`` (the denied agent's name, or None).
        retry_after_s: Shortcut for ``trip.retry_after_s``.
    """

    def __init__(self, trip: TripEvent) -> None:
        self.trip = trip
        super().__init__(trip.message or _default_message(trip))

    @property
    def reason(self) -> TripReason:
        return self.trip.reason

    @property
    def limit(self) -> float:
        return self.trip.limit

    @property
    def observed(self) -> float:
        return self.trip.observed

    @property
    def chain_id(self) -> str:
        return self.trip.chain_id

    @property
    def pool(self) -> str | None:
        return self.trip.pool

    @property
    def agent(self) -> str | None:
        return self.trip.agent

    @property
    def retry_after_s(self) -> float | None:
        return self.trip.retry_after_s

    def __reduce__(self) -> tuple[type[BudgetExceededError], tuple[TripEvent]]:
        return (type(self), (self.trip,))


def _default_message(trip: TripEvent) -> str:
    return (
        f"chain {trip.chain_id} stopped: {trip.reason} limit {trip.limit:g} "
        f"(observed {trip.observed:g})"
    )
