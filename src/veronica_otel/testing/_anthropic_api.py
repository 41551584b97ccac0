"""Response builders for the Anthropic API routes of the fake server.

Routes: ``POST /v1/messages`` (non-streamed, or streamed with ``event:`` lines)
and ``POST /v1/messages/count_tokens``.

Usage follows the real API, which differs from OpenAI's in two ways a
consumer must get right:

* ``input_tokens`` excludes cache reads: the prompt total is
  ``input_tokens + cache_read_input_tokens + cache_creation_input_tokens``;
* in a stream, ``message_start`` reports ``output_tokens`` of 1 (as the real
  API does) and ``message_delta`` reports the cumulative totals, which replace,
  not add to, the earlier numbers.

A scripted reply's tool calls (the runaway model's, see ``_runaway.py``) are
``tool_use`` content blocks with ``stop_reason`` ``"tool_use"``, streamed as
``content_block_start`` plus one ``input_json_delta``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ._common import (
    ApiCall,
    ApiError,
    JSONReply,
    ScriptedReply,
    StreamReply,
    Usage,
    dumps,
    plan_usage,
    read_cap,
    sse,
    text_pieces,
)

__all__ = ["ROUTES", "error_payload"]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_payload(status: int, message: str, request_id: str | None = None) -> dict[str, Any]:
    """Return an Anthropic-style error body: ``{"type": "error", "error": {...}}``."""
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    payload: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    if request_id is not None:
        payload["request_id"] = request_id
    return payload


def _require(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "model: Field required")
    if not isinstance(body.get("messages"), list):
        raise ApiError(400, "messages: Field required")
    return model


def _json_schema(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """Schema of ``output_config.format`` (or beta ``output_format``), if JSON."""
    config = body.get("output_config")
    output_format = config.get("format") if isinstance(config, Mapping) else None
    if output_format is None:
        output_format = body.get("output_format")
    if not isinstance(output_format, Mapping) or output_format.get("type") != "json_schema":
        return None
    schema = output_format.get("schema")
    return schema if isinstance(schema, Mapping) else {"type": "object"}


def _usage(usage: Usage, output_tokens: int) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "input_tokens": usage.input_tokens - usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": output_tokens,
        "service_tier": "standard",
    }
    if usage.reasoning_tokens:
        payload["output_tokens_details"] = {
            "thinking_tokens": min(usage.reasoning_tokens, output_tokens)
        }
    return payload


def _tool_uses(call: ApiCall, script: ScriptedReply | None) -> list[dict[str, Any]]:
    calls = script.tool_calls if script is not None else ()
    return [
        {
            "type": "tool_use",
            "id": tool.id or f"toolu_fake{call.serial:08d}{index:04d}",
            "name": tool.name,
            "input": dict(tool.arguments),
        }
        for index, tool in enumerate(calls)
    ]


def _block_events(index: int, block: dict[str, Any]) -> list[bytes]:
    """One content block streamed: start, its deltas, stop."""
    if block["type"] == "text":
        start: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": piece} for piece in block["pieces"]]
    else:
        start = {**block, "input": {}}
        deltas = [{"type": "input_json_delta", "partial_json": dumps(block["input"]).decode()}]
    events = [
        sse(
            {"type": "content_block_start", "index": index, "content_block": start},
            event="content_block_start",
        )
    ]
    if index == 0:
        events.append(sse({"type": "ping"}, event="ping"))
    events.extend(
        sse(
            {"type": "content_block_delta", "index": index, "delta": d}, event="content_block_delta"
        )
        for d in deltas
    )
    events.append(sse({"type": "content_block_stop", "index": index}, event="content_block_stop"))
    return events


def _messages(call: ApiCall) -> JSONReply | StreamReply:
    body = call.body
    model = _require(body)
    cap = read_cap(body, "max_tokens")
    if cap is None:
        raise ApiError(400, "max_tokens: Field required")
    usage = call.plan_usage(cap)
    tool_uses = _tool_uses(call, call.script)
    if call.script is not None and call.script.text is not None:
        pieces = [call.script.text]
    elif tool_uses:
        pieces = []
    else:
        pieces = text_pieces(usage.text_tokens, _json_schema(body))
    stop_reason = "max_tokens" if usage.truncated else "end_turn"
    if tool_uses:
        stop_reason = "tool_use"
    message: dict[str, Any] = {
        "id": f"msg_fake{call.serial:024d}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
    }
    text_blocks = [{"type": "text", "text": "".join(pieces)}] if pieces else []
    if not body.get("stream"):
        return JSONReply(
            {
                **message,
                "content": text_blocks + tool_uses,
                "stop_reason": stop_reason,
                "usage": _usage(usage, usage.output_tokens),
            }
        )
    start = {**message, "usage": _usage(usage, min(1, usage.output_tokens))}
    chunks = [sse({"type": "message_start", "message": start}, event="message_start")]
    streamed = [{**block, "pieces": pieces} for block in text_blocks] + tool_uses
    for index, block in enumerate(streamed):
        chunks.extend(_block_events(index, block))
    delta = {"stop_reason": stop_reason, "stop_sequence": None}
    final_usage = _usage(usage, usage.output_tokens)
    del final_usage["service_tier"]
    chunks.append(
        sse({"type": "message_delta", "delta": delta, "usage": final_usage}, event="message_delta")
    )
    chunks.append(sse({"type": "message_stop"}, event="message_stop"))
    return StreamReply(chunks)


def _count_tokens(call: ApiCall) -> JSONReply:
    _require(call.body)
    usage = plan_usage(call.settings, call.body_size, None)  # counting is free
    return JSONReply({"input_tokens": usage.input_tokens})


def _message_batch(call: ApiCall) -> JSONReply:
    """``messages.batches.create``: queued; its requests are billed later."""
    requests = call.body.get("requests")
    if not isinstance(requests, list) or not requests:
        raise ApiError(400, "requests: Field required")
    counts = {"processing": len(requests), "succeeded": 0, "errored": 0}
    return JSONReply(
        {
            "id": f"msgbatch_fake{call.serial}",
            "type": "message_batch",
            "processing_status": "in_progress",
            "request_counts": {**counts, "canceled": 0, "expired": 0},
            "created_at": "2026-01-01T00:00:00Z",
            "expires_at": "2026-01-02T00:00:00Z",
            "ended_at": None,
            "cancel_initiated_at": None,
            "archived_at": None,
            "results_url": None,
        }
    )


ROUTES: Mapping[str, Callable[[ApiCall], JSONReply | StreamReply]] = {
    "/v1/messages": _messages,
    "/v1/messages/count_tokens": _count_tokens,
    "/v1/messages/batches": _message_batch,
}
"""POST routes of the Anthropic API, by path."""
