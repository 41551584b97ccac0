"""Where the active chain lives: a key in the OpenTelemetry context.

Because the :class:`ExecutionContext` is stored with
``opentelemetry.context``, it travels wherever OpenTelemetry context travels:
asyncio tasks (contextvars), threads started by instrumented executors, and,
through the middleware, other services.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opentelemetry import context as otel_context

if TYPE_CHECKING:
    from ._context import ExecutionContext

__all__ = ["CONTEXT_KEY", "current_context", "default_context", "set_default_context"]

CONTEXT_KEY = otel_context.create_key("veronica-otel-execution-context")
_default: ExecutionContext | None = None


def current_context() -> ExecutionContext | None:
    """Return the chain active in the current OpenTelemetry context, or None."""
    return otel_context.get_value(CONTEXT_KEY)  # type: ignore[return-value]


def set_default_context(context: ExecutionContext | None) -> None:
    """Set the process default chain used when no context is active.

    Zero-code auto-instrumentation sets it from the ``VERONICA_*`` variables.
    """
    global _default
    _default = context


def default_context() -> ExecutionContext | None:
    """The active chain, else the process default chain, else None."""
    ctx = otel_context.get_value(CONTEXT_KEY)
    return ctx if ctx is not None else _default  # type: ignore[return-value]
