"""The chain's own span: opened on entry when no span is active, so one chain is one trace."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opentelemetry import trace

from ._errors import BudgetExceededError
from ._version import __version__

if TYPE_CHECKING:
    from ._context import ExecutionContext

__all__ = ["end_chain_span", "open_chain_span"]

_tracer = trace.get_tracer("veronica_otel", __version__)


def open_chain_span(ctx: ExecutionContext) -> trace.Span | None:
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


def end_chain_span(ctx: ExecutionContext, span: trace.Span, exc: BaseException | None) -> None:
    """Put the chain's totals on its span and end it."""
    try:
        if span.is_recording():
            snap = ctx.snapshot()
            span.set_attribute("veronica.cost_usd", snap.cost_usd)
            span.set_attribute("veronica.steps", snap.steps)
            span.set_attribute("veronica.retries", snap.retries)
            span.set_attribute("veronica.tokens", snap.tokens)
            span.set_attribute("veronica.decision", "HALT" if snap.aborted else "ALLOW")
            if snap.trip is not None:
                span.set_attribute("veronica.trip.reason", snap.trip.reason)
            if exc is not None and not isinstance(exc, BudgetExceededError):
                span.record_exception(exc)
    finally:
        span.end()
