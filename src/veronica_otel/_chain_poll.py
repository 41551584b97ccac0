"""Trips reaching work in flight: a stream's per-chunk check and its shared-store reads.

The part of :class:`~veronica_otel.ExecutionContext` behind ``ensure_active``:
it reads the chain's state and denies through its trips record, and keeps its
own store-poll counters.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from ._chain_state import ChainState
from ._chain_trips import ChainTrips
from ._errors import BudgetExceededError, TripEvent

__all__ = ["ChainPolling", "aensure_active", "ensure_active"]

_logger = logging.getLogger("veronica_otel")
# How often ensure_active() (once per stream chunk) reads a shared store for a
# trip made elsewhere: at the first chunk after _STORE_POLL_CHUNKS chunks or
# _STORE_POLL_S seconds since the last read, whichever comes first.
_STORE_POLL_CHUNKS = 16
_STORE_POLL_S = 0.25
# After a failed read, the next one waits this long (time only): a store that
# hangs stalls a stream by one socket timeout per this interval at most.
_STORE_RETRY_S = 5.0
_monotonic = time.monotonic


class _Front(Protocol):
    """The part of a chain these checks use (so this module does not import the context)."""

    _polling: ChainPolling


def ensure_active(self: _Front, *, poll: bool = True) -> None:
    """Raise BudgetExceededError if the chain has tripped or its deadline passed.

    Streams call this per chunk, so a trip reaches work in flight (G5, G10):

    * In-process (a :class:`LocalLedger`): every chunk. A stream is cut at
      its next chunk after the deadline, a cancellation, or a trip of this
      chain or any ancestor, wherever in the process it happened (a few
      attribute reads: no lock, no allocation).
    * A shared store (Redis/Valkey): this process's own trips of the chain
      and its ancestors every chunk as above; a trip made in another
      process is read from the store at the first chunk after 16 chunks
      or 250 ms since the last read (``_STORE_POLL_CHUNKS``,
      ``_STORE_POLL_S``; one ``snapshot`` a level of the path). A store
      that cannot be read then does not cut the stream (it is already
      paid for; the next call fails closed on its reservation): the
      failure is logged once, and the store is read again only every
      5 s (``_STORE_RETRY_S``) until it answers.

    ``poll=False`` leaves the store read to :func:`aensure_active` (an
    async stream's own check, which awaits it).
    """
    polling = self._polling
    if polling.due() and poll:
        polling.read_store()


async def aensure_active(self: _Front) -> None:
    """:func:`ensure_active` for async streams: a due store read is awaited."""
    polling = self._polling
    if polling.due():
        await polling.aread_store()


class ChainPolling:
    """What :func:`ensure_active` checks, and its store reads."""

    __slots__ = (
        "_aledger",
        "_deadline",
        "_ledger",
        "_live",
        "_parent",
        "_path",
        "_poll_ok",
        "_polled_at",
        "_state",
        "_token",
        "_trips",
        "_unpolled",
    )

    def __init__(self, state: ChainState, trips: ChainTrips) -> None:
        self._state = state
        self._trips = trips
        # Fixed when the chain is made: read here without a hop through the state.
        self._ledger = state.ledger
        self._aledger = state.aledger
        self._path = state.path
        self._deadline = state.deadline
        self._token = state.token
        self._live = state.live
        self._parent = state.parent
        # A store-backed chain polls for trips made elsewhere: chunks since, time, last ok.
        self._unpolled, self._polled_at, self._poll_ok = 0, state.started, True

    async def aread_store(self) -> None:
        """:meth:`read_store` awaiting a shared store (``aensure_active``)."""
        if self._aledger is None:
            self.read_store()
            return
        self._polled()
        try:
            trips = [(await self._aledger.asnapshot(lv.chain_id)).trip for lv in self._path]
        except Exception:
            self._poll_failed()
            return
        self._poll_read(trips)

    def due(self) -> bool:
        """The checks of :func:`ensure_active`; True when the store is due a read."""
        state = self._state
        trip = state.trip
        if trip is not None and not self._trips.trip_lifted():
            raise BudgetExceededError(trip)
        if (self._deadline is not None and _monotonic() >= self._deadline) or (
            self._token.cancelled
        ):
            self._trips.deny_timeout()
        live = self._live
        if live is not None:
            trip = live[0].trip  # the root level: a root chain's only one, no loop
            if trip is None and self._parent is not None:
                for level in live:
                    trip = level.trip
                    if trip is not None:
                        break
            if trip is not None:
                self._trips.tripped(trip)
            return False
        parent = self._parent
        while parent is not None:
            if parent.trip is not None:
                self._trips.tripped(parent.trip)
            parent = parent.parent
        self._unpolled += 1
        polled_at = self._polled_at
        return self._unpolled >= _STORE_POLL_CHUNKS or _monotonic() - polled_at >= _STORE_POLL_S

    def read_store(self) -> None:
        """Read the path's trips from the shared store (see :func:`ensure_active`)."""
        self._polled()
        try:
            trips = [self._ledger.snapshot(level.chain_id).trip for level in self._path]
        except Exception:
            self._poll_failed()
            return
        self._poll_read(trips)

    def _polled(self) -> None:
        self._unpolled = 0
        self._polled_at = _monotonic()

    def _poll_failed(self) -> None:
        if self._poll_ok:  # once per outage, not once per poll
            _logger.warning(
                "chain %s: could not read the store for trips while a call is in "
                "flight; the call goes on, the next one is checked when it starts",
                self._state.chain_id,
                exc_info=True,
            )
        self._poll_ok = False
        self._unpolled = -(1 << 62)  # chunks alone no longer trigger a read
        self._polled_at += _STORE_RETRY_S - _STORE_POLL_S

    def _poll_read(self, trips: list[TripEvent | None]) -> None:
        self._poll_ok = True
        for trip in trips:
            if trip is not None:
                self._trips.tripped(trip)
