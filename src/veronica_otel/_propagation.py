"""Where the active chain lives: a key in the OpenTelemetry context.

Because the :class:`ExecutionContext` is stored with
``opentelemetry.context``, it travels wherever OpenTelemetry context travels:
asyncio tasks (contextvars), threads started by instrumented executors, and,
through the middleware, other services.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from opentelemetry import context as otel_context

if TYPE_CHECKING:
    from ._context import ExecutionContext

__all__ = [
    "CONTEXT_KEY",
    "current_context",
    "default_context",
    "set_default_context",
    "set_default_context_error",
]

CONTEXT_KEY = otel_context.create_key("veronica-otel-execution-context")
_default: ExecutionContext | None = None
_default_error: Exception | None = None
# How a forked child builds its own default chain (see _fork.py); None: a copy
# of the parent's limits, pipeline and prices under a new chain id.
_default_renew: Callable[[], ExecutionContext] | None = None


def current_context() -> ExecutionContext | None:
    """Return the chain active in the current OpenTelemetry context, or None."""
    return otel_context.get_value(CONTEXT_KEY)  # type: ignore[return-value]


def set_default_context(
    context: ExecutionContext | None,
    *,
    renew: Callable[[], ExecutionContext] | None = None,
) -> None:
    """Set the process default chain used when no context is active.

    Zero-code auto-instrumentation sets it from the ``VERONICA_*`` variables.
    The default chain is per process: a child forked from this one builds
    its own (``renew()``, else the same limits under a new chain id) when the
    chain lives on an in-process ledger; on the shared ledger it keeps
    counting the same chain, in the store.
    """
    global _default, _default_error, _default_renew
    _default = context
    _default_error = None
    _default_renew = renew


def set_default_context_error(error: Exception) -> None:
    """Fail closed: every contained call outside an explicit context raises ``error``.

    Used when the ``VERONICA_*`` configuration is malformed: running the app
    uncontained would be silent, so each call raises an error naming the
    variable instead.
    """
    global _default, _default_error, _default_renew
    _default = None
    _default_error = error
    _default_renew = None


def default_context(context: otel_context.Context | None = None) -> ExecutionContext | None:
    """The active chain, else the process default chain, else None.

    ``context``: the OpenTelemetry context to read (the current one if None).
    Raises the configuration error set by :func:`set_default_context_error`.
    """
    ctx = otel_context.get_value(CONTEXT_KEY, context)
    if ctx is not None:
        return ctx  # type: ignore[return-value]
    if _default_error is not None:
        # The same error every call: without its last traceback, so it does not grow.
        raise _default_error.with_traceback(None)
    return _default
