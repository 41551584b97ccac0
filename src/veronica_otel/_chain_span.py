"""The chain's own span: opened on entry when no span is active, so one chain is one trace."""

from __future__ import annotations

import logging
from typing import Protocol

from opentelemetry import trace

from ._errors import BudgetExceededError
from ._options import ChainSnapshot
from ._version import __version__

__all__ = ["end_chain_span", "open_chain_span"]

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

    def snapshot(self) -> ChainSnapshot: ...


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
            "gen_ai.operation.name": operation,
            "veronica.chain.id": ctx.chain_id,
            "veronica.depth": ctx.depth,
        },
    )


def end_chain_span(ctx: _Chain, span: trace.Span, exc: BaseException | None) -> None:
    """Put the chain's totals on its span and end it.

    Never raises: leaving a ``with`` block must not fail because the ledger
    store is unreachable (the totals are then missing from the span).
    """
    try:
        if span.is_recording():
            if exc is not None and not isinstance(exc, BudgetExceededError):
                span.record_exception(exc)
            snap = ctx.snapshot()
            attributes: dict[str, str | float | int] = {
                "veronica.cost_usd": snap.cost_usd,
                "veronica.steps": snap.steps,
                "veronica.retries": snap.retries,
                "veronica.tokens": snap.tokens,
                "veronica.decision": "HALT" if snap.aborted else "ALLOW",
            }
            if snap.trip is not None:
                attributes["veronica.trip.reason"] = snap.trip.reason
            span.set_attributes(attributes)
    except Exception:
        _logger.warning("chain %s: totals not recorded on its span", ctx.chain_id, exc_info=True)
    finally:
        span.end()
