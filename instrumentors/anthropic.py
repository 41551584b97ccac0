"""Containment for the ``anthropic`` SDK (2.x).

Usage::

    from veronica_otel.instrumentors.anthropic import AnthropicInstrumentor

    AnthropicInstrumentor().instrument()
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)):
        client.messages.create(...)   # raises BudgetExceededError when over

Configuration: limits come from the active :class:`ExecutionContext`, else the
process default chain (zero-code: ``VERONICA_*`` variables). With neither,
calls pass through untouched. ``anthropic`` opens its own CLIENT span per API
call; the ``veronica.*`` attributes go on that span. With its tracing off
(``ANTHROPIC_OPEN_TELEMETRY=false`` or ``Anthropic(open_telemetry=False)``)
a GenAI ``chat {model}`` span is opened instead.

Where it hooks (``create``, ``stream``, ``parse`` and their ``beta`` twins all
pass through these):

- ``SyncAPIClient._request`` / ``AsyncAPIClient._request``: once per API call,
  inside the SDK's span (kwarg ``call``, None when its tracing is off), with
  ``extra_body`` already merged into the body. Runs the pre-call check
  (``messages.create`` only; ``count_tokens`` and the rest pass through),
  swaps in a fallback model, settles the call. The check lives here, not in a
  span processor, because the SDK swallows errors raised while its span starts.
- ``SyncAPIClient._attempt_request`` / ``AsyncAPIClient._attempt_request``:
  once per HTTP send. Every SDK-internal retry draws on ``max_retries_total``;
  the deadline and sticky trips are re-checked; our ``veronica.*`` baggage is
  removed from the context the SDK injects into the request headers.
- ``BaseClient._process_response_data``: every parsed payload, stream events
  included. Records usage, keeps streamed text, and cuts a stream at the next
  event once the chain trips or its deadline passes.

Denials are raised without a ``__cause__``: the SDK retries any error whose
cause chain holds one of its connection or status errors.

What a call that did not end well costs (DESIGN G10): the attempt hook notes
each attempt's outcome (a reply, a connection never made, or an error once
the send began, which may have reached the provider and costs the
reservation). A reply, or an ``APIStatusError``, that arrives without the
attempt hook having run is still sent: only a client middleware answering
without any attempt is released. Usage counts only from the final report
(``message_delta`` or a whole message): a stream cut before it costs the
reservation.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
import weakref
from collections.abc import Collection, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.trace import Span

from veronica_otel._agents import current_agent
from veronica_otel._context import ExecutionContext
from veronica_otel._errors import BudgetExceededError
from veronica_otel._gc_safe import defer
from veronica_otel._propagation import default_context

from ._admit import CallSpec, aadmit, admit, input_bound
from ._anthropic_attributes import request_attributes, response_attributes
from ._breakers import never_connected, raised_within
from ._common import (
    UNTRACED_SPAN,
    AsyncContainedStream,
    ContainedCall,
    ContainedStream,
    get_field,
    make_current,
    start_span,
    strip_veronica_baggage,
    token_count,
)
from ._hooks import GuardedInstrumentor, Hook, SDKHooks

__all__ = ["AnthropicInstrumentor"]

_logger = logging.getLogger(__name__)
_instruments = ("anthropic >= 2.0, < 3",)
PROVIDER = "anthropic"
_MODULE = "anthropic._base_client"
_CALL_KEY = "veronica.call"
_CREATE = "anthropic.messages.create"
_INPUT_KEYS = ("system", "messages", "tools")


class _CallState:
    """One contained API call and what its attempts and events reported so far."""

    __slots__ = (
        "attempts",
        "cache_read",
        "cache_write",
        "call",
        "input",
        "noted",
        "output",
        "replied",
        "retries",
        "thinking",
    )

    def __init__(self, call: ContainedCall) -> None:
        self.call = call
        self.retries = 0  # highest retries_taken already drawn from the chain
        self.attempts = 0  # HTTP attempts that passed our checks and went to the SDK
        self.replied = False  # an HTTP reply came back (any status)
        self.noted: BaseException | None = None  # the last attempt error already counted
        # The last usage report's raw values, read as counts once the final one is in.
        self.input: object = None  # Anthropic's input_tokens: without cache reads and writes
        self.cache_read: object = 0
        self.cache_write: object = 0
        self.output: object = None  # cumulative in a stream: final in message_delta
        self.thinking: object = 0


_ACTIVE: contextvars.ContextVar[_CallState | None] = contextvars.ContextVar(
    "veronica_anthropic_call", default=None
)


# -- admission (once per API call) ---------------------------------------------


def _is_messages_call(options: Any) -> bool:
    name = getattr(options, "span_name", None)
    if name is not None:
        return bool(name == _CREATE)
    # No span name (e.g. a raw ``client.post``): fall back to the route.
    if str(getattr(options, "method", "")).lower() != "post":
        return False
    return str(getattr(options, "url", "")).split("?", 1)[0].endswith("/v1/messages")


def _begin(options: Any, sdk_call: Any, client: Any = None) -> _CallState | None:
    """Admit a ``messages.create`` call; None when it is not ours to contain."""
    request = _describe(options, sdk_call)
    if request is None:
        return None
    ctx, spec, span, owns, body = request
    with _scope(span, owns):
        call, clamp, fallback = admit(ctx, span, owns, spec)
    _rewrite(options, body, clamp, fallback)
    if call.pending_attributes is not None:  # our own span records
        request_attributes(call.pending_attributes, body, client)
    return _CallState(call)


async def _abegin(options: Any, sdk_call: Any, client: Any = None) -> _CallState | None:
    """:func:`_begin` for the async client: a shared store is awaited (``aadmit``)."""
    request = _describe(options, sdk_call)
    if request is None:
        return None
    ctx, spec, span, owns, body = request
    with _scope(span, owns):
        call, clamp, fallback = await aadmit(ctx, span, owns, spec)
    _rewrite(options, body, clamp, fallback)
    if call.pending_attributes is not None:  # our own span records
        request_attributes(call.pending_attributes, body, client)
    return _CallState(call)


def _describe(
    options: Any, sdk_call: Any
) -> tuple[ExecutionContext, CallSpec, Span, bool, Mapping[str, Any]] | None:
    """The call described once (for the kernel), its span; None when it is not ours."""
    try:
        body = options.json_data if _is_messages_call(options) else None
    except Exception:
        _logger.exception("classifying an anthropic request failed; it is not contained")
        return None
    if not isinstance(body, Mapping):
        return None
    ctx = default_context()
    if ctx is None:
        return None
    model = str(body.get("model") or "unknown")
    messages = body.get("messages")
    n_messages = len(messages) if isinstance(messages, list) else 1
    parts = [body[key] for key in _INPUT_KEYS if body.get(key) is not None]
    cap = body.get("max_tokens")
    requested = cap if isinstance(cap, int) and not isinstance(cap, bool) else None
    agent = current_agent() if ctx.names_agents else None
    spec = CallSpec(
        PROVIDER,
        "chat",
        model,
        input_bound(parts, n_messages),
        requested,
        True,
        1,
        body.get("stream") is True,
        agent,
        parts,
    )
    span: Span | None = getattr(sdk_call, "span", None) if sdk_call is not None else None
    owns = span is None
    if span is None:
        # The SDK's tracing is off: our own span. Suppression hides it, never the check.
        span = start_span("chat", PROVIDER, model, agent) if is_instrumentation_enabled() else None
        span = span if span is not None else trace.INVALID_SPAN
    # Else the SDK's span is already current: no second span, our attributes go on it.
    return ctx, spec, span, owns, body


def _scope(span: Span, owns: bool) -> contextlib.AbstractContextManager[Any]:
    if owns and span is not UNTRACED_SPAN:
        return trace.use_span(
            span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        )
    return contextlib.nullcontext()


def _rewrite(
    options: Any, body: Mapping[str, Any], clamp: int | None, fallback: str | None
) -> None:
    changes: dict[str, object] = {}
    if clamp is not None:
        changes["max_tokens"] = clamp
    if fallback is not None:
        changes["model"] = fallback
    if changes:
        # Every attempt shares this dict through shallow copies: replace it.
        options.json_data = {**body, **changes}


# Where the SDK sends an attempt and reads its reply: an error raised inside
# either (an interrupt, a cancellation, garbage) came after the request may have left.
_SENDING = frozenset(("_attempt_request", "_process_response"))


def _note_failure(state: _CallState, error: BaseException) -> None:
    """Record what a failed attempt (or the call's final error) says about the provider."""
    from anthropic import APIConnectionError, APIStatusError

    if isinstance(error, APIStatusError):
        state.replied = True  # a reply, whether or not the attempt hook saw it
    elif isinstance(error, BudgetExceededError) or never_connected(error):
        return  # refused by us before sending, or no connection was ever made
    elif isinstance(error, APIConnectionError) or raised_within(error, _SENDING):
        state.call.lost_attempts += 1  # a timeout, a lost connection, a cancellation mid-send


def _fail(state: _CallState, error: BaseException) -> None:
    """Settle a call that raised, by what its attempts may have cost (DESIGN G10)."""
    call = state.call
    try:
        if error is not state.noted:  # else the attempt hook counted it already
            _note_failure(state, error)
    except Exception:  # classification must never leave the call unsettled
        _logger.exception("classifying an anthropic error failed")
        call.lost_attempts += 1
    lost = call.lost_attempts > 0
    call.finish(error, sent=lost or state.replied, billed=lost)


def _settle_failed(state: _CallState, result: Any) -> Any:
    """:func:`_settle` raised (our bug): commit the reservation, hand back the reply."""
    _logger.exception("settling an anthropic call failed; its reservation is committed")
    state.call.finish()
    return result


def _settle(state: _CallState, result: Any, instance: Any) -> Any:
    """Settle a call that returned, now or when its body is read."""
    from anthropic import AsyncStream, Stream
    from pydantic import BaseModel

    call = state.call
    if not state.attempts and getattr(instance, "_middleware", None):
        # A client middleware answered without sending anything. (Without
        # middleware, a reply that arrives while the attempt hook never ran
        # is still a reply: the SDK sent it some other way, and it is charged.)
        call.finish(sent=False)
        return result
    if isinstance(result, Stream):
        return ContainedStream(result, call, _no_item)
    if isinstance(result, AsyncStream):
        return AsyncContainedStream(result, call, _no_item)
    if call.done or result is None or isinstance(result, BaseModel):
        if not call.done and getattr(result, "type", None) == "message":
            # The payload hook never saw this body (the reply was not tagged by
            # the attempt hook): read the usage of the parsed message itself.
            _read_usage(state, getattr(result, "usage", None))
            _apply(state)
        call.finish()
        return result
    # A raw response (with_raw_response / with_streaming_response): its body is
    # parsed later; the payload hook settles it then, or collection does.
    try:
        weakref.finalize(result, defer, call.finish)
    except TypeError:
        call.finish()
    return result


def _no_item(call: ContainedCall, item: Any) -> None:
    """Stream items are accounted in the payload hook, which sees raw dicts."""


def _request(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    options = args[1] if len(args) > 1 else kwargs.get("options")
    state = _begin(options, kwargs.get("call"), instance)
    active = _ACTIVE.set(state)  # None for calls we do not contain: no stale parent
    if state is None:
        try:
            return wrapped(*args, **kwargs)
        finally:
            _ACTIVE.reset(active)
    call = state.call
    span_token = make_current(call.span, None) if call.owns_span else None
    try:
        delay_ms = call.handle.decision.rate_limit_ms
        if delay_ms:
            time.sleep(delay_ms / 1000)
        result = wrapped(*args, **kwargs)
    except BaseException as exc:
        _fail(state, exc)
        raise
    finally:
        if span_token is not None:
            otel_context.detach(span_token)
        _ACTIVE.reset(active)
    try:
        return _settle(state, result, instance)
    except Exception:
        return _settle_failed(state, result)


async def _arequest(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    options = args[1] if len(args) > 1 else kwargs.get("options")
    state = await _abegin(options, kwargs.get("call"), instance)
    active = _ACTIVE.set(state)
    if state is None:
        try:
            return await wrapped(*args, **kwargs)
        finally:
            _ACTIVE.reset(active)
    call = state.call
    span_token = make_current(call.span, None) if call.owns_span else None
    try:
        delay_ms = call.handle.decision.rate_limit_ms
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        result = await wrapped(*args, **kwargs)
    except BaseException as exc:
        call.defer_settlement()  # decided by the sync code, then awaited
        try:
            _fail(state, exc)
        finally:
            await call.settle_deferred()
        raise
    finally:
        if span_token is not None:
            otel_context.detach(span_token)
        _ACTIVE.reset(active)
    call.defer_settlement()
    try:
        result = _settle(state, result, instance)
    except Exception:
        result = _settle_failed(state, result)
    finally:
        await call.settle_deferred()
    return result


# -- attempts (once per HTTP send) ---------------------------------------------


def _before_send(state: _CallState, retries_taken: object, drawn: bool = False) -> None:
    call = state.call
    if isinstance(retries_taken, int) and retries_taken > state.retries:
        # An SDK-internal retry is about to be sent: it draws on the chain's
        # retry budget. Raising here (no __cause__) stops the SDK loop unsent.
        state.retries = retries_taken
        if not drawn:  # the async hook drew it already, awaiting the store
            call.ctx.consume_retry()
        if call.span.is_recording():
            call.span.set_attribute("veronica.retries", retries_taken)
    call.check_alive()
    state.attempts += 1


def _tag(result: Any, state: _CallState) -> None:
    """Mark the response so the payload hook finds its call, even mid-stream."""
    try:
        result[0].extensions[_CALL_KEY] = state
    except Exception:
        _logger.debug("could not tag an anthropic response", exc_info=True)


def _attempt(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    state = _ACTIVE.get()
    if state is not None:
        _before_send(state, kwargs.get("retries_taken", 0))
    stripped = strip_veronica_baggage()  # the SDK injects all current baggage
    try:
        result = wrapped(*args, **kwargs)
    except BaseException as exc:
        if state is not None:
            _note_attempt(state, exc)
        raise
    finally:
        if stripped is not None:
            otel_context.detach(stripped)  # type: ignore[arg-type]
    if state is not None:
        state.replied = True
        _tag(result, state)
    return result


def _note_attempt(state: _CallState, error: BaseException) -> None:
    # Raised from inside the send: only a connection never made means not sent.
    state.noted = error
    if not never_connected(error):
        state.call.lost_attempts += 1


async def _aattempt(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    state = _ACTIVE.get()
    if state is not None:
        retries_taken = kwargs.get("retries_taken", 0)
        if isinstance(retries_taken, int) and retries_taken > state.retries:
            await state.call.ctx.aconsume_retry()
        await state.call.ctx.aensure_active()  # a store poll awaited; then the same checks
        _before_send(state, retries_taken, drawn=True)
    stripped = strip_veronica_baggage()
    try:
        result = await wrapped(*args, **kwargs)
    except BaseException as exc:
        if state is not None:
            _note_attempt(state, exc)
        raise
    finally:
        if stripped is not None:
            otel_context.detach(stripped)  # type: ignore[arg-type]
    if state is not None:
        state.replied = True
        _tag(result, state)
    return result


# -- payloads (every parsed body and stream event) -------------------------------


def _process_response_data(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    state = _state_of(kwargs.get("response"))
    if state is not None and not state.call.done:
        try:
            _account(state, kwargs.get("data"))
        except BudgetExceededError as exc:
            # Settle before the SDK ends its span on the error we raise.
            state.call.finish(exc)
            raise
        except Exception:
            _logger.exception("reading usage from an anthropic payload failed")
    return wrapped(*args, **kwargs)


def _state_of(response: Any) -> _CallState | None:
    try:
        state = response.extensions.get(_CALL_KEY)
    except AttributeError:
        return None
    return state if isinstance(state, _CallState) else None


def _account(state: _CallState, data: Any) -> None:
    if not isinstance(data, Mapping):
        return
    kind = data.get("type")
    call = state.call
    if call.pending_attributes is not None and kind != "content_block_delta":
        response_attributes(call.pending_attributes, kind, data)
    if kind == "content_block_delta":
        _delta(state, data.get("delta"))
    elif kind == "message_start":
        _read_usage(state, get_field(data.get("message") or {}, "usage"))
    elif kind == "message_delta":
        # Its usage is cumulative and final: only now is the output known
        # (message_start's is stale), and without one the call is unreadable.
        state.output = None
        _read_usage(state, data.get("usage"))
        _apply(state)
    elif kind in ("message_stop", "message"):
        if kind == "message":  # a whole message (not streamed)
            _read_usage(state, data.get("usage"))
            _apply(state)
        # Settle now: the SDK ends its span when the body ends, right after.
        call.finish()
        return
    call.check_alive()


def _delta(state: _CallState, delta: Any) -> None:
    if isinstance(delta, Mapping) and delta.get("type") == "text_delta":
        state.call.add_text(str(delta.get("text") or ""))


def _read_usage(state: _CallState, usage: Any) -> None:
    """Keep what a usage report says; it is read as counts only in :func:`_apply`."""
    if not usage:
        return
    for key, attr in (
        ("input_tokens", "input"),
        ("cache_read_input_tokens", "cache_read"),
        ("cache_creation_input_tokens", "cache_write"),
        ("output_tokens", "output"),
    ):
        value = get_field(usage, key)
        if value is not None:  # a report may leave out what an earlier one said
            setattr(state, attr, value)
    details = get_field(usage, "output_tokens_details")
    if details:
        state.thinking = get_field(details, "thinking_tokens")


def _apply(state: _CallState) -> None:
    """Hand the final usage to the call (the price model counts cache in input).

    Only the final report counts: a stream cut before it (message_start's
    output says 1) costs the reservation. A report whose counts are missing
    or not counts is unreadable and costs the reservation too.
    """
    inp, read = token_count(state.input), token_count(state.cache_read or 0)
    write = token_count(state.cache_write or 0)
    out, thinking = token_count(state.output), token_count(state.thinking or 0)
    if inp is None or read is None or write is None or out is None or thinking is None:
        state.call.set_usage(None, None)  # unreadable: settled at the reservation
        return
    state.call.set_usage(
        inp + read + write,
        out,
        cached=read,
        reasoning=min(thinking, out),
        cache_write=write,
    )


# -- the instrumentor -------------------------------------------------------------

# Each hook and the parameters our wrapper reads (checked before any is wrapped).
_PATCHES = (
    Hook("SyncAPIClient", "_request", _request, ("cast_to", "options"), ("call",)),
    Hook("AsyncAPIClient", "_request", _arequest, ("cast_to", "options"), ("call",), True),
    Hook("SyncAPIClient", "_attempt_request", _attempt, ("options",), ("retries_taken",)),
    Hook("AsyncAPIClient", "_attempt_request", _aattempt, ("options",), ("retries_taken",), True),
    Hook("BaseClient", "_process_response_data", _process_response_data, (), ("data", "response")),
)
# Where calls are refused when the hooks do not fit: public, every API call passes.
_GUARDS = (("SyncAPIClient", ("request", "post")), ("AsyncAPIClient", ("request", "post")))
_HOOKS = SDKHooks(_instruments[0], _MODULE, _PATCHES, _GUARDS)


class AnthropicInstrumentor(GuardedInstrumentor):
    """Contains every ``messages.create`` call of the ``anthropic`` SDK in the active chain.

    ``instrument()`` raises :class:`~veronica_otel.instrumentors.InstrumentationError`
    when the installed ``anthropic`` is outside the tested range or a hook changed;
    nothing is patched and calls in a chain are refused (fail closed).
    """

    _hooks = _HOOKS

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments
