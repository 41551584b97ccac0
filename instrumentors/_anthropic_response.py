"""Reading how an ``anthropic`` call ended: its reply and its stream's events
and usage (only the final report counts); holding a reply read later."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Mapping
from types import FunctionType
from typing import Any

from veronica_otel._gc_safe import defer
from veronica_otel._units import MAX_COUNT

from ._adapter import admitted_call as _admitted
from ._anthropic_attributes import response_attributes
from ._common import (
    UNTRACED_SPAN,
    AsyncContainedStream,
    ContainedCall,
    ContainedStream,
    get_field,
    no_item,
    token_count,
)
from ._http_libs import bound_call
from ._openai_response import _MODEL_TYPES, BOUND, _result_types, bind_later

# The logger users filter on, as before this module was split out of anthropic.py.
_logger = logging.getLogger(__name__.rpartition(".")[0] + ".anthropic")


class _Usage:
    """The last usage report's raw values, read as counts once the final one is in."""

    __slots__ = ("cache_read", "cache_write", "input", "output", "thinking")

    def __init__(self) -> None:
        self.input: object = None  # Anthropic's input_tokens: without cache reads and writes
        self.cache_read: object = 0
        self.cache_write: object = 0
        self.output: object = None  # cumulative in a stream: final in message_delta
        self.thinking: object = 0


def _usage_of(call: ContainedCall) -> _Usage:
    usage = call.reading
    if usage is None:
        usage = call.reading = _Usage()
    return usage  # type: ignore[no-any-return]


def payload_lane(adapter: Any, general: Callable[..., Any]) -> Callable[..., Any]:
    """``_process_response_data``'s hook as one plain function (``_hooks._plain``):
    a whole message parsed inside ``request()`` (the call in flight,
    ``adapter``'s, none bound to the response) whose usage is plain counts,
    read in this frame (and settled, where a span ends with the body);
    anything else, ``general`` (the ``wrapt``-shaped hook: :func:`account`)."""

    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        method = hooked.__wrapped__  # type: ignore[attr-defined]
        call = _admitted()
        data = kwargs.get("data")
        usage = data.get("usage") if type(data) is dict else None
        if (
            type(usage) is dict
            and type(call) is ContainedCall  # a subclass's set_usage is asked
            and call.adapter is adapter
            and not call.done
            and data.get("type") == "message"  # type: ignore[union-attr]
            and call.reading is None  # no stream report read before
            and not usage.get("output_tokens_details")
            and not (BOUND[0] and bound_call(kwargs.get("response")) is not None)  # read later
        ):
            get = usage.get
            inp, out = get("input_tokens"), get("output_tokens")
            read = get("cache_read_input_tokens") or 0
            write = get("cache_creation_input_tokens") or 0
            if (  # type tests and int compares: each one specialised opcode
                type(inp) is int
                and type(out) is int
                and type(read) is int
                and type(write) is int
                and inp >= 0
                and read >= 0
                and write >= 0
                and 0 <= out <= MAX_COUNT
                and inp + read + write <= MAX_COUNT  # each part too
            ):
                # account's reading of a whole message: its attributes, then
                # _read_usage, _apply and set_usage(total, out, read, 0, write),
                # their rules copied for plain counts (read <= total, nothing to
                # clamp, no thinking detail), then settled.
                try:
                    pending = call.pending_attributes
                    if pending is not None:
                        response_attributes(pending, "message", data)  # type: ignore[arg-type]
                    call.input_tokens, call.output_tokens = inp + read + write, out
                    call.cached_tokens, call.cache_write_tokens = read, write
                    call.reasoning_tokens = 0
                    call.usage_seen = True
                    if call.span is not UNTRACED_SPAN:
                        # Settle now: the SDK ends its span when the body ends, right after.
                        call.finish()
                    # Else nothing to end: settled as request() returns (the shared
                    # lane's commit, _adapter._lane; the adapter reads no reply).
                except Exception:
                    _logger.exception("reading usage from an anthropic payload failed")
                if type(method) is FunctionType:  # the SDK's own method: no binding
                    return method(self, *args, **kwargs)
                return method.__get__(self, type(self))(*args, **kwargs)
        return general(method.__get__(self, type(self)), self, args, kwargs)

    return hooked


def hold(call: ContainedCall, result: Any) -> Any:
    """Settle a call that returned, now or when its body is read."""
    if call.done and type(result) in _MODEL_TYPES:  # a message its payload settled
        return result
    Stream, AsyncStream, BaseModel = _result_types("anthropic")
    if isinstance(result, Stream):
        bind_later(call, result.response)
        return ContainedStream(result, call, no_item)
    if isinstance(result, AsyncStream):
        bind_later(call, result.response)
        return AsyncContainedStream(result, call, no_item)
    if call.done or result is None or isinstance(result, BaseModel):
        if len(_MODEL_TYPES) < 256 and isinstance(result, BaseModel):
            _MODEL_TYPES.add(type(result))  # then known: settled without the checks above
        read_message(call, result)
        call.finish()
        return result
    # A raw response (with_raw_response / with_streaming_response): its body is
    # parsed later; the payload hook settles it then, or collection does.
    bind_later(call, getattr(result, "http_response", None))
    try:
        weakref.finalize(result, defer, call.finish)
    except TypeError:
        call.finish()
    return result


def read_message(call: ContainedCall, result: Any) -> None:
    """A parsed message's usage, when its call is not settled: the payload hook
    never saw its body (it was not parsed through the hooked method)."""
    if not call.done and getattr(result, "type", None) == "message":
        _read_usage(call, getattr(result, "usage", None))
        _apply(call)


def account(call: ContainedCall, data: Any) -> None:
    """Read one payload (a whole message, or a stream event) into ``call``."""
    if type(data) is not dict and not isinstance(data, Mapping):  # no ABC frame for a dict
        return
    kind = data.get("type")
    if call.pending_attributes is not None and kind != "content_block_delta":
        response_attributes(call.pending_attributes, kind, data)
    if kind == "content_block_delta":
        _delta(call, data.get("delta"))
    elif kind == "message":  # a whole message (not streamed; plain counts: payload_lane)
        _read_usage(call, data.get("usage"))
        _apply(call)
        # Settle now: the SDK ends its span when the body ends, right after.
        call.finish()
        return
    elif kind == "message_start":
        _read_usage(call, get_field(data.get("message") or {}, "usage"))
    elif kind == "message_delta":
        # Its usage is cumulative and final: only now is the output known
        # (message_start's is stale), and without one the call is unreadable.
        _usage_of(call).output = None
        _read_usage(call, data.get("usage"))
        _apply(call)
    elif kind == "message_stop":
        call.finish()  # settled now, as a whole message
        return
    call.check_alive()


def _delta(call: ContainedCall, delta: Any) -> None:
    if isinstance(delta, Mapping) and delta.get("type") == "text_delta":
        call.add_text(str(delta.get("text") or ""))


def _read_usage(call: ContainedCall, usage: Any) -> None:
    """Keep what a usage report says; it is read as counts only in :func:`_apply`."""
    if not usage:
        return
    state = _usage_of(call)
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


def _apply(call: ContainedCall) -> None:
    """Hand the final usage to the call (the price model counts cache in input).

    Only the final report counts: a stream cut before it (message_start's
    output says 1) costs the reservation. A report whose counts are missing
    or not counts is unreadable and costs the reservation too.
    """
    state = _usage_of(call)
    inp, read = token_count(state.input), token_count(state.cache_read or 0)
    write = token_count(state.cache_write or 0)
    out, thinking = token_count(state.output), token_count(state.thinking or 0)
    if inp is None or read is None or write is None or out is None or thinking is None:
        call.set_usage(None, None)  # unreadable: settled at the reservation
        return
    call.set_usage(
        inp + read + write,
        out,
        cached=read,
        reasoning=min(thinking, out),
        cache_write=write,
    )
