"""Trip and call telemetry through the OpenTelemetry API: metrics and log records.

Metrics: ``veronica.trips`` (by reason), ``veronica.calls`` and
``veronica.cost_usd`` (by kind and decision), and the gauges
``veronica.reserved_usd`` / ``veronica.remaining_usd`` observed from live
chains; ``veronica.pool.spent_usd`` / ``veronica.pool.remaining_usd`` per
budget pool (attribute ``veronica.pool``: pool names are few, unlike chain
ids; the most recently made :data:`MAX_TRACKED_POOLS` are observed). Trips
also become an OpenTelemetry log record. With no SDK configured
every instrument is a no-op proxy; nothing here can raise into a caller.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable
from typing import Protocol

from opentelemetry import _logs, metrics
from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.metrics import CallbackOptions, Observation

from ._attributes import (
    CHAIN_ID,
    GEN_AI_REQUEST_MODEL,
    KIND,
    OUTCOME,
    POOL,
    TRIP_EVENT,
    TRIP_LIMIT,
    TRIP_OBSERVED,
    TRIP_REASON,
    TRIP_RETRY_AFTER_S,
)
from ._errors import TripEvent
from ._version import __version__


# What the gauges read of a chain and of a pool: protocols, so this module sits
# under the context and the pools rather than importing them back.
class _Snapshot(Protocol):
    @property
    def reserved_usd(self) -> float: ...


class _Chain(Protocol):
    @property
    def chain_id(self) -> str: ...

    def snapshot(self) -> _Snapshot: ...

    def remaining_cost_nano(self) -> int | None: ...


class _PoolSnapshot(Protocol):
    @property
    def cost_usd(self) -> float: ...

    @property
    def reserved_cost_usd(self) -> float: ...


class _Pool(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def ledger(self) -> object: ...

    @property
    def max_cost_usd(self) -> float | None: ...

    def snapshot(self) -> _PoolSnapshot: ...


__all__ = ["MAX_TRACKED_POOLS", "record_call", "record_trip", "track_chain", "track_pool"]

_logger = logging.getLogger(__name__)
_live: weakref.WeakSet[_Chain] = weakref.WeakSet()
MAX_TRACKED_POOLS = 256
# (ledger id, pool name) -> the latest pool made with them: pools with the same
# name and ledger share one budget, so one observation each. Insertion order
# evicts the oldest past MAX_TRACKED_POOLS (a pool made per request stays one entry).
_pools: dict[tuple[int, str], _Pool] = {}


def _observe_reserved(options: CallbackOptions) -> Iterable[Observation]:
    for ctx in tuple(_live):
        try:
            yield Observation(ctx.snapshot().reserved_usd, {CHAIN_ID: ctx.chain_id})
        except Exception:
            _logger.debug("observing reserved_usd failed", exc_info=True)


def _observe_remaining(options: CallbackOptions) -> Iterable[Observation]:
    for ctx in tuple(_live):
        try:
            remaining = ctx.remaining_cost_nano()
            if remaining is not None:
                yield Observation(remaining / 1e9, {CHAIN_ID: ctx.chain_id})
        except Exception:
            _logger.debug("observing remaining_usd failed", exc_info=True)


def _pool_observations(spent: bool) -> Iterable[Observation]:
    for pool in tuple(_pools.values()):
        try:
            limit = pool.max_cost_usd
            if not spent and limit is None:
                continue
            snap = pool.snapshot()
            attributes = {POOL: pool.name}
            if spent:
                yield Observation(snap.cost_usd, attributes)
            else:
                left = max(0.0, (limit or 0.0) - snap.cost_usd - snap.reserved_cost_usd)
                yield Observation(left, attributes)
        except Exception:
            _logger.debug("observing pool %r failed", pool, exc_info=True)


def _observe_pool_spent(options: CallbackOptions) -> Iterable[Observation]:
    return _pool_observations(spent=True)


def _observe_pool_remaining(options: CallbackOptions) -> Iterable[Observation]:
    return _pool_observations(spent=False)


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
_meter.create_observable_gauge(
    "veronica.pool.spent_usd",
    callbacks=[_observe_pool_spent],
    unit="USD",
    description="Cost committed within each budget pool's window",
)
_meter.create_observable_gauge(
    "veronica.pool.remaining_usd",
    callbacks=[_observe_pool_remaining],
    unit="USD",
    description="What each budget pool's cost limit has left, unreserved",
)
_otel_logger = _logs.get_logger("veronica_otel.trips", __version__)


def track_chain(ctx: _Chain) -> None:
    """Observe ``ctx`` in the gauges while it is alive."""
    try:
        _live.add(ctx)
    except Exception:
        _logger.debug("tracking a chain for gauges failed", exc_info=True)


def track_pool(pool: _Pool) -> None:
    """Observe ``pool`` in the pool gauges (replacing an older pool of the same name and ledger)."""
    try:
        key = (id(pool.ledger), pool.name)
        _pools.pop(key, None)
        _pools[key] = pool
        while len(_pools) > MAX_TRACKED_POOLS:
            del _pools[next(iter(_pools))]
    except Exception:
        _logger.debug("tracking a pool for gauges failed", exc_info=True)


def record_trip(trip: TripEvent) -> None:
    """Count a trip and emit it as an OpenTelemetry log record."""
    try:
        counted: dict[str, str] = {TRIP_REASON: trip.reason}
        attributes: dict[str, str | float] = {
            TRIP_REASON: trip.reason,
            TRIP_LIMIT: trip.limit,
            TRIP_OBSERVED: trip.observed,
            CHAIN_ID: trip.chain_id,
        }
        if trip.pool is not None:  # pool names are bounded: fine on the counter too
            counted[POOL] = attributes[POOL] = trip.pool
            if trip.retry_after_s is not None:
                attributes[TRIP_RETRY_AFTER_S] = trip.retry_after_s
        _trips.add(1, counted)
        _otel_logger.emit(
            LogRecord(
                severity_number=SeverityNumber.WARN,
                severity_text="WARN",
                body=trip.message,
                event_name=TRIP_EVENT,
                attributes=attributes,
            )
        )
    except Exception:
        _logger.debug("recording trip telemetry failed", exc_info=True)


def _idle(instrument: object) -> bool:
    """True while ``instrument`` is the API's proxy with no MeterProvider behind it.

    The proxy forwards to nothing until a provider is set; checking first
    spares every settled call the attribute dict and two calls into it. An
    instrument of another shape (a provider set before import, another API
    version) is never idle: it records.
    """
    return getattr(instrument, "_real_instrument", instrument) is None


def metrics_live() -> bool:
    """Whether a MeterProvider records the per-call metrics (else: skip them)."""
    return getattr(_calls, "_real_instrument", _calls) is not None  # not _idle(_calls)


def record_call(kind: str, cost_usd: float, failed: bool, model: str | None) -> None:
    """Count one settled call and its cost."""
    if _idle(_calls):
        return
    try:
        attributes = {KIND: kind, OUTCOME: "error" if failed else "ok"}
        if model is not None:
            attributes[GEN_AI_REQUEST_MODEL] = model
        _calls.add(1, attributes)
        if cost_usd:
            _cost.add(cost_usd, attributes)
    except Exception:
        _logger.debug("recording call telemetry failed", exc_info=True)
