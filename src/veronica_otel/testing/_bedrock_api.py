"""Response builders for the Amazon Bedrock runtime routes of the fake server.

Routes (the model id is a path segment, percent-encoded by botocore):
``POST /model/{modelId}/converse``, ``/converse-stream``, ``/invoke`` and
``/invoke-with-response-stream``. Point a real client at the server::

    boto3.client("bedrock-runtime", endpoint_url=server.base_url, region_name="us-east-1",
                 aws_access_key_id="x", aws_secret_access_key="x")

What botocore must parse, as the real service sends it:

* Converse: ``usage.inputTokens`` *excludes* the cache reads and writes
  (``cacheReadInputTokens``, ``cacheWriteInputTokens``), as Bedrock reports them;
* InvokeModel: the model family's own body (Anthropic messages, Amazon Nova,
  Meta Llama, Amazon Titan text), and the family-independent
  ``X-Amzn-Bedrock-Input-Token-Count`` / ``-Output-Token-Count`` headers
  (cache reads apart, in ``X-Amzn-Bedrock-Cache-Read-Input-Token-Count``);
* streams: the AWS event-stream binary framing (prelude, headers, CRC32s),
  content type ``application/vnd.amazon.eventstream``; ConverseStream ends with
  a ``metadata`` event carrying the usage, InvokeModelWithResponseStream's
  chunks are base64 model events whose last one carries
  ``amazon-bedrock-invocationMetrics``.

A scripted reply's tool calls (the runaway model's) are Converse ``toolUse``
content blocks with ``stopReason`` ``"tool_use"``, streamed as
``contentBlockStart`` (the tool's id and name) plus one ``toolUse.input`` delta.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import unquote

from ._common import ApiCall, ApiError, JSONReply, StreamReply, Usage, dumps, text_pieces

__all__ = ["PATTERNS", "ROUTES", "error_headers", "error_payload", "event_message"]

_EVENT_STREAM = "application/vnd.amazon.eventstream"
_ERROR_TYPES = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    424: "ModelErrorException",
    429: "ThrottlingException",
    503: "ServiceUnavailableException",
}


def error_type(status: int) -> str:
    """The Bedrock exception name for an HTTP error status."""
    return _ERROR_TYPES.get(
        status, "InternalServerException" if status >= 500 else "ValidationException"
    )


def error_headers(status: int) -> dict[str, str]:
    """restJson: the error's code goes in a header too (botocore reads either)."""
    return {"x-amzn-errortype": error_type(status)}


def error_payload(status: int, message: str) -> dict[str, Any]:
    """A Bedrock (restJson) error body; botocore reads the code from ``__type``."""
    return {"__type": error_type(status), "message": message}


# -- the AWS event-stream framing ------------------------------------------------


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode("utf-8"), value.encode("utf-8")
    # name length, name, type 7 (string), value length, value
    return (
        struct.pack("!B", len(raw_name))
        + raw_name
        + struct.pack("!BH", 7, len(raw_value))
        + raw_value
    )


def event_message(event_type: str, payload: Mapping[str, Any]) -> bytes:
    """One event-stream message: prelude (lengths + CRC32), headers, JSON payload, CRC32."""
    headers = (
        _header(":event-type", event_type)
        + _header(":content-type", "application/json")
        + _header(":message-type", "event")
    )
    body = dumps(payload)
    total = 12 + len(headers) + len(body) + 4
    prelude = struct.pack("!II", total, len(headers))
    prelude += struct.pack("!I", binascii.crc32(prelude))
    message = prelude + headers + body
    return message + struct.pack("!I", binascii.crc32(message))


# -- requests ---------------------------------------------------------------------


def _cap(value: object, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ApiError(400, f"{name} must be a positive integer, got {value!r}")
    return value


def _family(model: str) -> str:
    parts = model.rsplit("/", 1)[-1].split(".")  # [region.]vendor.model
    for vendor, rest in itertools.pairwise(parts):
        if vendor in ("anthropic", "meta"):
            return vendor
        if vendor == "amazon":
            return "amazon.nova" if rest.startswith("nova") else "amazon.titan"
    return "other"


def _billed(call: ApiCall, model: str, cap: int | None) -> Usage:
    # The model is in the path, not the body: bill it by name.
    return replace(call, body={**call.body, "model": model}).plan_usage(cap)


# -- Converse ----------------------------------------------------------------------


def _converse_usage(usage: Usage, output_tokens: int) -> dict[str, Any]:
    fresh = usage.input_tokens - usage.cached_tokens
    return {
        "inputTokens": fresh,
        "outputTokens": output_tokens,
        "totalTokens": usage.input_tokens + output_tokens,
        "cacheReadInputTokens": usage.cached_tokens,
        "cacheWriteInputTokens": 0,
    }


def _converse(call: ApiCall, model: str, stream: bool) -> JSONReply | StreamReply:
    if not isinstance(call.body.get("messages"), list):
        raise ApiError(400, "messages: Field required")
    config = call.body.get("inferenceConfig") or {}
    usage = _billed(call, model, _cap(config.get("maxTokens"), "inferenceConfig.maxTokens"))
    calls = call.script.tool_calls if call.script is not None else ()
    tools: list[dict[str, Any]] = [
        {
            "toolUseId": c.id or f"tooluse_fake{call.serial}_{i}",
            "name": c.name,
            "input": dict(c.arguments),
        }
        for i, c in enumerate(calls)
    ]
    pieces = [] if tools else text_pieces(usage.text_tokens)
    stop = "tool_use" if tools else "max_tokens" if usage.truncated else "end_turn"
    if not stream:
        content: list[dict[str, Any]] = [{"toolUse": t} for t in tools]
        return JSONReply(
            {
                "output": {
                    "message": {
                        "role": "assistant",
                        "content": content or [{"text": "".join(pieces)}],
                    }
                },
                "stopReason": stop,
                "usage": _converse_usage(usage, usage.output_tokens),
                "metrics": {"latencyMs": 1},
            }
        )
    chunks = [event_message("messageStart", {"role": "assistant"})]
    chunks.extend(
        event_message("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": piece}})
        for piece in pieces
    )
    if pieces:
        chunks.append(event_message("contentBlockStop", {"contentBlockIndex": 0}))
    for index, tool in enumerate(tools):
        start = {"toolUse": {"toolUseId": tool["toolUseId"], "name": tool["name"]}}
        chunks.append(
            event_message("contentBlockStart", {"contentBlockIndex": index, "start": start})
        )
        delta = {"toolUse": {"input": dumps(tool["input"]).decode()}}
        chunks.append(
            event_message("contentBlockDelta", {"contentBlockIndex": index, "delta": delta})
        )
        chunks.append(event_message("contentBlockStop", {"contentBlockIndex": index}))
    chunks.append(event_message("messageStop", {"stopReason": stop}))
    metadata = {"usage": _converse_usage(usage, usage.output_tokens), "metrics": {"latencyMs": 1}}
    chunks.append(event_message("metadata", metadata))
    return StreamReply(chunks, content_type=_EVENT_STREAM)


# -- InvokeModel: each family's own body ----------------------------------------------


def _invoke_cap(family: str, body: Mapping[str, Any]) -> int | None:
    if family == "anthropic":
        cap = _cap(body.get("max_tokens"), "max_tokens")
        if cap is None:
            raise ApiError(400, "Malformed input request: required key [max_tokens] not found")
        return cap
    if family == "amazon.nova":
        config = body.get("inferenceConfig") or {}
        return _cap(config.get("max_new_tokens"), "inferenceConfig.max_new_tokens")
    if family == "amazon.titan":
        config = body.get("textGenerationConfig") or {}
        return _cap(config.get("maxTokenCount"), "textGenerationConfig.maxTokenCount") or 512
    if family == "meta":
        return _cap(body.get("max_gen_len"), "max_gen_len") or 512
    return _cap(body.get("max_tokens"), "max_tokens")


def _invoke_body(family: str, call: ApiCall, usage: Usage, text: str) -> dict[str, Any]:
    stop = usage.truncated
    if family == "anthropic":
        return {
            "id": f"msg_bdrk_fake{call.serial:020d}",
            "type": "message",
            "role": "assistant",
            "model": "claude-fake",
            "content": [{"type": "text", "text": text}],
            "stop_reason": "max_tokens" if stop else "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": usage.input_tokens - usage.cached_tokens,
                "cache_read_input_tokens": usage.cached_tokens,
                "cache_creation_input_tokens": 0,
                "output_tokens": usage.output_tokens,
            },
        }
    if family == "amazon.nova":
        return {
            "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
            "stopReason": "max_tokens" if stop else "end_turn",
            "usage": {
                "inputTokens": usage.input_tokens - usage.cached_tokens,
                "outputTokens": usage.output_tokens,
                "totalTokens": usage.total_tokens,
                "cacheReadInputTokenCount": usage.cached_tokens,
                "cacheWriteInputTokenCount": 0,
            },
        }
    if family == "amazon.titan":
        return {
            "inputTextTokenCount": usage.input_tokens,
            "results": [
                {
                    "tokenCount": usage.output_tokens,
                    "outputText": text,
                    "completionReason": "LENGTH" if stop else "FINISH",
                }
            ],
        }
    return {  # meta and the rest: Llama's shape
        "generation": text,
        "prompt_token_count": usage.input_tokens,
        "generation_token_count": usage.output_tokens,
        "stop_reason": "length" if stop else "stop",
    }


def _stream_events(family: str, usage: Usage, pieces: list[str]) -> list[dict[str, Any]]:
    stop = usage.truncated
    if family == "anthropic":
        start = {
            "type": "message",
            "role": "assistant",
            "usage": {"input_tokens": usage.input_tokens, "output_tokens": 1},
        }
        events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
        events += [
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}
            for p in pieces
        ]
        events.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "max_tokens" if stop else "end_turn"},
                "usage": {"output_tokens": usage.output_tokens},
            }
        )
        events.append({"type": "message_stop"})
        return events
    if family == "amazon.nova":
        events = [{"messageStart": {"role": "assistant"}}]
        events += [
            {"contentBlockDelta": {"delta": {"text": p}, "contentBlockIndex": 0}} for p in pieces
        ]
        events.append({"messageStop": {"stopReason": "max_tokens" if stop else "end_turn"}})
        events.append(
            {
                "metadata": {
                    "usage": {
                        "inputTokens": usage.input_tokens,
                        "outputTokens": usage.output_tokens,
                    }
                }
            }
        )
        return events
    if family == "amazon.titan":
        return [{"outputText": p, "index": 0} for p in pieces] + [
            {"outputText": "", "completionReason": "LENGTH" if stop else "FINISH"}
        ]
    return [{"generation": p, "stop_reason": None} for p in pieces] + [
        {
            "generation": "",
            "prompt_token_count": usage.input_tokens,
            "generation_token_count": usage.output_tokens,
            "stop_reason": "length" if stop else "stop",
        }
    ]


def _invoke(call: ApiCall, model: str, stream: bool) -> JSONReply | StreamReply:
    family = _family(model)
    usage = _billed(call, model, _invoke_cap(family, call.body))
    pieces = text_pieces(usage.text_tokens)
    fresh = usage.input_tokens - usage.cached_tokens  # Bedrock counts cache reads apart
    counts = {
        "x-amzn-bedrock-input-token-count": str(fresh),
        "x-amzn-bedrock-output-token-count": str(usage.output_tokens),
        "x-amzn-bedrock-invocation-latency": "1",
    }
    if usage.cached_tokens:
        counts["x-amzn-bedrock-cache-read-input-token-count"] = str(usage.cached_tokens)
    if not stream:
        return JSONReply(_invoke_body(family, call, usage, "".join(pieces)), headers=counts)
    events = _stream_events(family, usage, pieces)
    events[-1]["amazon-bedrock-invocationMetrics"] = {
        "inputTokenCount": fresh,
        "outputTokenCount": usage.output_tokens,
        "cacheReadInputTokenCount": usage.cached_tokens,
        "invocationLatency": 1,
        "firstByteLatency": 1,
    }
    chunks = [
        event_message("chunk", {"bytes": base64.b64encode(json.dumps(e).encode()).decode()})
        for e in events
    ]
    return StreamReply(chunks, content_type=_EVENT_STREAM)


# -- routing ---------------------------------------------------------------------------

_ROUTE = re.compile(
    r"/model/(?P<model>[^/]+)/(?P<op>converse|converse-stream|invoke|invoke-with-response-stream)"
)


def _runtime(call: ApiCall) -> JSONReply | StreamReply:
    match = _ROUTE.fullmatch(call.path)
    if match is None:  # the pattern routed it here
        raise ApiError(404, f"Unknown route {call.path}")
    model, op = unquote(match["model"]), match["op"]
    if op.startswith("converse"):
        return _converse(call, model, op == "converse-stream")
    return _invoke(call, model, op == "invoke-with-response-stream")


ROUTES: Mapping[str, Callable[[ApiCall], JSONReply | StreamReply]] = {}
"""Bedrock has no fixed paths: every route names its model."""

PATTERNS: tuple[tuple[re.Pattern[str], Callable[[ApiCall], JSONReply | StreamReply]], ...] = (
    (_ROUTE, _runtime),
)
"""POST routes of the Bedrock runtime API, by path pattern."""
