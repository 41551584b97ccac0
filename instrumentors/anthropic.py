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
from veronica_otel._errors import BudgetExceededError
from veronica_otel._gc_safe import defer
from veronica_otel._propagation import default_context

from ._common import (
    AsyncContainedStream,
    ContainedCall,
    ContainedStream,
    admit,
    get_field,
    start_span,
    strip_veronica_baggage,
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
        "cache_read",
        "cache_write",
        "call",
        "final",
        "input",
        "output",
        "retries",
        "sent",
        "streamed",
        "thinking",
        "usage_seen",
    )

    def __init__(self, call: ContainedCall) -> None:
        self.call = call
        self.retries = 0  # highest retries_taken already drawn from the chain
        self.sent = False  # an HTTP attempt passed our checks and went to the SDK
        self.input = 0  # Anthropic's input_tokens: without cache reads and writes
        self.cache_read = 0
        self.cache_write = 0
        self.output = 0  # reported output tokens (cumulative in a stream)
        self.thinking = 0
        self.streamed = 0  # UTF-8 bytes of streamed deltas: a bound on output tokens
        self.final = False  # the final usage (message_delta or a whole message) arrived
        self.usage_seen = False


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


def _begin(options: Any, sdk_call: Any) -> _CallState | None:
    """Admit a ``messages.create`` call; None when it is not ours to contain."""
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
    span: Span | None = getattr(sdk_call, "span", None) if sdk_call is not None else None
    owns = span is None
    if span is None:
        # The SDK's tracing is off: our own span. Suppression hides it, never the check.
        agent = current_agent() if ctx.tracks_handoffs else None
        span = start_span("chat", PROVIDER, model, agent) if is_instrumentation_enabled() else None
        span = span if span is not None else trace.INVALID_SPAN
    # Else the SDK's span is already current: no second span, our attributes go on it.
    scope = (
        trace.use_span(
            span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        )
        if owns
        else contextlib.nullcontext()
    )
    with scope:
        call, clamp, fallback = admit(
            ctx,
            span,
            owns,
            provider=PROVIDER,
            operation="chat",
            model=model,
            input_parts=parts,
            n_messages=n_messages,
            requested_cap=requested,
            clampable=True,
        )
    changes: dict[str, object] = {}
    if clamp is not None:
        changes["max_tokens"] = clamp
    if fallback is not None:
        changes["model"] = fallback
    if changes:
        # Every attempt shares this dict through shallow copies: replace it.
        options.json_data = {**body, **changes}
    return _CallState(call)


def _fail(state: _CallState, error: BaseException) -> None:
    if not state.sent:
        # Denied before its first send (say, a trip elsewhere in the chain
        # after this call was admitted): never dispatched, so no step either.
        state.call.handle.finish(error, sent=False)
    state.call.finish(error)


def _settle(state: _CallState, result: Any) -> Any:
    from anthropic import AsyncStream, Stream
    from pydantic import BaseModel

    call = state.call
    if not state.sent:  # a middleware answered without sending
        call.handle.finish(sent=False)
    if isinstance(result, Stream):
        return ContainedStream(result, call, _no_item)
    if isinstance(result, AsyncStream):
        return AsyncContainedStream(result, call, _no_item)
    if call.done or result is None or isinstance(result, BaseModel):
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
    state = _begin(options, kwargs.get("call"))
    active = _ACTIVE.set(state)  # None for calls we do not contain: no stale parent
    if state is None:
        try:
            return wrapped(*args, **kwargs)
        finally:
            _ACTIVE.reset(active)
    call = state.call
    span_token = (
        otel_context.attach(trace.set_span_in_context(call.span)) if call.owns_span else None
    )
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
    return _settle(state, result)


async def _arequest(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    options = args[1] if len(args) > 1 else kwargs.get("options")
    state = _begin(options, kwargs.get("call"))
    active = _ACTIVE.set(state)
    if state is None:
        try:
            return await wrapped(*args, **kwargs)
        finally:
            _ACTIVE.reset(active)
    call = state.call
    span_token = (
        otel_context.attach(trace.set_span_in_context(call.span)) if call.owns_span else None
    )
    try:
        delay_ms = call.handle.decision.rate_limit_ms
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        result = await wrapped(*args, **kwargs)
    except BaseException as exc:
        _fail(state, exc)
        raise
    finally:
        if span_token is not None:
            otel_context.detach(span_token)
        _ACTIVE.reset(active)
    return _settle(state, result)


# -- attempts (once per HTTP send) ---------------------------------------------


def _before_send(state: _CallState, retries_taken: object) -> None:
    call = state.call
    if isinstance(retries_taken, int) and retries_taken > state.retries:
        # An SDK-internal retry is about to be sent: it draws on the chain's
        # retry budget. Raising here (no __cause__) stops the SDK loop unsent.
        state.retries = retries_taken
        call.ctx.consume_retry()
        if call.span.is_recording():
            call.span.set_attribute("veronica.retries", retries_taken)
    call.check_alive()
    state.sent = True


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
    finally:
        if stripped is not None:
            otel_context.detach(stripped)  # type: ignore[arg-type]
    if state is not None:
        _tag(result, state)
    return result


async def _aattempt(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    state = _ACTIVE.get()
    if state is not None:
        _before_send(state, kwargs.get("retries_taken", 0))
    stripped = strip_veronica_baggage()
    try:
        result = await wrapped(*args, **kwargs)
    finally:
        if stripped is not None:
            otel_context.detach(stripped)  # type: ignore[arg-type]
    if state is not None:
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
    if kind == "content_block_delta":
        _delta(state, data.get("delta"))
    elif kind == "message_start":
        _read_usage(state, get_field(data.get("message") or {}, "usage"))
    elif kind == "message_delta":
        state.final = True  # its usage is cumulative: it replaces message_start's
        _read_usage(state, data.get("usage"))
    elif kind in ("message_stop", "message"):
        if kind == "message":  # a whole message (not streamed)
            state.final = True
            _read_usage(state, data.get("usage"))
        # Settle now: the SDK ends its span when the body ends, right after.
        call.finish()
        return
    call.check_alive()


def _delta(state: _CallState, delta: Any) -> None:
    if not isinstance(delta, Mapping):
        return
    call = state.call
    if delta.get("type") == "text_delta":
        before = call.text_bytes
        call.add_text(str(delta.get("text") or ""))
        size = call.text_bytes - before
    else:  # thinking, signature, tool input JSON, citations: output too
        size = sum(
            len(value.encode("utf-8"))
            for key, value in delta.items()
            if key != "type" and isinstance(value, str)
        )
    if size and not state.final:
        state.streamed += size
        if state.usage_seen:
            _apply(state)


def _read_usage(state: _CallState, usage: Any) -> None:
    if not usage:
        return
    for key, attr in (
        ("input_tokens", "input"),
        ("cache_read_input_tokens", "cache_read"),
        ("cache_creation_input_tokens", "cache_write"),
        ("output_tokens", "output"),
    ):
        value = get_field(usage, key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            setattr(state, attr, value)
    thinking = get_field(get_field(usage, "output_tokens_details") or {}, "thinking_tokens")
    if isinstance(thinking, int) and not isinstance(thinking, bool) and thinking >= 0:
        state.thinking = thinking
    state.usage_seen = True
    _apply(state)


def _apply(state: _CallState) -> None:
    """Hand the usage so far to the call (totals; the price model counts cache in input)."""
    output = state.output
    if not state.final:
        # Mid-stream the reported output is stale (message_start says 1):
        # bound it by the bytes received, within the cap, so a cut is not free.
        streamed = state.streamed
        cap = state.call.output_cap
        output = max(output, streamed if cap is None else min(streamed, cap))
    state.call.set_usage(
        state.input + state.cache_read + state.cache_write,
        output,
        cached=state.cache_read,
        reasoning=min(state.thinking, output),
        cache_write=state.cache_write,
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
