"""Response builders for the Cohere API routes of the fake server.

Routes: ``POST /v2/chat`` (JSON, or server-sent events in v2's event sequence
``message-start``, ``content-start``, ``content-delta``..., ``content-end``,
``message-end``), ``/v2/embed``, ``/v2/rerank`` and ``/v1/chat`` (JSON, or
v1's newline-delimited JSON events ending with ``stream-end``), in the shapes
the ``cohere`` SDK parses.

Usage is the server's deterministic plan (``ApiCall.plan_usage``): v2 reports
it as ``usage.billed_units`` and ``usage.tokens`` (``input_tokens``,
``output_tokens``), in a stream on the ``message-end`` event's
``delta.usage``; v1 as ``meta.billed_units``; rerank bills ``search_units``.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from typing import Any

from ._common import (
    ApiCall,
    ApiError,
    JSONReply,
    StreamReply,
    Usage,
    dumps,
    read_cap,
    sse,
    text_pieces,
)

__all__ = ["ROUTES", "error_payload"]

_DIMENSIONS = 8


def error_payload(status: int, message: str) -> dict[str, Any]:
    """A Cohere error body: ``{"id", "message"}``."""
    return {"id": f"err-{status}", "message": message}


def _model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "invalid request: model must be a non-empty string")
    return model


def _units(usage: Usage) -> dict[str, Any]:
    counts = {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}
    return {"billed_units": counts, "tokens": dict(counts)}


def _v2_chat(call: ApiCall) -> JSONReply | StreamReply:
    body = call.body
    _model(body)
    if not isinstance(body.get("messages"), list):
        raise ApiError(400, "invalid request: messages must be a list")
    usage = call.plan_usage(read_cap(body, "max_tokens"))
    pieces = text_pieces(usage.text_tokens)
    finish = "MAX_TOKENS" if usage.truncated else "COMPLETE"
    ident = f"chat-fake{call.serial}"
    if not body.get("stream"):
        message = {"role": "assistant", "content": [{"type": "text", "text": "".join(pieces)}]}
        return JSONReply(
            {"id": ident, "finish_reason": finish, "message": message, "usage": _units(usage)}
        )

    def event(kind: str, **fields: Any) -> bytes:
        return sse({"type": kind, **fields}, event=kind)

    start = {"message": {"role": "assistant", "content": []}}
    chunks = [event("message-start", id=ident, delta=start)]
    text = {"message": {"content": {"type": "text", "text": ""}}}
    chunks.append(event("content-start", index=0, delta=text))
    for piece in pieces:
        chunks.append(
            event("content-delta", index=0, delta={"message": {"content": {"text": piece}}})
        )
    chunks.append(event("content-end", index=0))
    chunks.append(event("message-end", delta={"finish_reason": finish, "usage": _units(usage)}))
    return StreamReply(chunks)


def _v1_chat(call: ApiCall) -> JSONReply | StreamReply:
    body = call.body
    if not isinstance(body.get("message"), str):
        raise ApiError(400, "invalid request: message must be a string")
    usage = call.plan_usage(read_cap(body, "max_tokens"))
    pieces = text_pieces(usage.text_tokens)
    finish = "MAX_TOKENS" if usage.truncated else "COMPLETE"
    reply = {
        "response_id": f"resp-fake{call.serial}",
        "generation_id": f"gen-fake{call.serial}",
        "text": "".join(pieces),
        "finish_reason": finish,
        "chat_history": [],
        "meta": {"api_version": {"version": "1"}, **_units(usage)},
    }
    if not body.get("stream"):
        return JSONReply(reply)
    lines = [
        dumps(
            {
                "is_finished": False,
                "event_type": "stream-start",
                "generation_id": reply["generation_id"],
            }
        )
        + b"\n"
    ]
    for piece in pieces:
        lines.append(
            dumps({"is_finished": False, "event_type": "text-generation", "text": piece}) + b"\n"
        )
    lines.append(
        dumps(
            {
                "is_finished": True,
                "event_type": "stream-end",
                "finish_reason": finish,
                "response": reply,
            }
        )
        + b"\n"
    )
    return StreamReply(lines, content_type="application/stream+json")


def _v2_embed(call: ApiCall) -> JSONReply:
    body = call.body
    _model(body)
    texts = body.get("texts")
    if not isinstance(texts, list) or not texts:
        raise ApiError(400, "invalid request: texts must be a non-empty list")
    vectors = []
    for text in texts:
        seed = zlib.crc32(str(text).encode("utf-8"))
        vectors.append([((seed >> (i % 24)) % 1000) / 1000.0 for i in range(_DIMENSIONS)])
    usage = call.plan_usage(None)
    return JSONReply(
        {
            "id": f"embed-fake{call.serial}",
            "embeddings": {"float": vectors},
            "texts": texts,
            "meta": {
                "api_version": {"version": "2"},
                "billed_units": {"input_tokens": usage.input_tokens},
            },
            "response_type": "embeddings_by_type",
        }
    )


def _v2_rerank(call: ApiCall) -> JSONReply:
    body = call.body
    _model(body)
    documents = body.get("documents")
    if not isinstance(documents, list):
        raise ApiError(400, "invalid request: documents must be a list")
    results = [
        {"index": i, "relevance_score": round(1.0 / (i + 1), 6)} for i in range(len(documents))
    ]
    return JSONReply(
        {
            "id": f"rerank-fake{call.serial}",
            "results": results[: body.get("top_n") or len(results)],
            "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}},
        }
    )


ROUTES: Mapping[str, Callable[[ApiCall], JSONReply | StreamReply]] = {
    "/v2/chat": _v2_chat,
    "/v1/chat": _v1_chat,
    "/v2/embed": _v2_embed,
    "/v2/rerank": _v2_rerank,
}
"""POST routes of the Cohere API, by path."""
