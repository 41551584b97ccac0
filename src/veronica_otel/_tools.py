"""Tool calls as chain steps: :class:`ToolCall` and the ``contained_tool`` decorator.

A loop of tool calls can run forever without touching an LLM, so every tool
call is one step of the active chain: it is checked before it runs (steps,
deadline, repeats of the same tool with the same arguments, the tool's own
circuit breaker, its price if it has one), runs in an ``execute_tool {name}``
span (GenAI semantic conventions) and commits what it cost afterwards.
:class:`ToolCall` is the one implementation; ``contained_tool`` and the tool
instrumentors (MCP, LangChain) are thin layers over it.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import inspect
import json
import logging
import math
import sys
import threading
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from ._attributes import (
    CHAIN_ID,
    DECISION,
    GEN_AI_OPERATION_NAME,
    GEN_AI_TOOL_NAME,
    RESERVED_USD,
    TRIP_EVENT,
    TRIP_LIMIT,
    TRIP_REASON,
)
from ._call import ACTIVE_CALL
from ._cm import AsyncFromSync
from ._errors import BudgetExceededError, TripEvent
from ._fork import remake_locks_after_fork
from ._options import WrapOptions
from ._propagation import current_context
from ._trips import emit_trip
from ._units import check_usd
from ._version import __version__

if TYPE_CHECKING:
    from ._breaker import CircuitBreaker
    from ._call import CallHandle
    from ._context import ExecutionContext

__all__ = [
    "ToolCall",
    "contained_tool",
    "set_tool_prices",
    "tool_price_usd",
    "tool_signature",
]

F = TypeVar("F", bound=Callable[..., Any])
_tracer = trace.get_tracer("veronica_otel", __version__)
_logger = logging.getLogger("veronica_otel.tools")
_prices_lock = threading.Lock()
remake_locks_after_fork(sys.modules[__name__], "_prices_lock")
_tool_prices: dict[str, float] = {}


def set_tool_prices(prices: Mapping[str, float] | None) -> None:
    """Set what one call of each named tool costs in USD (replaces the old table).

    Tool calls whose caller gives no cost of their own are reserved and
    committed at this price; unnamed tools cost nothing. ``None`` clears it.
    """
    table: dict[str, float] = {}
    for name, price in (prices or {}).items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"tool price names must be non-empty strings, got {name!r}")
        table[name] = check_usd(f"price of tool {name!r}", price)
    global _tool_prices
    with _prices_lock:
        _tool_prices = table


def tool_price_usd(name: str) -> float:
    """The configured price of one call of tool ``name`` (0.0 when unpriced)."""
    return _tool_prices.get(name, 0.0)


def tool_signature(name: str, arguments: object = None) -> str:
    """Identity of a tool call for the repeat limit: its name and its arguments.

    Arguments are canonicalised (sorted keys, JSON) so ``{"a": 1, "b": 2}``
    and ``{"b": 2, "a": 1}`` are the same call; values JSON cannot encode
    count by their ``repr``. The digest keeps memory per signature small.
    """
    try:
        encoded = json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=repr)
    except (TypeError, ValueError):  # keys of mixed types cannot be sorted
        encoded = repr(arguments)
    digest = hashlib.blake2b(encoded.encode("utf-8", "surrogatepass"), digest_size=16)
    return f"tool:{name}:{digest.hexdigest()}"


class ToolCall(AsyncFromSync):
    """One contained tool call, as a (sync or async) context manager.

    Entering runs the check and raises :class:`BudgetExceededError` (after
    marking the span ``HALT``) when the chain does not allow the call; the
    tool must then not run. Leaving commits the call and feeds the tool's
    breaker with the outcome; exceptions pass through unchanged. A call that
    raised (any exception, cancellation, ``KeyboardInterrupt``) and reported
    no usage is committed at its reservation, like one that returned (DESIGN
    G10); usage reported with ``record_usage`` is committed as reported. With no
    active chain nothing is checked or recorded and :attr:`active` is False.

    Args:
        name: The tool's name (``gen_ai.tool.name``).
        arguments: The call's arguments; with ``max_repeats`` set, the same
            tool called with the same arguments counts as a repeat.
        cost_usd: What the call costs; ``None`` uses :func:`set_tool_prices`.
        breaker: A circuit breaker for this tool, checked before the call and
            fed its outcome (a raised error, or :meth:`mark_failed`).
        attributes: Extra span attributes (for example ``gen_ai.system``).
        context: The chain; the active one by default.
        traced: Open the ``execute_tool`` span (never under
            ``suppress_instrumentation()``: the call is then still checked
            and counted, only its span is not recorded).
    """

    __slots__ = (
        "_active",
        "_attributes",
        "_breaker",
        "_call",
        "_context",
        "_cost_usd",
        "_failed",
        "_probe",
        "_span",
        "_token",
        "_traced",
        "arguments",
        "name",
    )

    def __init__(
        self,
        name: str,
        arguments: object = None,
        *,
        cost_usd: float | None = None,
        breaker: CircuitBreaker | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
        context: ExecutionContext | None = None,
        traced: bool = True,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"tool name must be a non-empty string, got {name!r}")
        self.name = name
        self.arguments = arguments
        self._cost_usd = cost_usd
        self._breaker = breaker
        self._attributes = attributes
        self._context = context
        self._traced = traced
        self._call: CallHandle | None = None
        self._span: Span | None = None
        self._token: object | None = None
        self._probe: object | None = None
        self._failed: str | None = None
        self._active: contextvars.Token[CallHandle | None] | None = None

    @property
    def active(self) -> bool:
        """Whether the call was admitted into a chain (False with no chain)."""
        return self._call is not None

    @property
    def span(self) -> Span | None:
        """The ``execute_tool`` span while the call is active."""
        return self._span

    def mark_failed(self, description: str = "tool reported an error") -> None:
        """Count the call as a failure of the tool without raising (an error result)."""
        self._failed = description

    def __enter__(self) -> ToolCall:
        ctx = self._context if self._context is not None else current_context()
        if ctx is None:
            return self
        options, span, token, probe = self._open(ctx)
        try:
            self._check_breaker(ctx, probe)
            call = ctx.begin_call("tool", options)
        except BaseException as exc:
            self._refused(exc, span, token, probe)
            raise
        return self._admitted(call, span, token, probe)

    async def __aenter__(self) -> ToolCall:
        # The same admission; a shared store's reservation is awaited.
        ctx = self._context if self._context is not None else current_context()
        if ctx is None:
            return self
        options, span, token, probe = self._open(ctx)
        try:
            self._check_breaker(ctx, probe)
            call = await ctx.abegin_call("tool", options)
        except BaseException as exc:  # denied, failed or cancelled: nothing is held
            self._refused(exc, span, token, probe)
            raise
        return self._admitted(call, span, token, probe)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        call = self._leave()
        if call is None:
            return
        try:
            call.finish(exc)
        finally:
            self._closed(exc)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        call = self._leave()
        if call is None:
            return
        try:
            await call.afinish(exc)
        finally:
            self._closed(exc)

    # Shared by the sync and async forms: all but the ledger operation.

    def _open(self, ctx: ExecutionContext) -> tuple[WrapOptions, Span, object | None, object]:
        cost = self._cost_usd if self._cost_usd is not None else tool_price_usd(self.name)
        signature = tool_signature(self.name, self.arguments) if ctx.tracks_repeats else None
        options = WrapOptions(
            operation_name=self.name, cost_estimate_hint=cost, signature=signature
        )
        # Suppression hides the span, never the check.
        traced = self._traced and not otel_context.get_value(_SUPPRESS_INSTRUMENTATION_KEY)
        span, token = self._start_span(ctx) if traced else (trace.INVALID_SPAN, None)
        return options, span, token, object()

    def _check_breaker(self, ctx: ExecutionContext, probe: object) -> None:
        if self._breaker is not None:
            verdict = self._breaker.check(probe)
            if not verdict.allowed:
                _deny_breaker(ctx, self.name, verdict.reason)

    def _refused(self, exc: BaseException, span: Span, token: object | None, probe: object) -> None:
        if self._breaker is not None:
            self._breaker.release_probe(probe)
        if isinstance(exc, BudgetExceededError):
            _end_denied(span, exc)
        else:
            span.end()
        _detach(token)

    def _admitted(
        self, call: CallHandle, span: Span, token: object | None, probe: object
    ) -> ToolCall:
        call.metrics, call.kind = True, "tool"
        if span.is_recording():
            span.set_attributes({DECISION: "ALLOW", RESERVED_USD: call.reserved_usd})
        self._call, self._span, self._token, self._probe = call, span, token, probe
        self._active = ACTIVE_CALL.set(call)  # ctx.record_usage() reports into this call
        return self

    def _leave(self) -> CallHandle | None:
        call = self._call
        if call is None or self._span is None:
            return None
        self._call = None
        if self._active is not None:
            ACTIVE_CALL.reset(self._active)
            self._active = None
        return call

    def _closed(self, exc: BaseException | None) -> None:
        span, token = self._span, self._token
        self._feed_breaker(exc)
        if span is None:
            return
        try:
            if exc is not None:
                span.record_exception(exc)
                span.set_attribute("error.type", type(exc).__qualname__)
                span.set_status(Status(StatusCode.ERROR, str(exc)))
            elif self._failed is not None:
                span.set_attribute("error.type", "tool_error")
                span.set_status(Status(StatusCode.ERROR, self._failed))
        except Exception:
            _logger.exception("recording the tool call on its span failed")
        span.end()
        _detach(token)
        self._span = self._token = None

    def _start_span(self, ctx: ExecutionContext) -> tuple[Span, object]:
        attributes: dict[str, AttributeValue] = {
            GEN_AI_OPERATION_NAME: "execute_tool",
            GEN_AI_TOOL_NAME: self.name,
            CHAIN_ID: ctx.chain_id,
        }
        if self._attributes:
            attributes.update(self._attributes)
        span = _tracer.start_span(
            f"execute_tool {self.name}", kind=trace.SpanKind.INTERNAL, attributes=attributes
        )
        return span, otel_context.attach(trace.set_span_in_context(span))

    def _feed_breaker(self, error: BaseException | None) -> None:
        breaker = self._breaker
        if breaker is None:
            return
        try:
            if isinstance(error, BudgetExceededError) or (
                error is not None and not isinstance(error, Exception)
            ):
                # Our denial, a cancellation or KeyboardInterrupt says nothing of the tool.
                breaker.release_probe(self._probe)
            elif error is not None or self._failed is not None:
                breaker.record_failure(self._probe)
            else:
                breaker.record_success(self._probe)
        except Exception:
            _logger.exception("feeding the tool's circuit breaker failed")


def _detach(token: object | None) -> None:
    if token is not None:  # None: the call opened no span (untraced)
        otel_context.detach(token)  # type: ignore[arg-type]


def _deny_breaker(ctx: ExecutionContext, tool: str, why: str) -> None:
    trip = TripEvent(
        "circuit_open",
        0.0,
        0.0,
        ctx.chain_id,
        f"chain {ctx.chain_id}: tool {tool} is failing; {why}",
    )
    emit_trip(trip)
    raise BudgetExceededError(trip)


def _end_denied(span: Span, error: BudgetExceededError) -> None:
    try:
        if span.is_recording():
            span.set_attributes(
                {
                    DECISION: "HALT",
                    "error.type": "BudgetExceededError",
                    TRIP_REASON: error.reason,
                }
            )
            if not any(e.name == TRIP_EVENT for e in getattr(span, "events", ())):
                limit = error.limit if math.isfinite(error.limit) else -1.0
                span.add_event(
                    TRIP_EVENT,
                    {TRIP_REASON: error.reason, TRIP_LIMIT: limit},
                )
            span.set_status(Status(StatusCode.ERROR, f"veronica trip: {error.reason}"))
    except Exception:
        _logger.exception("recording the denial on the tool span failed")
    finally:
        span.end()


def _bound_arguments(
    func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """The call's arguments by parameter name, so ``f(1)`` and ``f(x=1)`` match."""
    try:
        bound = inspect.signature(func).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return [list(args), kwargs]
    bound.apply_defaults()
    return dict(bound.arguments)


@overload
def contained_tool(fn: F, /) -> F: ...
@overload
def contained_tool(
    *, name: str | None = None, cost_usd: float | None = None
) -> Callable[[F], F]: ...


def contained_tool(
    fn: F | None = None, /, *, name: str | None = None, cost_usd: float | None = None
) -> F | Callable[[F], F]:
    """Contain every call of a tool function (sync or async) in the active chain.

    Each call is one step, runs in an ``execute_tool {name}`` span and raises
    :class:`BudgetExceededError` instead of running when the chain does not
    allow it; the same arguments repeated count towards ``max_repeats``.
    With no active chain the function runs unchanged.

    Args:
        fn: The tool function.
        name: The tool's name in spans and trips (the function's name by default).
        cost_usd: What one call costs, reserved before and committed after
            (default: the price set with :func:`set_tool_prices`, else 0).
    """
    if cost_usd is not None:
        check_usd("cost_usd", cost_usd)

    def decorate(func: F) -> F:
        tool = name or func.__name__

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                ctx = current_context()
                if ctx is None:
                    return await func(*args, **kwargs)
                arguments = _bound_arguments(func, args, kwargs) if ctx.tracks_repeats else None
                async with ToolCall(tool, arguments, cost_usd=cost_usd, context=ctx):
                    return await func(*args, **kwargs)

            return cast(F, async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ctx = current_context()
            if ctx is None:
                return func(*args, **kwargs)
            arguments = _bound_arguments(func, args, kwargs) if ctx.tracks_repeats else None
            with ToolCall(tool, arguments, cost_usd=cost_usd, context=ctx):
                return func(*args, **kwargs)

        return cast(F, wrapper)

    if fn is not None:
        return decorate(fn)
    return decorate
