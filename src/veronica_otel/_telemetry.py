"""Trip and call telemetry through the OpenTelemetry API: metrics and log records.

Metrics: ``veronica.trips`` (by reason), ``veronica.calls`` and
``veronica.cost_usd`` (by kind and decision), and the gauges
``veronica.reserved_usd`` / ``veronica.remaining_usd`` observed from live
chains. Trips also become an OpenTelemetry log record. With no SDK configured
every instrument is a no-op proxy; nothing here can raise into a caller.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING

from opentelemetry import _logs, metrics
from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.metrics import CallbackOptions, Observation

from ._errors import TripEvent
from ._version import __version__

if TYPE_CHECKING:
    from ._context import ExecutionContext

__all__ = ["record_call", "record_trip", "track_chain"]

_logger = logging.getLogger(__name__)
_live: weakref.WeakSet[ExecutionContext] = weakref.WeakSet()


def _observe_reserved(options: CallbackOptions) -> Iterable[Observation]:
    for ctx in tuple(_live):
        try:
            yield Observation(ctx.snapshot().reserved_usd, {"veronica.chain.id": ctx.chain_id})
        except Exception:
            _logger.debug("observing reserved_usd failed", exc_info=True)


def _observe_remaining(options: CallbackOptions) -> Iterable[Observation]:
    for ctx in tuple(_live):
        try:
            remaining = ctx.remaining_cost_nano()
            if remaining is not None:
                yield Observation(remaining / 1e9, {"veronica.chain.id": ctx.chain_id})
        except Exception:
            _logger.debug("observing remaining_usd failed", exc_info=True)


_meter = metrics.get_meter("veronica_otel", __version__)
_trips = _meter.create_counter(
    "veronica.trips", unit="{trip}", description="Calls denied by a chain's limits, by reason"
)
_calls = _meter.create_counter(
    "veronica.calls", unit="{call}", description="Contained calls dispatched"
)
_cost = _meter.create_counter(
    "veronica.cost_usd", unit="USD", description="Committed cost of contained calls"
)
_meter.create_observable_gauge(
    "veronica.reserved_usd",
    callbacks=[_observe_reserved],
    unit="USD",
    description="Cost held by calls in flight, per live chain",
)
_meter.create_observable_gauge(
    "veronica.remaining_usd",
    callbacks=[_observe_remaining],
    unit="USD",
    description="What the tightest cost ceiling has left, per live chain",
)
_otel_logger = _logs.get_logger("veronica_otel.trips", __version__)


def track_chain(ctx: ExecutionContext) -> None:
    """Observe ``ctx`` in the gauges while it is alive."""
    try:
        _live.add(ctx)
    except Exception:
        _logger.debug("tracking a chain for gauges failed", exc_info=True)


def record_trip(trip: TripEvent) -> None:
    """Count a trip and emit it as an OpenTelemetry log record."""
    try:
        _trips.add(1, {"veronica.trip.reason": trip.reason})
        _otel_logger.emit(
            LogRecord(
                severity_number=SeverityNumber.WARN,
                severity_text="WARN",
                body=trip.message,
                event_name="veronica.trip",
                attributes={
                    "veronica.trip.reason": trip.reason,
                    "veronica.trip.limit": trip.limit,
                    "veronica.trip.observed": trip.observed,
                    "veronica.chain.id": trip.chain_id,
                },
            )
        )
    except Exception:
        _logger.debug("recording trip telemetry failed", exc_info=True)


def record_call(kind: str, cost_usd: float, failed: bool, model: str | None) -> None:
    """Count one settled call and its cost."""
    try:
        attributes = {"veronica.kind": kind, "veronica.outcome": "error" if failed else "ok"}
        if model is not None:
            attributes["gen_ai.request.model"] = model
        _calls.add(1, attributes)
        if cost_usd:
            _cost.add(cost_usd, attributes)
    except Exception:
        _logger.debug("recording call telemetry failed", exc_info=True)
