"""Response builders for the Mistral AI API routes of the fake server.

Routes: ``POST /v1/chat/completions``, ``/v1/fim/completions``,
``/v1/agents/completions`` (non-streamed or streamed) and ``/v1/embeddings``,
in the shapes the ``mistralai`` SDK parses. Chat and embeddings share their
paths with OpenAI's but not their bodies (Mistral's embeddings carry an
``id``, its streams end with a chunk holding ``usage`` whatever the request
asks), so the server answers with these builders when the request comes from
the ``mistralai`` SDK: :data:`CLAIMS` names the header that says so.

Usage is the server's deterministic plan (``ApiCall.plan_usage``), reported
as ``usage.prompt_tokens`` / ``completion_tokens`` / ``total_tokens``; a
stream's last chunk carries it with the ``finish_reason``, then ``[DONE]``.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from typing import Any

from ._common import ApiCall, ApiError, JSONReply, StreamReply, Usage, read_cap, sse, text_pieces

__all__ = ["CLAIMS", "ROUTES", "error_payload"]

# (header, value prefix): a request whose header starts so is this API's.
CLAIMS = (("user-agent", "mistral-client-python/"),)
_AGENT_MODEL = "mistral-large-latest"  # what the fake agents run on
_DIMENSIONS = 8


def error_payload(status: int, message: str) -> dict[str, Any]:
    """A Mistral error body: ``{"object": "error", "message", "type", "param", "code"}``."""
    kind = "invalid_request_error" if status < 500 else "internal_server_error"
    return {"object": "error", "message": message, "type": kind, "param": None, "code": None}


def _usage(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
    }


def _completion(call: ApiCall, model: str, prefix: str) -> JSONReply | StreamReply:
    body = call.body
    usage = call.plan_usage(read_cap(body, "max_tokens"))
    pieces = text_pieces(usage.text_tokens)
    finish = "length" if usage.truncated else "stop"
    head = {"id": f"{prefix}-fake{call.serial}", "created": call.created, "model": model}
    if not body.get("stream"):
        message = {"role": "assistant", "content": "".join(pieces), "tool_calls": None}
        choice = {"index": 0, "message": message, "finish_reason": finish}
        return JSONReply(
            {**head, "object": "chat.completion", "usage": _usage(usage), "choices": [choice]}
        )

    def chunk(delta: dict[str, Any], reason: str | None = None, **extra: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": reason}
        return sse({**head, "object": "chat.completion.chunk", "choices": [choice], **extra})

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks.extend(chunk({"content": piece}) for piece in pieces)
    chunks.append(chunk({"content": ""}, finish, usage=_usage(usage)))
    chunks.append(sse("[DONE]"))
    return StreamReply(chunks)


def _model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "model: field required")
    return model


def _chat(call: ApiCall) -> JSONReply | StreamReply:
    if not isinstance(call.body.get("messages"), list):
        raise ApiError(400, "messages: field required")
    return _completion(call, _model(call.body), "cmpl")


def _fim(call: ApiCall) -> JSONReply | StreamReply:
    if not isinstance(call.body.get("prompt"), str):
        raise ApiError(400, "prompt: field required")
    return _completion(call, _model(call.body), "fim")


def _agents(call: ApiCall) -> JSONReply | StreamReply:
    if not isinstance(call.body.get("agent_id"), str):
        raise ApiError(400, "agent_id: field required")
    return _completion(call, _AGENT_MODEL, "agent")


def _embeddings(call: ApiCall) -> JSONReply:
    body = call.body
    model = _model(body)
    raw = body.get("input")
    inputs = [raw] if isinstance(raw, str) else raw
    if not isinstance(inputs, list) or not inputs:
        raise ApiError(400, "input: field required")
    data = []
    for index, text in enumerate(inputs):
        seed = zlib.crc32(str(text).encode("utf-8"))
        vector = [((seed >> (i % 24)) % 1000) / 1000.0 for i in range(_DIMENSIONS)]
        data.append({"object": "embedding", "embedding": vector, "index": index})
    usage = call.plan_usage(None)
    return JSONReply(
        {
            "id": f"emb-fake{call.serial}",
            "object": "list",
            "model": model,
            "usage": {
                "prompt_tokens": usage.input_tokens,
                "completion_tokens": 0,
                "total_tokens": usage.input_tokens,
            },
            "data": data,
        }
    )


ROUTES: Mapping[str, Callable[[ApiCall], JSONReply | StreamReply]] = {
    "/v1/chat/completions": _chat,
    "/v1/fim/completions": _fim,
    "/v1/agents/completions": _agents,
    "/v1/embeddings": _embeddings,
}
"""POST routes of the Mistral AI API, by path (chat and embeddings: when claimed)."""
