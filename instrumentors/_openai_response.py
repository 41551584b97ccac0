"""Reading how an ``openai`` (or ``groq``) call ended: its reply, its stream's events and
usage, or an attempt's error (what it may have cost); holding a reply read later."""

from __future__ import annotations

import importlib
import logging
import weakref
from collections.abc import Callable, Mapping
from types import FunctionType
from typing import Any

from veronica_otel._gc_safe import defer
from veronica_otel._units import MAX_COUNT

from ._adapter import admitted_call as _admitted
from ._common import AsyncContainedStream, ContainedCall, ContainedStream, get_field, no_item
from ._http_libs import bind, bound_call, is_response, settle_on_close
from ._openai_attributes import response_attributes, stream_attributes

# The logger users filter on, as before this module was split out of openai.py.
_logger = logging.getLogger(__name__.rpartition(".")[0] + ".openai")
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


_RESULT_TYPES: dict[str, tuple[Any, Any, Any]] = {}  # per SDK package


def _result_types(package: str) -> tuple[Any, Any, Any]:
    # Looked up on first use, not at import: the zero-code hook instruments
    # while the SDK itself is still being imported (these are not bound yet).
    try:
        return _RESULT_TYPES[package]
    except KeyError:
        from pydantic import BaseModel

        sdk = importlib.import_module(package)
        found = _RESULT_TYPES[package] = (sdk.Stream, sdk.AsyncStream, BaseModel)
        return found


# Response model classes seen (a few per process): a reply of one (or None) is
# parsed, settled as it returns, its usage read by the payload hook inside request().
_MODEL_TYPES: set[type] = set()


# Whether a reply of a Stainless SDK (this one's, anthropic's) was ever bound to
# its call to be read later (``bind``): until one is, ``bound_call`` finds none
# for any response, and the payload hooks skip asking (a set-once flag).
BOUND = [False]


def bind_later(call: ContainedCall, response: Any) -> None:
    """``bind``, with :data:`BOUND` set first."""
    BOUND[0] = True
    bind(call, response)


def hold(package: str, call: ContainedCall, result: Any) -> Any:
    """Settle a call that returned, now or when its body is read."""
    Stream, AsyncStream, BaseModel = _result_types(package)
    if call.usage_seen:
        known = type(result) in _MODEL_TYPES
        if not known and len(_MODEL_TYPES) < 256 and isinstance(result, BaseModel):
            _MODEL_TYPES.add(type(result))  # then known parsed: settled without this frame
        call.finish()
        return result
    if isinstance(result, BaseModel):
        if len(_MODEL_TYPES) < 256:  # pydantic isinstance is a Python-level ABC check
            _MODEL_TYPES.add(type(result))
        call.finish()  # a parsed model, usage already read
        return result
    if isinstance(result, Stream):
        bind_later(call, result.response)
        settle_on_close(call, result.response)
        return ContainedStream(result, call, no_item)
    if isinstance(result, AsyncStream):
        bind_later(call, result.response)
        settle_on_close(call, result.response)
        return AsyncContainedStream(result, call, no_item)
    # A raw response (with_raw_response / with_streaming_response).
    http_response: Any = getattr(result, "http_response", None)
    if is_response(http_response):
        bind_later(call, http_response)
        if call.request.stream:
            settle_on_close(call, http_response)
        elif http_response.is_closed:
            # The body is already read: account it now, whether or not the
            # caller ever parses it.
            try:
                account(call, http_response.json())
            except Exception:
                _logger.debug("no usage in a raw %s response body", package, exc_info=True)
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


def account(call: ContainedCall, data: Any) -> None:
    """Read one payload (a whole reply, or a stream event) into ``call``."""
    if type(data) is not dict and not isinstance(data, Mapping):
        return
    pending = call.pending_attributes
    if not call.request.stream:  # (a payload of a call in flight: payload_lane reads it)
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


def payload_lane(adapter: Any, general: Callable[..., Any]) -> Callable[..., Any]:
    """``_process_response_data``'s hook as one plain function (``_hooks._plain``):
    a whole reply's payload parsed inside ``request()`` (the call in flight,
    ``adapter``'s, none bound to the response) read in this frame, its plain
    chat usage set as ``ContainedCall.set_usage`` sets it (its rule, copied:
    both counts ints in range, every detail zero or absent); anything else,
    ``general`` (the ``wrapt``-shaped hook, :func:`account`)."""

    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        method = hooked.__wrapped__  # type: ignore[attr-defined]
        call = _admitted()
        data = kwargs.get("data")
        if (
            type(call) is not ContainedCall  # none in flight, or a subclass's set_usage
            or call.adapter is not adapter
            or call.done
            or type(data) is not dict
            or call.request.stream
            or (BOUND[0] and bound_call(kwargs.get("response")) is not None)  # read later
        ):
            return general(method.__get__(self, type(self)), self, args, kwargs)
        try:
            usage = data.get("usage")
            if type(usage) is dict:
                get = usage.get
                inp, out = get("prompt_tokens"), get("completion_tokens")
                details_in = get("prompt_tokens_details")
                details_out = get("completion_tokens_details")
                if (
                    type(inp) is int
                    and type(out) is int
                    and 0 <= inp <= MAX_COUNT
                    and 0 <= out <= MAX_COUNT
                    and (
                        not details_in
                        or (
                            type(details_in) is dict
                            and not details_in.get("cached_tokens")
                            and not details_in.get("cache_write_tokens")
                        )
                    )
                    and (
                        not details_out
                        or (type(details_out) is dict and not details_out.get("reasoning_tokens"))
                    )
                ):
                    call.cached_tokens = call.cache_write_tokens = call.reasoning_tokens = 0
                    call.input_tokens, call.output_tokens = inp, out
                    call.usage_seen = True
                else:
                    _usage(call, usage)
            pending = call.pending_attributes
            if pending is not None:
                response_attributes(pending, data)
        except Exception:
            _logger.exception("reading usage from a %s payload failed", adapter.package)
        if type(method) is FunctionType:  # the SDK's own method: no binding
            return method(self, *args, **kwargs)
        return method.__get__(self, type(self))(*args, **kwargs)

    return hooked


def _add_output_bytes(call: ContainedCall, text: Any) -> None:
    """Output that is not the reply's text still bounds the output tokens."""
    if isinstance(text, str) and text:
        call.text_bytes += len(text.encode("utf-8"))


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
