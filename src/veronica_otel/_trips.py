"""The trip channel: where a denial is announced, apart from ordinary errors.

Every trip becomes a line on the ``veronica_otel.trips`` logger, an
OpenTelemetry log record, a ``veronica.trips`` count and, when a span is
recording, a ``veronica.trip`` span event with an error status.
Exporters add their own sinks with :func:`add_trip_listener`. Nothing here
may raise into the caller: a broken sink is logged and skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from ._attributes import (
    AGENT,
    CHAIN_ID,
    POOL,
    TRIP_EVENT,
    TRIP_LIMIT,
    TRIP_OBSERVED,
    TRIP_REASON,
    TRIP_RETRY_AFTER_S,
)
from ._errors import TripEvent
from ._telemetry import record_trip

__all__ = ["add_trip_listener", "emit_trip", "remove_trip_listener", "trip_attributes"]

trip_logger = logging.getLogger("veronica_otel.trips")
_logger = logging.getLogger(__name__)

TripListener = Callable[[TripEvent, Span], None]
_listeners: list[TripListener] = []


def add_trip_listener(listener: TripListener) -> None:
    """Call ``listener(trip, span)`` for every trip (exporters use this)."""
    if listener not in _listeners:
        _listeners.append(listener)


def remove_trip_listener(listener: TripListener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def trip_attributes(trip: TripEvent) -> dict[str, str | float | int]:
    """The ``veronica.trip.*`` attributes describing ``trip``."""
    attributes: dict[str, str | float] = {
        TRIP_REASON: trip.reason,
        TRIP_LIMIT: trip.limit,
        TRIP_OBSERVED: trip.observed,
        CHAIN_ID: trip.chain_id,
    }
    if trip.pool is not None:  # a budget pool denied it
        attributes[POOL] = trip.pool
        if trip.retry_after_s is not None:
            attributes[TRIP_RETRY_AFTER_S] = trip.retry_after_s
    if trip.agent is not None:
        attributes[AGENT] = trip.agent
    return attributes


def emit_trip(
    trip: TripEvent,
    span: Span | None = None,
    remaining: Mapping[str, float | int] | None = None,
) -> None:
    """Announce ``trip`` on the current (or given) span, the log and listeners.

    ``remaining`` (``veronica.remaining.*``, what the chain has left) goes on
    the span event with the trip's own attributes.
    """
    try:
        target = span if span is not None else trace.get_current_span()
        if target.is_recording():
            attributes = trip_attributes(trip)
            if remaining:
                attributes.update(remaining)
            target.add_event(TRIP_EVENT, attributes)
            target.set_status(Status(StatusCode.ERROR, f"veronica trip: {trip.reason}"))
        record_trip(trip)
        trip_logger.warning(
            "trip chain=%s reason=%s limit=%g observed=%g: %s",
            trip.chain_id,
            trip.reason,
            trip.limit,
            trip.observed,
            trip.message,
        )
    except Exception:
        _logger.exception("announcing a trip failed; enforcement is unaffected")
        return
    for listener in tuple(_listeners):
        try:
            listener(trip, target)
        except Exception:
            _logger.exception("trip listener %r failed; enforcement is unaffected", listener)
