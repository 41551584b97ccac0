"""Reading how an ``anthropic`` call ended: its reply, its stream's events and
usage (only the final report counts), or its error (what its attempts may have
cost); settling it."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from typing import Any

from veronica_otel._errors import BudgetExceededError
from veronica_otel._gc_safe import defer

from ._anthropic_attributes import response_attributes
from ._anthropic_request import _CallState
from ._breakers import never_connected, raised_within
from ._common import (
    AsyncContainedStream,
    ContainedStream,
    get_field,
    no_item,
    token_count,
)

# The logger users filter on, as before this module was split out of anthropic.py.
_logger = logging.getLogger(__name__.rpartition(".")[0] + ".anthropic")
_CALL_KEY = "veronica.call"

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
        _tag_late(result.response, state)
        return ContainedStream(result, call, no_item)
    if isinstance(result, AsyncStream):
        _tag_late(result.response, state)
        return AsyncContainedStream(result, call, no_item)
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
    _tag_late(getattr(result, "http_response", None), state)
    try:
        weakref.finalize(result, defer, call.finish)
    except TypeError:
        call.finish()
    return result


def _tag(result: Any, state: _CallState) -> None:
    """Mark the response so the payload hook finds its call, even mid-stream."""
    try:
        result[0].extensions[_CALL_KEY] = state
    except Exception:
        _logger.debug("could not tag an anthropic response", exc_info=True)


def _tag_late(response: Any, state: _CallState) -> None:
    """Mark a response read after ``request()`` returned (a stream, a raw
    response), where no attempt hook tagged it (releases without one)."""
    extensions = getattr(response, "extensions", None)
    if isinstance(extensions, dict) and _CALL_KEY not in extensions:
        extensions[_CALL_KEY] = state


def _note_attempt(state: _CallState, error: BaseException) -> None:
    # Raised from inside the send: only a connection never made means not sent.
    state.noted = error
    if not never_connected(error):
        state.call.lost_attempts += 1


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
