"""The chain's own span: opened on entry when no span is active, so one chain is one trace."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from opentelemetry import trace

from ._attributes import (
    CHAIN_ID,
    COST_USD,
    DECISION,
    DEPTH,
    GEN_AI_OPERATION_NAME,
    REMAINING_COST_USD,
    REMAINING_STEPS,
    RETRIES,
    STEPS,
    TOKENS,
    TRIP_REASON,
)
from ._errors import BudgetExceededError
from ._options import ChainSnapshot
from ._units import nano_to_usd
from ._version import __version__

if TYPE_CHECKING:
    from ._ledger import LedgerState
    from ._pools import PoolRoom

__all__ = ["aend_chain_span", "end_chain_span", "open_chain_span", "remaining_attributes"]

_tracer = trace.get_tracer("veronica_otel", __version__)
_logger = logging.getLogger(__name__)


class _Chain(Protocol):
    """What the chain span reads of its chain (so this module does not import the context)."""

    @property
    def chain_id(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def depth(self) -> int: ...

    @property
    def parent(self) -> object | None: ...

    @property
    def awaits_store(self) -> bool: ...

    def snapshot(self) -> ChainSnapshot: ...

    async def asnapshot(self) -> ChainSnapshot: ...

    async def asnapshots(self) -> dict[str, LedgerState] | None: ...

    async def apool_room(self) -> PoolRoom | None: ...

    def remaining_cost_and_steps(
        self, states: Mapping[str, LedgerState] | None = None, room: PoolRoom | None = None
    ) -> tuple[int | None, int | None]: ...


class _Budget(Protocol):
    """What ``remaining_attributes`` reads of a chain."""

    @property
    def chain_id(self) -> str: ...

    @property
    def awaits_store(self) -> bool: ...

    def remaining_cost_and_steps(self) -> tuple[int | None, int | None]: ...


def open_chain_span(ctx: _Chain) -> trace.Span | None:
    """Open ``invoke_workflow`` (root) or ``invoke_agent`` (child) when one is due.

    A root chain entered under an active span (a server request, say) hangs
    under it instead of opening a span of its own.
    """
    parent = ctx.parent
    if parent is None and trace.get_current_span().get_span_context().is_valid:
        return None
    operation = "invoke_agent" if parent is not None else "invoke_workflow"
    return _tracer.start_span(
        f"{operation} {ctx.name}",
        attributes={
            GEN_AI_OPERATION_NAME: operation,
            CHAIN_ID: ctx.chain_id,
            DEPTH: ctx.depth,
        },
    )


def end_chain_span(ctx: _Chain, span: trace.Span, exc: BaseException | None) -> None:
    """Put the chain's totals on its span and end it.

    Never raises: leaving a ``with`` block must not fail because the ledger
    store is unreachable (the totals are then missing from the span).
    """
    try:
        if _recording(span, exc):
            _put_totals(span, ctx.snapshot(), remaining_attributes(ctx))
    except Exception:
        _logger.warning("chain %s: totals not recorded on its span", ctx.chain_id, exc_info=True)
    finally:
        span.end()


async def aend_chain_span(ctx: _Chain, span: trace.Span, exc: BaseException | None) -> None:
    """:func:`end_chain_span` for ``async with``: a shared store is read without blocking."""
    try:
        if _recording(span, exc):
            snap = await ctx.asnapshot()
            _put_totals(span, snap, await _aremaining_attributes(ctx))
    except Exception:
        _logger.warning("chain %s: totals not recorded on its span", ctx.chain_id, exc_info=True)
    finally:
        span.end()


def _recording(span: trace.Span, exc: BaseException | None) -> bool:
    if not span.is_recording():
        return False
    if exc is not None and not isinstance(exc, BudgetExceededError):
        span.record_exception(exc)
    return True


def _put_totals(span: trace.Span, snap: ChainSnapshot, remaining: dict[str, float | int]) -> None:
    attributes: dict[str, str | float | int] = {
        COST_USD: snap.cost_usd,
        STEPS: snap.steps,
        RETRIES: snap.retries,
        TOKENS: snap.tokens,
        DECISION: "HALT" if snap.aborted else "ALLOW",
    }
    if snap.trip is not None:
        attributes[TRIP_REASON] = snap.trip.reason
    attributes.update(remaining)
    span.set_attributes(attributes)


async def _aremaining_attributes(ctx: _Chain) -> dict[str, float | int]:
    """:func:`remaining_attributes` with the path's and the pools' counters awaited."""
    if not ctx.awaits_store:
        return remaining_attributes(ctx)
    try:
        states = await ctx.asnapshots()
        room = await ctx.apool_room()
        cost_left, steps_left = ctx.remaining_cost_and_steps(states, room)
    except Exception:
        _logger.debug("chain %s: remaining budget unreadable", ctx.chain_id, exc_info=True)
        return {}
    return _remaining(cost_left, steps_left)


def remaining_attributes(ctx: _Budget) -> dict[str, float | int]:
    """``veronica.remaining.*``: what the chain's tightest cost and step ceilings have left.

    Read where the chain's state is reported (its span's end, a trip), not on
    every call span: one ledger read a level is too much for the hot path.
    Empty when the ledger cannot be read; never raises. Empty too for a chain
    on a shared store read from a running event loop: a blocking store read
    there would stall every task (the gauges still report it).
    """
    if ctx.awaits_store and _in_event_loop():
        return {}
    try:
        cost_left, steps_left = ctx.remaining_cost_and_steps()
    except Exception:
        _logger.debug("chain %s: remaining budget unreadable", ctx.chain_id, exc_info=True)
        return {}
    return _remaining(cost_left, steps_left)


def _remaining(cost_left: int | None, steps_left: int | None) -> dict[str, float | int]:
    attributes: dict[str, float | int] = {}
    if cost_left is not None:
        attributes[REMAINING_COST_USD] = nano_to_usd(cost_left)
    if steps_left is not None:
        attributes[REMAINING_STEPS] = steps_left
    return attributes


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
