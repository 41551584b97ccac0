"""``contained_tool``: a decorator that makes a function a contained tool call.

Each call of the decorated function is one step of the active chain, runs in
an ``execute_tool {name}`` span, and raises :class:`BudgetExceededError`
instead of running when the chain does not allow it. With no active chain the
function runs unchanged.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, cast, overload

from opentelemetry import trace

from ._options import WrapOptions
from ._propagation import current_context
from ._version import __version__

__all__ = ["contained_tool"]

F = TypeVar("F", bound=Callable[..., Any])
_tracer = trace.get_tracer("veronica_otel", __version__)


@overload
def contained_tool(fn: F, /) -> F: ...
@overload
def contained_tool(*, name: str | None = None, cost_usd: float = 0.0) -> Callable[[F], F]: ...


def contained_tool(
    fn: F | None = None, /, *, name: str | None = None, cost_usd: float = 0.0
) -> F | Callable[[F], F]:
    """Contain every call of a tool function in the active chain.

    Args:
        fn: The tool function (sync or async).
        name: The tool's name in spans and trips (the function's name by default).
        cost_usd: What one call costs, reserved before and committed after.
    """

    def decorate(func: F) -> F:
        tool = name or func.__name__
        options = WrapOptions(operation_name=tool, cost_estimate_hint=cost_usd)
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool}

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                ctx = current_context()
                if ctx is None:
                    return await func(*args, **kwargs)
                with _tracer.start_as_current_span(
                    f"execute_tool {tool}", kind=trace.SpanKind.INTERNAL, attributes=attributes
                ) as span:
                    span.set_attribute("veronica.chain.id", ctx.chain_id)
                    call = ctx.begin_call("tool", options)
                    call.metrics, call.kind = True, "tool"
                    try:
                        result = await func(*args, **kwargs)
                    except BaseException as exc:
                        call.finish(exc)
                        raise
                    call.finish()
                    return result

            return cast(F, async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ctx = current_context()
            if ctx is None:
                return func(*args, **kwargs)
            with _tracer.start_as_current_span(
                f"execute_tool {tool}", kind=trace.SpanKind.INTERNAL, attributes=attributes
            ) as span:
                span.set_attribute("veronica.chain.id", ctx.chain_id)
                call = ctx.begin_call("tool", options)
                call.metrics, call.kind = True, "tool"
                try:
                    result = func(*args, **kwargs)
                except BaseException as exc:
                    call.finish(exc)
                    raise
                call.finish()
                return result

        return cast(F, wrapper)

    if fn is not None:
        return decorate(fn)
    return decorate
