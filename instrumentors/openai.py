"""Containment for the ``openai`` SDK (3.x).

Usage::

    from veronica_otel.instrumentors.openai import OpenAIInstrumentor

    OpenAIInstrumentor().instrument()
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)):
        client.chat.completions.create(...)   # raises BudgetExceededError when over

Configuration: limits come from the active :class:`ExecutionContext`, else the
process default chain (zero-code: ``VERONICA_*`` variables). With neither,
calls pass through untouched.

Where it hooks (every HTTP API call of the SDK passes through these, including
``parse`` helpers that bypass ``create``):

- ``SyncAPIClient.request`` / ``AsyncAPIClient.request``: once per API call.
  Opens the GenAI span, runs the pre-call check, clamps the output cap when
  the request sets none, swaps in a fallback model, settles the call.
- ``SyncAPIClient._sleep_for_retry`` / ``AsyncAPIClient._sleep_for_retry``:
  the SDK's request loop calls it before every internal retry and nowhere
  else. A retry over ``max_retries_total`` is refused before its backoff is
  slept, and the deadline and sticky trips are re-checked after it, so a retry
  never leaves after the chain stopped. The first attempt was checked at
  admission, so the success path pays no per-attempt hook.
- ``BaseClient._process_response_data``: every parsed payload, stream events
  included. Records usage, keeps streamed text, and cuts a stream at the next
  chunk once the chain trips or its deadline passes. A payload parsed inside
  ``request()`` belongs to the call in flight; a stream or raw response read
  later finds its call on its HTTP request (bound when ``request()`` returns).

A streamed call is settled when its HTTP response closes, whoever closes it:
the end of the stream, a cut, ``close()``, or the ``stream()`` helpers, which
close the response directly.

What a call that did not end well costs (DESIGN G10) is read without a hook
on the success path: the retry hook sees each retried attempt's error (an
HTTP reply, or the transport error being handled) and the last attempt is
read from how ``request()`` ended. A connection never made (``ConnectError``,
``ConnectTimeout``, ``PoolTimeout``) was not sent; an ``APIStatusError`` is a
reply, billed nothing; anything else once the send began (a timeout, a lost
connection, a cancellation, KeyboardInterrupt) may have reached the provider
and costs the reservation. An interrupt or cancellation is placed by its
traceback: raised inside ``_send_request`` or ``_process_response`` means
after the request may have left, anywhere else means before.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import weakref
from collections.abc import AsyncIterator, Collection, Iterator, Mapping
from typing import Any, NamedTuple

import httpx2
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span

from veronica_otel._agents import current_agent
from veronica_otel._context import ExecutionContext
from veronica_otel._errors import BudgetExceededError
from veronica_otel._gc_safe import defer
from veronica_otel._propagation import default_context

from ._admit import CallSpec, aadmit, admit, input_bound
from ._breakers import never_connected, raised_within
from ._common import (
    AsyncContainedStream,
    ContainedCall,
    ContainedStream,
    get_field,
    make_current,
    start_span,
    strip_veronica_baggage,
)
from ._hooks import GuardedInstrumentor, Hook, SDKHooks
from ._openai_attributes import request_attributes, response_attributes, stream_attributes

__all__ = ["OpenAIInstrumentor"]

_logger = logging.getLogger(__name__)
_instruments = ("openai >= 3.0, < 4",)
PROVIDER = "openai"
_CALL_KEY = "veronica.call"

# path suffix -> (GenAI operation, input keys, output-cap keys, the first is the one we
# set). Tool definitions are rendered into the prompt and billed as input tokens.
_ROUTES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "/chat/completions": (
        "chat",
        ("messages", "tools", "functions"),
        ("max_completion_tokens", "max_tokens"),
    ),
    "/responses": ("chat", ("instructions", "input", "tools"), ("max_output_tokens",)),
    "/completions": ("text_completion", ("prompt", "suffix"), ("max_tokens",)),
    "/embeddings": ("embeddings", ("input",), ()),
}
# Streamed deltas whose bytes bound the output tokens when no usage arrives.
_RESPONSES_DELTAS = frozenset(
    (
        "response.output_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
    )
)
_FINAL_EVENTS = frozenset(("response.completed", "response.incomplete", "response.failed"))


class _CallState:
    """One contained API call, as the per-attempt and per-payload hooks see it."""

    __slots__ = ("baggage", "call", "replied", "retries", "span_token", "streamed")

    def __init__(self, call: ContainedCall, streamed: bool, span_token: object) -> None:
        self.call = call
        self.streamed = streamed
        self.retries = 0  # highest retries_taken already drawn from the chain
        self.span_token = span_token  # our span is current from admission to return
        # What earlier attempts did, as the retry hook saw them (attempts lost
        # unanswered are counted on the call): nothing is tracked on the success
        # path, the last attempt is read from how the call ended.
        self.replied = False  # an HTTP reply came back (an error status: retried)
        self.baggage: otel_context.Context | None = None  # where to look for ours to strip


_ACTIVE: contextvars.ContextVar[_CallState | None] = contextvars.ContextVar(
    "veronica_openai_call", default=None
)


# -- admission (once per API call) -------------------------------------------------


_Route = tuple[str, tuple[str, ...], tuple[str, ...]]
_ROUTE_CACHE: dict[str, _Route | None] = {}
_ROUTE_CACHE_MAX = 256  # URLs are the SDK's paths; a bound in case a caller builds many


def _route(options: Any) -> _Route | None:
    method = options.method
    if method != "post" and str(method).lower() != "post":
        return None
    url = options.url
    try:
        return _ROUTE_CACHE[url]
    except (KeyError, TypeError):  # new, or not a str
        pass
    path = str(url).split("?", 1)[0]
    found: _Route | None = None
    for suffix, route in _ROUTES.items():  # "/chat/completions" is tried first
        if path.endswith(suffix):
            found = route
            break
    if type(url) is str:
        if len(_ROUTE_CACHE) >= _ROUTE_CACHE_MAX:
            _ROUTE_CACHE.clear()
        _ROUTE_CACHE[url] = found
    return found


def _body(options: Any) -> dict[str, Any]:
    # What goes on the wire: the user's extra_body is merged over the body.
    json_data = options.json_data
    extra = options.extra_json
    if type(json_data) is dict and extra is None:
        return json_data  # the common case: read-only here, so no copy
    json_data = json_data if _is_mapping(json_data) else {}
    extra = extra if _is_mapping(extra) else {}
    return {**json_data, **extra}


def _set_body(options: Any, key: str, value: object) -> None:
    # The SDK shares one json_data dict across attempts and merges the user's
    # extra_body over it: replace both, never mutate the caller's dicts.
    if isinstance(options.json_data, Mapping):
        options.json_data = {**options.json_data, key: value}
    if isinstance(options.extra_json, Mapping) and key in options.extra_json:
        options.extra_json = {**options.extra_json, key: value}


def _requested_cap(body: Mapping[str, Any], cap_keys: tuple[str, ...]) -> tuple[int | None, str]:
    """The output cap the request sets and the key it sets it under."""
    for key in cap_keys:
        value = body.get(key)
        if value is not None and (
            type(value) is int or (isinstance(value, int) and not isinstance(value, bool))
        ):
            return value, key
    return None, cap_keys[0] if cap_keys else ""


def _choices(body: Mapping[str, Any], operation: str) -> int:
    if ("n" not in body and "best_of" not in body) or operation == "embeddings":
        return 1
    # Legacy completions generate ``best_of`` candidates server-side and bill them all.
    most = 1
    for key in ("n", "best_of"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > most:
            most = value
    return most


def _prepare(options: Any, stream_kwarg: bool, client: Any) -> _CallState | None:
    """Admit the call described by ``options``; None when it is not ours to contain."""
    request = _describe(options, stream_kwarg)
    if request is None:
        return None
    # Current from here until the request returns (one attach for both): a
    # denial's trip event lands on this span, and HTTP spans nest under it.
    span_token = make_current(request.span, request.current)
    try:
        admitted = admit(request.ctx, request.span, request.owns, request.spec)
        return _prepared(options, client, request, admitted, span_token)
    except BaseException:
        if span_token is not None:
            otel_context.detach(span_token)
        raise


async def _aprepare(options: Any, stream_kwarg: bool, client: Any) -> _CallState | None:
    """:func:`_prepare` for the async client: a shared store is awaited (``aadmit``)."""
    request = _describe(options, stream_kwarg)
    if request is None:
        return None
    span_token = make_current(request.span, request.current)
    try:
        admitted = await aadmit(request.ctx, request.span, request.owns, request.spec)
        return _prepared(options, client, request, admitted, span_token)
    except BaseException:
        if span_token is not None:
            otel_context.detach(span_token)
        raise


def _prepared(
    options: Any,
    client: Any,
    request: _Request,
    admitted: tuple[ContainedCall, int | None, str | None],
    span_token: object,
) -> _CallState:
    """Put the clamp and fallback into the request; the call's state."""
    call, clamp, fallback = admitted
    body = request.body
    _rewrite(options, request.cap_keys, body, clamp, fallback)
    if call.pending_attributes is not None:  # our own span records
        request_attributes(call.pending_attributes, body, client)
    state = _CallState(call, request.spec.stream, span_token)
    state.baggage = request.current
    return state


class _Request(NamedTuple):
    """A call described once: the kernel's description of it (``spec``), its
    span, and what rewriting the request needs."""

    ctx: ExecutionContext
    spec: CallSpec
    span: Span
    owns: bool  # our span (False: a peer instrumentor's span carries ours)
    cap_keys: tuple[str, ...]
    body: dict[str, Any]
    current: otel_context.Context  # the OpenTelemetry context, read once


def _describe(options: Any, stream_kwarg: bool) -> _Request | None:
    """What admitting the call needs, and its span (not yet current); None: not ours."""
    route = _route(options)
    if route is None:
        return None
    # The OpenTelemetry context, read once: the chain, the current span,
    # suppression and baggage all come from it.
    current = otel_context.get_current()
    ctx = default_context(current)
    if ctx is None:
        return None
    operation, input_keys, cap_keys = route
    body = _body(options)
    model = body.get("model")
    if type(model) is not str or not model:
        model = str(model or "unknown")
    parts = [part for part in map(body.get, input_keys) if part is not None]
    messages = body.get("messages")
    agent = current_agent() if ctx.names_agents else None
    spec = CallSpec(
        PROVIDER,
        operation,
        model,
        input_bound(parts, len(messages) if type(messages) is list else 1),
        _requested_cap(body, cap_keys)[0],
        bool(cap_keys),
        _choices(body, operation),
        stream_kwarg or body.get("stream") is True,
        agent,
        parts,
    )
    peer = _peer_span(operation, agent, current)
    span = peer if peer is not None else start_span(operation, PROVIDER, model, agent, current)
    return _Request(ctx, spec, span, peer is None, cap_keys, body, current)


def _rewrite(
    options: Any,
    cap_keys: tuple[str, ...],
    body: Mapping[str, Any],
    clamp: int | None,
    fallback: str | None,
) -> None:
    """Put the clamp and the fallback model into the request."""
    if clamp is not None:
        # Into the key the caller used (chat has two names for it): never add the other.
        _set_body(options, _requested_cap(body, cap_keys)[1], clamp)
    if fallback is not None:
        _set_body(options, "model", fallback)


# -- settlement ----------------------------------------------------------------------


def _peer_span(operation: str, agent: str | None, current: otel_context.Context) -> Any:
    """A peer GenAI instrumentor's span for this very call, when one is current.

    The official ``opentelemetry-instrumentation-openai-v2``, OpenLLMetry and
    openlit wrap ``create()``, above our hook: their CLIENT span for the same
    operation is current here. Our attributes go on it and it stays theirs
    to end, so the call is described once. Anything else (no span, another
    operation, a span already used for one of our calls): None, our own span.
    """
    span = trace.get_current_span(current)
    if not span.is_recording() or getattr(span, "kind", None) is not trace.SpanKind.CLIENT:
        return None
    attributes = getattr(span, "attributes", None) or {}
    if "veronica.chain.id" in attributes:
        return None
    scope = getattr(span, "instrumentation_scope", None)
    if scope is not None and scope.name.startswith("veronica_otel"):
        return None
    if attributes.get("gen_ai.operation.name", attributes.get("llm.request.type")) != operation:
        return None
    if agent is not None:
        span.set_attribute("gen_ai.agent.name", agent)
    return span


def _stream_error(exc: BaseException | None) -> BaseException | None:
    """The error a response closed under, if it ended the call (not a user's own)."""
    if isinstance(exc, (BudgetExceededError, httpx2.HTTPError)):
        return exc
    from openai import OpenAIError

    return exc if isinstance(exc, OpenAIError) else None


class _SettleOnClose(httpx2.SyncByteStream):
    """A response body that settles its call when the response is closed."""

    def __init__(self, inner: httpx2.SyncByteStream, call: ContainedCall) -> None:
        self._inner = inner
        self._call = call

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._inner)

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            # Closed from a generator's ``finally`` or an ``except`` block: the
            # exception in flight is why the stream ended.
            self._call.finish(_stream_error(sys.exc_info()[1]))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)


class _ASettleOnClose(httpx2.AsyncByteStream):
    """The async twin of :class:`_SettleOnClose`."""

    def __init__(self, inner: httpx2.AsyncByteStream, call: ContainedCall) -> None:
        self._inner = inner
        self._call = call

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._inner.__aiter__()

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            await self._call.afinish(_stream_error(sys.exc_info()[1]))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)


def _settle_on_close(call: ContainedCall, response: Any) -> None:
    if not isinstance(response, httpx2.Response) or response.is_closed:
        return
    body = response.stream
    if isinstance(body, httpx2.SyncByteStream):
        response.stream = _SettleOnClose(body, call)
    elif isinstance(body, httpx2.AsyncByteStream):
        response.stream = _ASettleOnClose(body, call)


_RESULT_TYPES: tuple[Any, Any, Any] | None = None


def _result_types() -> tuple[Any, Any, Any]:
    # Looked up on first use, not at import: the zero-code hook instruments
    # while `openai` itself is still being imported (these are not bound yet).
    global _RESULT_TYPES
    if _RESULT_TYPES is None:
        from openai import AsyncStream, Stream
        from pydantic import BaseModel

        _RESULT_TYPES = (Stream, AsyncStream, BaseModel)
    return _RESULT_TYPES


_MODEL_TYPES: set[type] = set()  # response model classes seen (a few per process)


def _bind(state: _CallState, response: httpx2.Response) -> None:
    """Let the payload hook find ``state`` when ``response`` is read after ``request()``."""
    try:
        request = response.request
    except RuntimeError:  # a response built without a request
        return
    request.extensions = {**request.extensions, _CALL_KEY: state}


def _settle_failed(state: _CallState, result: Any) -> Any:
    """:func:`_settle` raised (our bug): commit the reservation, hand back the reply."""
    _logger.exception("settling an openai call failed; its reservation is committed")
    state.call.finish()
    return result


def _settle(state: _CallState, result: Any) -> Any:
    """Settle a call that returned, now or when its body is read."""
    call = state.call
    if type(result) in _MODEL_TYPES or result is None or call.usage_seen:
        call.finish()  # the common case: a parsed model, usage already read
        return result
    Stream, AsyncStream, BaseModel = _result_types()
    if isinstance(result, BaseModel):
        if len(_MODEL_TYPES) < 256:  # pydantic isinstance is a Python-level ABC check
            _MODEL_TYPES.add(type(result))
        call.finish()  # the common case: a parsed model, usage already read
        return result
    if isinstance(result, Stream):
        _bind(state, result.response)
        _settle_on_close(call, result.response)
        return ContainedStream(result, call, _no_item)
    if isinstance(result, AsyncStream):
        _bind(state, result.response)
        _settle_on_close(call, result.response)
        return AsyncContainedStream(result, call, _no_item)
    # A raw response (with_raw_response / with_streaming_response).
    http_response = getattr(result, "http_response", None)
    if isinstance(http_response, httpx2.Response):
        _bind(state, http_response)
        if state.streamed:
            _settle_on_close(call, http_response)
        elif http_response.is_closed:
            # The body is already read: account it now, whether or not the
            # caller ever parses it.
            try:
                _account(state, http_response.json())
            except Exception:
                _logger.debug("no usage in a raw openai response body", exc_info=True)
            if call.usage_seen:
                call.finish()
                return result
    # Otherwise the payload hook settles it when its body is parsed, or
    # garbage collection does (committing the reservation's bound).
    try:
        weakref.finalize(result, defer, call.finish)
    except TypeError:
        call.finish()
    return result


def _no_item(call: ContainedCall, item: Any) -> None:
    """Stream items are accounted in the payload hook, which sees raw dicts."""


# -- wrappers ------------------------------------------------------------------------


def _options_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[1] if len(args) > 1 else kwargs.get("options")


# Where the SDK's request loop sends an attempt and reads its reply: an error
# raised inside either (an interrupt, a cancellation, garbage) came after the
# request may have left.
_SENDING = frozenset(("_send_request", "_process_response"))


def _note_attempt(state: _CallState, error: BaseException | None) -> None:
    """Record what one failed attempt says about the provider (from its error)."""
    from openai import APIConnectionError, APIStatusError

    if isinstance(error, APIStatusError):
        state.replied = True
    elif error is None:
        state.call.lost_attempts += 1  # no error to read: assume the worst
    elif isinstance(error, BudgetExceededError) or never_connected(error):
        return  # refused by us, or no connection was ever made: not sent
    elif (
        isinstance(error, APIConnectionError)  # a timeout or a connection lost mid-request
        or type(error).__module__.split(".", 1)[0] in _TRANSPORT_MODULES
        or raised_within(error, _SENDING)
    ):
        state.call.lost_attempts += 1


# The retry hook sees the transport's own error, before the SDK wraps it.
_TRANSPORT_MODULES = frozenset(("httpx2", "httpx", "httpcore", "ssl", "anyio"))


def _fail(state: _CallState, error: BaseException) -> None:
    """Settle a call that raised, by what its attempts may have cost (DESIGN G10)."""
    call = state.call
    try:
        _note_attempt(state, error)
    except Exception:  # classification must never leave the call unsettled
        _logger.exception("classifying an openai error failed")
        call.lost_attempts += 1
    lost = call.lost_attempts > 0
    call.finish(error, sent=lost or state.replied, billed=lost)


def _request(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    state = _prepare(_options_of(args, kwargs), bool(kwargs.get("stream")), instance)
    if state is None:
        return wrapped(*args, **kwargs)
    active = _ACTIVE.set(state)
    stripped = strip_veronica_baggage(state.baggage)
    try:
        result = wrapped(*args, **kwargs)
    except BaseException as exc:
        _fail(state, exc)
        raise
    finally:
        if stripped is not None:
            otel_context.detach(stripped)  # type: ignore[arg-type]
        _ACTIVE.reset(active)
        if state.span_token is not None:
            otel_context.detach(state.span_token)  # type: ignore[arg-type]
    try:
        return _settle(state, result)
    except Exception:
        return _settle_failed(state, result)


async def _arequest(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    state = await _aprepare(_options_of(args, kwargs), bool(kwargs.get("stream")), instance)
    if state is None:
        return await wrapped(*args, **kwargs)
    active = _ACTIVE.set(state)
    stripped = strip_veronica_baggage(state.baggage)
    call = state.call
    try:
        result = await wrapped(*args, **kwargs)
    except BaseException as exc:
        call.defer_settlement()  # decided by the sync code, then awaited
        try:
            _fail(state, exc)
        finally:
            await call.settle_deferred()
        raise
    finally:
        if stripped is not None:
            otel_context.detach(stripped)  # type: ignore[arg-type]
        _ACTIVE.reset(active)
        if state.span_token is not None:
            otel_context.detach(state.span_token)  # type: ignore[arg-type]
    call.defer_settlement()
    try:
        result = _settle(state, result)
    except Exception:
        result = _settle_failed(state, result)
    finally:
        await call.settle_deferred()
    return result


def _draw_retry(state: _CallState, attempt: int) -> None:
    """Draw the retry that makes attempt ``attempt`` from ``max_retries_total``."""
    call = state.call
    while state.retries < attempt:
        call.ctx.consume_retry()  # raises BudgetExceededError: the SDK loop stops
        state.retries += 1
    if call.span.is_recording():
        call.span.set_attribute("veronica.retries", state.retries)


def _retry_state(kwargs: dict[str, Any]) -> _CallState | None:
    """Note the failed attempt, then draw the coming retry from the chain.

    The SDK calls its retry sleep inside the ``except`` for a timeout or a
    connection error (``response=None``; the error is the one being handled),
    or after an HTTP error reply (``response=`` that reply).
    """
    state = _ACTIVE.get()
    if state is not None:
        _note_retry(state, kwargs)
        _draw_retry(state, int(kwargs.get("retries_taken", 0)) + 1)
        state.call.check_alive()  # a retry is a new dispatch: any trip stops it
    return state


def _note_retry(state: _CallState, kwargs: dict[str, Any]) -> None:
    if kwargs.get("response") is not None:
        state.replied = True
    else:
        _note_attempt(state, sys.exc_info()[1])


def _sleep_for_retry(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    state = _retry_state(kwargs)
    result = wrapped(*args, **kwargs)
    if state is not None:
        state.call.check_alive()  # the deadline may have passed while backing off
    return result


async def _asleep_for_retry(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    state = _ACTIVE.get()
    if state is not None:
        # As _retry_state, the retries drawn with the store awaited.
        _note_retry(state, kwargs)
        attempt = int(kwargs.get("retries_taken", 0)) + 1
        while state.retries < attempt:
            await state.call.ctx.aconsume_retry()
            state.retries += 1
        _draw_retry(state, attempt)  # drawn already: the count goes on the span
        await state.call.ctx.aensure_active()
    result = await wrapped(*args, **kwargs)
    if state is not None:
        await state.call.ctx.aensure_active()
    return result


def _process_response_data(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    try:  # the call _bind put on a response read after request() returned
        state = kwargs["response"].request.extensions.get(_CALL_KEY)
    except (KeyError, AttributeError, RuntimeError):
        state = None
    later = type(state) is _CallState  # bound by _settle: read after request() returned
    if not later:
        state = _ACTIVE.get()  # parsed inside request(): the call in flight
    if state is not None and not state.call.done:
        try:
            _account(state, kwargs.get("data"))
        except BudgetExceededError:
            raise  # cuts the stream: its generator closes the response
        except Exception:
            _logger.exception("reading usage from an openai payload failed")
        call = state.call
        if later and call.usage_seen and not state.streamed:
            call.finish()  # a raw response parsed after request() returned
    return wrapped(*args, **kwargs)


# -- payloads ------------------------------------------------------------------------


def _account(state: _CallState, data: Any) -> None:
    if type(data) is not dict and not isinstance(data, Mapping):
        return
    call = state.call
    pending = call.pending_attributes
    if not state.streamed:
        _usage(call, data.get("usage"))
        if pending is not None:
            response_attributes(pending, data)
        return
    if pending is not None:
        stream_attributes(pending, data)
    kind = data.get("type")
    if isinstance(kind, str):  # a Responses stream event
        if kind == "response.output_text.delta":
            call.add_text(str(data.get("delta") or ""))
        elif kind in _RESPONSES_DELTAS:
            _add_output_bytes(call, data.get("delta"))
        elif kind in _FINAL_EVENTS:
            _usage(call, get_field(data.get("response") or {}, "usage"))
    else:  # a chat or legacy completions chunk
        for choice in data.get("choices") or ():
            if not isinstance(choice, Mapping):
                continue
            text = choice.get("text")  # legacy completions
            if text:
                call.add_text(str(text))
            delta = choice.get("delta")
            if isinstance(delta, Mapping):
                if delta.get("content"):
                    call.add_text(str(delta["content"]))
                _add_output_bytes(call, delta.get("refusal"))
                for tool_call in delta.get("tool_calls") or ():
                    function = get_field(tool_call, "function") or {}
                    _add_output_bytes(call, get_field(function, "name"))
                    _add_output_bytes(call, get_field(function, "arguments"))
        _usage(call, data.get("usage"))
    call.check_alive()


def _add_output_bytes(call: ContainedCall, text: Any) -> None:
    """Output that is not the reply's text still bounds the output tokens."""
    if isinstance(text, str) and text:
        call.text_bytes += len(text.encode("utf-8"))


def _is_mapping(value: object) -> bool:
    # Payloads are plain dicts: skip the ABC check (slow next to the rest).
    return type(value) is dict or isinstance(value, Mapping)


def _usage(call: ContainedCall, usage: Any) -> None:
    """Read a usage report; one that is null, empty or not a mapping is not usage.

    A report missing its counts is unreadable (the call then costs its
    reservation), never zero. Embeddings report no completion tokens: their
    output is ``total_tokens - prompt_tokens``.
    """
    # Type checks inline (no _is_mapping frames): every reply passes here.
    if not usage or (type(usage) is not dict and not isinstance(usage, Mapping)):
        return
    get = usage.get
    if "prompt_tokens" in usage:  # chat, completions, embeddings
        inp, out = get("prompt_tokens"), get("completion_tokens")
        if out is None and "completion_tokens" not in usage:
            total = get("total_tokens")
            out = total - inp if type(total) is int and type(inp) is int else None
        details_in = get("prompt_tokens_details")
        details_out = get("completion_tokens_details")
    else:  # responses
        inp, out = get("input_tokens"), get("output_tokens")
        details_in = get("input_tokens_details")
        details_out = get("output_tokens_details")
    cached = reasoning = cache_write = None
    if details_in and (type(details_in) is dict or isinstance(details_in, Mapping)):
        cached = details_in.get("cached_tokens")
        cache_write = details_in.get("cache_write_tokens")
    if details_out and (type(details_out) is dict or isinstance(details_out, Mapping)):
        reasoning = details_out.get("reasoning_tokens")
    call.set_usage(inp, out, cached, reasoning, cache_write)


# Each hook and the parameters our wrapper reads (checked before any is wrapped).
_PATCHES = (
    Hook("SyncAPIClient", "request", _request, ("cast_to", "options"), ("stream",)),
    Hook("AsyncAPIClient", "request", _arequest, ("cast_to", "options"), ("stream",), True),
    Hook("SyncAPIClient", "_sleep_for_retry", _sleep_for_retry, (), ("retries_taken",)),
    Hook("AsyncAPIClient", "_sleep_for_retry", _asleep_for_retry, (), ("retries_taken",), True),
    Hook("BaseClient", "_process_response_data", _process_response_data, (), ("data", "response")),
)
# Where calls are refused when the hooks do not fit: public, every API call passes.
_GUARDS = (("SyncAPIClient", ("request", "post")), ("AsyncAPIClient", ("request", "post")))
_HOOKS = SDKHooks(_instruments[0], "openai._base_client", _PATCHES, _GUARDS)


class OpenAIInstrumentor(GuardedInstrumentor):
    """Contains every HTTP API call of the ``openai`` SDK in the active chain.

    ``instrument()`` raises :class:`~veronica_otel.instrumentors.InstrumentationError`
    when the installed ``openai`` is outside the tested range or a hook changed;
    nothing is patched and calls in a chain are refused (fail closed).
    """

    _hooks = _HOOKS

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments
