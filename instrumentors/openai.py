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
  before each SDK-internal retry, so a retry over ``max_retries_total`` is
  refused before its backoff is slept.
- ``BaseClient._build_request``: once per HTTP attempt, before sending. The
  deadline and sticky trips are re-checked, so a retry never leaves after the
  chain stopped.
- ``BaseClient._process_response_data``: every parsed payload, stream events
  included. Records usage, keeps streamed text, and cuts a stream at the next
  chunk once the chain trips or its deadline passes.

A streamed call is settled when its HTTP response closes, whoever closes it:
the end of the stream, a cut, ``close()``, or the ``stream()`` helpers, which
close the response directly.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import weakref
from collections.abc import AsyncIterator, Collection, Iterator, Mapping
from typing import Any

import httpx2
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)
from opentelemetry.instrumentation.utils import unwrap
from wrapt import wrap_function_wrapper

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

__all__ = ["OpenAIInstrumentor"]

_logger = logging.getLogger(__name__)
_instruments = ("openai >= 3.0",)
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

    __slots__ = ("call", "retries", "span_token", "streamed")

    def __init__(self, call: ContainedCall, streamed: bool, span_token: object) -> None:
        self.call = call
        self.streamed = streamed
        self.retries = 0  # highest retries_taken already drawn from the chain
        self.span_token = span_token  # our span is current from admission to return


_ACTIVE: contextvars.ContextVar[_CallState | None] = contextvars.ContextVar(
    "veronica_openai_call", default=None
)


# -- admission (once per API call) -------------------------------------------------


def _route(options: Any) -> tuple[str, tuple[str, ...], tuple[str, ...]] | None:
    if str(getattr(options, "method", "")).lower() != "post":
        return None
    path = str(getattr(options, "url", "")).split("?", 1)[0]
    for suffix, route in _ROUTES.items():  # "/chat/completions" is tried first
        if path.endswith(suffix):
            return route
    return None


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
        if isinstance(value, int) and not isinstance(value, bool):
            return value, key
    return None, cap_keys[0] if cap_keys else ""


def _choices(body: Mapping[str, Any], operation: str) -> int:
    if operation == "embeddings":
        return 1
    # Legacy completions generate ``best_of`` candidates server-side and bill them all.
    most = 1
    for key in ("n", "best_of"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > most:
            most = value
    return most


def _prepare(options: Any, stream_kwarg: bool) -> _CallState | None:
    """Admit the call described by ``options``; None when it is not ours to contain."""
    route = _route(options)
    if route is None:
        return None
    ctx = default_context()
    if ctx is None:
        return None
    operation, input_keys, cap_keys = route
    body = _body(options)
    model = str(body.get("model") or "unknown")
    parts = [body.get(k) for k in input_keys if body.get(k) is not None]
    messages = body.get("messages")
    n_messages = len(messages) if isinstance(messages, list) else 1
    cap, cap_key = _requested_cap(body, cap_keys)
    agent = current_agent() if ctx.tracks_handoffs else None
    span = start_span(operation, PROVIDER, model, agent)
    # Current from here until the request returns (one attach for both): a
    # denial's trip event lands on this span, and HTTP spans nest under it.
    span_token = otel_context.attach(trace.set_span_in_context(span))
    try:
        call, clamp, fallback = admit(
            ctx,
            span,
            True,
            provider=PROVIDER,
            operation=operation,
            model=model,
            input_parts=parts,
            n_messages=n_messages,
            requested_cap=cap,
            clampable=bool(cap_keys),
            choices=_choices(body, operation),
        )
        if clamp is not None:
            # Into the key the caller used (chat has two names for it): never add the other.
            _set_body(options, cap_key, clamp)
        if fallback is not None:
            _set_body(options, "model", fallback)
    except BaseException:
        otel_context.detach(span_token)
        raise
    return _CallState(call, stream_kwarg or body.get("stream") is True, span_token)


# -- settlement ----------------------------------------------------------------------


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
            self._call.finish(_stream_error(sys.exc_info()[1]))

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


def _settle(state: _CallState, result: Any) -> Any:
    Stream, AsyncStream, BaseModel = _result_types()
    call = state.call
    if isinstance(result, Stream):
        _settle_on_close(call, result.response)
        return ContainedStream(result, call, _no_item)
    if isinstance(result, AsyncStream):
        _settle_on_close(call, result.response)
        return AsyncContainedStream(result, call, _no_item)
    if isinstance(result, BaseModel) or result is None or call.usage_seen:
        call.finish()
        return result
    # A raw response (with_raw_response / with_streaming_response).
    http_response = getattr(result, "http_response", None)
    if isinstance(http_response, httpx2.Response):
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


def _request(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    state = _prepare(_options_of(args, kwargs), bool(kwargs.get("stream")))
    if state is None:
        return wrapped(*args, **kwargs)
    call = state.call
    active = _ACTIVE.set(state)
    stripped = strip_veronica_baggage()
    try:
        result = wrapped(*args, **kwargs)
    except BaseException as exc:
        call.finish(exc)
        raise
    finally:
        if stripped is not None:
            otel_context.detach(stripped)  # type: ignore[arg-type]
        _ACTIVE.reset(active)
        otel_context.detach(state.span_token)  # type: ignore[arg-type]
    return _settle(state, result)


async def _arequest(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    state = _prepare(_options_of(args, kwargs), bool(kwargs.get("stream")))
    if state is None:
        return await wrapped(*args, **kwargs)
    call = state.call
    active = _ACTIVE.set(state)
    stripped = strip_veronica_baggage()
    try:
        result = await wrapped(*args, **kwargs)
    except BaseException as exc:
        call.finish(exc)
        raise
    finally:
        if stripped is not None:
            otel_context.detach(stripped)  # type: ignore[arg-type]
        _ACTIVE.reset(active)
        otel_context.detach(state.span_token)  # type: ignore[arg-type]
    return _settle(state, result)


def _draw_retry(state: _CallState, attempt: int) -> None:
    """Draw the retry that makes attempt ``attempt`` from ``max_retries_total``."""
    call = state.call
    while state.retries < attempt:
        call.ctx.consume_retry()  # raises BudgetExceededError: the SDK loop stops
        state.retries += 1
    if call.span.is_recording():
        call.span.set_attribute("veronica.retries", state.retries)


def _sleep_for_retry(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    state = _ACTIVE.get()
    if state is not None:
        # Refuse the retry before its backoff is slept, not after.
        _draw_retry(state, int(kwargs.get("retries_taken", 0)) + 1)
        state.call.check_alive()
    return wrapped(*args, **kwargs)


async def _asleep_for_retry(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    state = _ACTIVE.get()
    if state is not None:
        _draw_retry(state, int(kwargs.get("retries_taken", 0)) + 1)
        state.call.check_alive()
    return await wrapped(*args, **kwargs)


def _build_request(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    state = _ACTIVE.get()
    if state is None:
        return wrapped(*args, **kwargs)
    retries_taken = kwargs.get("retries_taken", 0)
    if isinstance(retries_taken, int) and retries_taken > state.retries:
        # A retry that skipped the backoff hook still draws on the chain.
        _draw_retry(state, retries_taken)
    if state.retries:
        state.call.check_alive()  # a retry is a new dispatch: any trip stops it
    else:
        _check_deadline(state.call)
    request = wrapped(*args, **kwargs)
    request.extensions = {**request.extensions, _CALL_KEY: state}
    return request


def _check_deadline(call: ContainedCall) -> None:
    """Stop a just-admitted first attempt only for the deadline or a cancel.

    The call's step, tokens and cost were reserved atomically when it was
    admitted; another call denied since (which makes the trip sticky) does not
    revoke that admission, or ``max_steps=N`` would send fewer than N calls.
    """
    try:
        call.check_alive()
    except BudgetExceededError as exc:
        if exc.reason == "timeout" or call.ctx.cancellation.cancelled:
            raise


def _process_response_data(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    state = _state_of(kwargs.get("response"))
    if state is not None and not state.call.done:
        try:
            _account(state, kwargs.get("data"))
        except BudgetExceededError:
            raise  # cuts the stream: its generator closes the response
        except Exception:
            _logger.exception("reading usage from an openai payload failed")
        call = state.call
        if call.usage_seen and not state.streamed and _ACTIVE.get() is not state:
            call.finish()  # a raw response parsed after request() returned
    return wrapped(*args, **kwargs)


def _state_of(response: Any) -> _CallState | None:
    try:
        state = response.request.extensions.get(_CALL_KEY)
    except (AttributeError, RuntimeError):
        return None
    return state if isinstance(state, _CallState) else None


# -- payloads ------------------------------------------------------------------------


def _account(state: _CallState, data: Any) -> None:
    if not _is_mapping(data):
        return
    call = state.call
    if not state.streamed:
        _usage(call, data.get("usage"))
        return
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


_EMPTY: Mapping[str, Any] = {}


def _is_mapping(value: object) -> bool:
    # Payloads are plain dicts: skip the ABC check (slow next to the rest).
    return type(value) is dict or isinstance(value, Mapping)


def _usage(call: ContainedCall, usage: Any) -> None:
    if not usage or not _is_mapping(usage):
        return
    chat_style = "prompt_tokens" in usage  # chat, completions, embeddings; else responses
    details_in = usage.get("prompt_tokens_details" if chat_style else "input_tokens_details")
    details_out = usage.get("completion_tokens_details" if chat_style else "output_tokens_details")
    details_in = details_in if _is_mapping(details_in) else _EMPTY
    details_out = details_out if _is_mapping(details_out) else _EMPTY
    call.set_usage(
        usage.get("prompt_tokens" if chat_style else "input_tokens") or 0,
        usage.get("completion_tokens" if chat_style else "output_tokens") or 0,
        cached=details_in.get("cached_tokens") or 0,
        reasoning=details_out.get("reasoning_tokens") or 0,
        cache_write=details_in.get("cache_write_tokens") or 0,
    )


_PATCHES = (
    ("SyncAPIClient.request", _request),
    ("AsyncAPIClient.request", _arequest),
    ("SyncAPIClient._sleep_for_retry", _sleep_for_retry),
    ("AsyncAPIClient._sleep_for_retry", _asleep_for_retry),
    ("BaseClient._build_request", _build_request),
    ("BaseClient._process_response_data", _process_response_data),
)


class OpenAIInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Contains every HTTP API call of the ``openai`` SDK in the active chain."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        for name, wrapper in _PATCHES:
            wrap_function_wrapper("openai._base_client", name, wrapper)

    def _uninstrument(self, **kwargs: Any) -> None:
        import openai._base_client as base

        for name, _ in _PATCHES:
            owner, method = name.split(".")
            unwrap(getattr(base, owner), method)
