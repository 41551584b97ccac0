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
- ``BaseClient._build_request``: once per HTTP attempt, before sending. Every
  SDK-internal retry draws on ``max_retries_total``; the deadline and sticky
  trips are re-checked, so a retry never leaves after the chain stopped.
- ``BaseClient._process_response_data``: every parsed payload, stream events
  included. Records usage, keeps streamed text, and cuts a stream at the next
  chunk once the chain trips or its deadline passes.
"""

from __future__ import annotations

import contextvars
import logging
import weakref
from collections.abc import Collection, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)
from opentelemetry.instrumentation.utils import unwrap
from wrapt import wrap_function_wrapper

from veronica_otel._errors import BudgetExceededError
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
_ACTIVE: contextvars.ContextVar[ContainedCall | None] = contextvars.ContextVar(
    "veronica_openai_call", default=None
)

# path suffix -> (GenAI operation, input keys, output-cap key or None)
_ROUTES: dict[str, tuple[str, tuple[str, ...], str | None]] = {
    "/chat/completions": ("chat", ("messages",), "max_completion_tokens"),
    "/responses": ("chat", ("instructions", "input"), "max_output_tokens"),
    "/completions": ("text_completion", ("prompt", "suffix"), "max_tokens"),
    "/embeddings": ("embeddings", ("input",), None),
}
_CAP_ALIASES = {"max_completion_tokens": ("max_completion_tokens", "max_tokens")}


def _route(options: Any) -> tuple[str, tuple[str, ...], str | None] | None:
    if getattr(options, "method", "").lower() != "post":
        return None
    url = getattr(options, "url", "")
    path = url.split("?", 1)[0]
    for suffix, route in _ROUTES.items():
        if path.endswith(suffix) and not path.endswith("/chat" + suffix):
            return route
    if path.endswith("/chat/completions"):
        return _ROUTES["/chat/completions"]
    return None


def _body(options: Any) -> dict[str, Any]:
    json_data = options.json_data if isinstance(options.json_data, Mapping) else {}
    extra = options.extra_json if isinstance(options.extra_json, Mapping) else {}
    return {**json_data, **extra}


def _set_body(options: Any, key: str, value: object) -> None:
    # The SDK shares one json_data dict across attempts and merges the user's
    # extra_body over it: replace both, never mutate the caller's dicts.
    if isinstance(options.json_data, Mapping):
        options.json_data = {**options.json_data, key: value}
    if isinstance(options.extra_json, Mapping) and key in options.extra_json:
        options.extra_json = {**options.extra_json, key: value}


def _requested_cap(body: Mapping[str, Any], cap_key: str | None) -> int | None:
    if cap_key is None:
        return None
    for key in _CAP_ALIASES.get(cap_key, (cap_key,)):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _prepare(options: Any) -> tuple[ContainedCall | None, bool]:
    """Admit the call described by ``options``; (None, _) when not ours to contain."""
    route = _route(options)
    if route is None:
        return None, False
    ctx = default_context()
    if ctx is None:
        return None, False
    operation, input_keys, cap_key = route
    body = _body(options)
    model = str(body.get("model") or "unknown")
    choices = body.get("n") if operation != "embeddings" else 1
    choices = choices if isinstance(choices, int) and choices > 0 else 1
    parts = [body.get(k) for k in input_keys if body.get(k) is not None]
    messages = body.get("messages")
    n_messages = len(messages) if isinstance(messages, list) else 1
    span = start_span(operation, PROVIDER, model)
    cap = _requested_cap(body, cap_key)
    with trace.use_span(span, end_on_exit=False):
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
            clampable=cap_key is not None,
            choices=choices,
        )
    if clamp is not None and cap_key is not None:
        _set_body(options, cap_key, clamp)
    if fallback is not None:
        _set_body(options, "model", fallback)
    return call, bool(body.get("stream"))


def _settle(call: ContainedCall, result: Any) -> Any:
    from openai import AsyncStream, Stream
    from pydantic import BaseModel

    if isinstance(result, Stream):
        return ContainedStream(result, call, _no_item)
    if isinstance(result, AsyncStream):
        return AsyncContainedStream(result, call, _no_item)
    if isinstance(result, BaseModel) or result is None or call.usage_seen:
        call.finish()
        return result
    # A raw response (with_raw_response / with_streaming_response): its body
    # is parsed later; the payload hook settles it then, or collection does.
    try:
        weakref.finalize(result, call.finish)
    except TypeError:
        call.finish()
    return result


def _no_item(call: ContainedCall, item: Any) -> None:
    """Stream items are accounted in the payload hook, which sees raw dicts."""


def _request(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    options = args[1] if len(args) > 1 else kwargs.get("options")
    call, _ = _prepare(options)
    if call is None:
        return wrapped(*args, **kwargs)
    span_token = otel_context.attach(trace.set_span_in_context(call.span))
    active = _ACTIVE.set(call)
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
        otel_context.detach(span_token)
    return _settle(call, result)


async def _arequest(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    options = args[1] if len(args) > 1 else kwargs.get("options")
    call, _ = _prepare(options)
    if call is None:
        return await wrapped(*args, **kwargs)
    span_token = otel_context.attach(trace.set_span_in_context(call.span))
    active = _ACTIVE.set(call)
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
        otel_context.detach(span_token)
    return _settle(call, result)


def _build_request(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    call = _ACTIVE.get()
    if call is None:
        return wrapped(*args, **kwargs)
    retries_taken = kwargs.get("retries_taken", 0)
    if retries_taken:
        # An SDK-internal retry is about to be sent: it draws on the chain's
        # retry budget. Raising here stops the SDK loop without a send.
        call.ctx.consume_retry()
        if call.span.is_recording():
            call.span.set_attribute("veronica.retries", retries_taken)
    call.check_alive()
    request = wrapped(*args, **kwargs)
    request.extensions = {**request.extensions, _CALL_KEY: call}
    return request


def _process_response_data(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    call = _call_of(kwargs.get("response"))
    if call is not None and not call.done:
        data = kwargs.get("data")
        try:
            _account(call, data)
        except BudgetExceededError:
            raise
        except Exception:
            _logger.exception("reading usage from an openai payload failed")
        if call.usage_seen and _ACTIVE.get() is not call and not _is_stream_event(data):
            call.finish()  # a raw response parsed after request() returned
    return wrapped(*args, **kwargs)


def _call_of(response: Any) -> ContainedCall | None:
    try:
        return response.request.extensions.get(_CALL_KEY)  # type: ignore[no-any-return]
    except (AttributeError, RuntimeError):
        return None


def _is_stream_event(data: Any) -> bool:
    if not isinstance(data, Mapping):
        return False
    return data.get("object") == "chat.completion.chunk" or "sequence_number" in data


def _account(call: ContainedCall, data: Any) -> None:
    if not isinstance(data, Mapping):
        return
    kind = data.get("type")
    if isinstance(kind, str):  # a Responses stream event
        if kind == "response.output_text.delta":
            call.add_text(str(data.get("delta") or ""))
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            _usage(call, get_field(data.get("response") or {}, "usage"))
        call.check_alive()
        return
    if data.get("object") == "chat.completion.chunk":
        for choice in data.get("choices") or ():
            delta = get_field(choice, "delta") or {}
            content = get_field(delta, "content")
            if content:
                call.add_text(str(content))
        _usage(call, data.get("usage"))
        call.check_alive()
        return
    _usage(call, data.get("usage"))


def _usage(call: ContainedCall, usage: Any) -> None:
    if not usage:
        return
    if "prompt_tokens" in usage:  # chat, completions, embeddings
        details_in = get_field(usage, "prompt_tokens_details") or {}
        details_out = get_field(usage, "completion_tokens_details") or {}
        call.set_usage(
            get_field(usage, "prompt_tokens") or 0,
            get_field(usage, "completion_tokens") or 0,
            cached=get_field(details_in, "cached_tokens") or 0,
            reasoning=get_field(details_out, "reasoning_tokens") or 0,
            cache_write=get_field(details_in, "cache_write_tokens") or 0,
        )
    else:  # responses
        details_in = get_field(usage, "input_tokens_details") or {}
        details_out = get_field(usage, "output_tokens_details") or {}
        call.set_usage(
            get_field(usage, "input_tokens") or 0,
            get_field(usage, "output_tokens") or 0,
            cached=get_field(details_in, "cached_tokens") or 0,
            reasoning=get_field(details_out, "reasoning_tokens") or 0,
            cache_write=get_field(details_in, "cache_write_tokens") or 0,
        )


_PATCHES = (
    ("SyncAPIClient.request", _request),
    ("AsyncAPIClient.request", _arequest),
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
