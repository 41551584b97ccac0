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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ._common import (
    ApiCall,
    ApiError,
    JSONReply,
    StreamReply,
    Usage,
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


def _messages(call: ApiCall) -> JSONReply | StreamReply:
    body = call.body
    model = _require(body)
    cap = read_cap(body, "max_tokens")
    if cap is None:
        raise ApiError(400, "max_tokens: Field required")
    usage = call.plan_usage(cap)
    pieces = text_pieces(usage.text_tokens, _json_schema(body))
    stop_reason = "max_tokens" if usage.truncated else "end_turn"
    message: dict[str, Any] = {
        "id": f"msg_fake{call.serial:024d}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
    }
    if not body.get("stream"):
        content = [{"type": "text", "text": "".join(pieces)}] if pieces else []
        return JSONReply(
            {
                **message,
                "content": content,
                "stop_reason": stop_reason,
                "usage": _usage(usage, usage.output_tokens),
            }
        )
    start = {**message, "usage": _usage(usage, min(1, usage.output_tokens))}
    chunks = [sse({"type": "message_start", "message": start}, event="message_start")]
    if pieces:
        block = {"type": "text", "text": ""}
        chunks.append(
            sse(
                {"type": "content_block_start", "index": 0, "content_block": block},
                event="content_block_start",
            )
        )
        chunks.append(sse({"type": "ping"}, event="ping"))
        chunks.extend(
            sse(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": piece},
                },
                event="content_block_delta",
            )
            for piece in pieces
        )
        chunks.append(sse({"type": "content_block_stop", "index": 0}, event="content_block_stop"))
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
