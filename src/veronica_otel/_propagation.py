"""Where the active chain lives: a key in the OpenTelemetry context.

Because the :class:`ExecutionContext` is stored with
``opentelemetry.context``, it travels wherever OpenTelemetry context travels:
asyncio tasks (contextvars), threads started by instrumented executors, and,
through the middleware, other services.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from opentelemetry import context as otel_context

from ._context import CONTEXT_KEY, ExecutionContext
from ._fork import on_fork_in_child
from ._ledger import LocalLedger

__all__ = [
    "CONTEXT_KEY",
    "current_context",
    "default_context",
    "set_default_context",
    "set_default_context_error",
]

_logger = logging.getLogger("veronica_otel._fork")
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


def _renew_default_chain() -> None:
    """The child's own default chain, when the parent's lives on an in-process ledger."""
    old = _default
    if old is None or not isinstance(old._state.ledger, LocalLedger):
        return  # none, or on the shared ledger: the store counts every process
    renew = _default_renew
    if renew is None:
        new = ExecutionContext(
            old.config,
            old.pipeline,
            ledger=old._state.ledger,
            price_table=old._state.prices,
            name=old.name,
            detached=True,
        )
    else:
        new = renew()
    set_default_context(new, renew=renew)


def _after_fork_in_child() -> None:
    try:
        _renew_default_chain()
    except Exception as exc:  # never break the child: fail closed instead
        _logger.exception("veronica-otel: could not build the default chain after fork")
        set_default_context_error(
            RuntimeError(f"veronica-otel: the default chain could not be rebuilt after fork: {exc}")
        )


on_fork_in_child(_after_fork_in_child)
