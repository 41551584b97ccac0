"""Response builders for the Gemini API and Vertex AI routes of the fake server.

Routes (``POST``; the model is part of the path, so they are ``PATTERNS``):

- Gemini API: ``/{v1,v1beta,v1alpha}/models/{model}:{method}``;
- Vertex AI: ``/{v1,v1beta1}/projects/{p}/locations/{l}/publishers/{pub}/models/{model}:{method}``
  and the express-mode form without ``projects/{p}/locations/{l}``;

where ``method`` is ``generateContent``, ``streamGenerateContent`` (server-sent
events with ``?alt=sse``), ``embedContent``, ``batchEmbedContents``,
``predict`` of embedding instances (Vertex, older SDKs), ``countTokens`` or
``batchGenerateContent`` (Gemini API batches: a pending operation).
Bodies are the REST JSON shapes ``google-genai`` parses.

Usage follows the real ``usageMetadata``: ``promptTokenCount`` is the whole
prompt, ``cachedContentTokenCount`` included; ``candidatesTokenCount`` is the
visible output and ``thoughtsTokenCount`` the thinking, billed as output but
reported apart (the server's ``reasoning_tokens`` are part of its output, so
they come out of the candidates' count). ``generationConfig.maxOutputTokens``
caps thinking and text together (``finishReason`` ``MAX_TOKENS`` when it cuts),
and ``candidateCount`` candidates are each that long. In a stream every chunk
carries the running usage; only the last one, with the ``finishReason``, has
the final numbers. Errors are Google's ``{"error": {"code", "message", "status"}}``.
A scripted reply's tool calls (the runaway model's) are ``functionCall`` parts.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

from ._common import ApiCall, ApiError, JSONReply, StreamReply, Usage, plan_usage, sse, text_pieces

__all__ = ["PATTERNS", "ROUTES", "error_payload", "model_of"]

_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "NOT_IMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_PREFIX = (
    r"/(?:v1|v1beta|v1alpha)/models/"
    r"|/(?:v1|v1beta1)/(?:projects/[^/]+/locations/[^/]+/)?publishers/[^/]+/models/"
)
_PATH = re.compile(rf"(?:{_PREFIX})(?P<model>[^/:]+):(?P<method>[A-Za-z]+)")
_EMBEDDING_DIMENSIONS = 8


def error_payload(status: int, message: str) -> dict[str, Any]:
    """A Google API error body: ``{"error": {"code", "message", "status"}}``."""
    kind = _STATUS.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION")
    return {"error": {"code": status, "message": message, "status": kind}}


def model_of(path: str) -> str | None:
    """The model a Gemini or Vertex path names, or None when it is not one of ours."""
    found = _PATH.fullmatch(path)
    return None if found is None else found["model"]


def _cap(body: Mapping[str, Any]) -> tuple[int | None, int]:
    config = body.get("generationConfig") or {}
    if not isinstance(config, Mapping):
        raise ApiError(400, "generationConfig must be an object")
    cap, count = config.get("maxOutputTokens"), config.get("candidateCount", 1)
    for name, value in (("maxOutputTokens", cap), ("candidateCount", count)):
        if value is not None and (type(value) is not int or value < (name == "candidateCount")):
            raise ApiError(400, f"generationConfig.{name} must be a positive integer")
    return cap, count


def _contents(body: Mapping[str, Any]) -> None:
    if not isinstance(body.get("contents"), list) or not body["contents"]:
        raise ApiError(400, "* GenerateContentRequest.contents: contents is not specified")


def _usage(usage: Usage, candidates: int, final: bool, pieces: int) -> dict[str, Any]:
    """``usageMetadata``: running (``pieces`` streamed so far) until ``final``."""
    text = usage.text_tokens * candidates if final else pieces
    thoughts = usage.reasoning_tokens * candidates
    payload: dict[str, Any] = {"promptTokenCount": usage.input_tokens}
    if text:
        payload["candidatesTokenCount"] = text
    if thoughts:
        payload["thoughtsTokenCount"] = thoughts
    if usage.cached_tokens:
        payload["cachedContentTokenCount"] = usage.cached_tokens
    payload["totalTokenCount"] = usage.input_tokens + text + thoughts
    payload["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": usage.input_tokens}]
    return payload


def _generate(call: ApiCall, model: str, stream: bool) -> JSONReply | StreamReply:
    body = call.body
    _contents(body)
    cap, candidates = _cap(body)
    usage = plan_usage(call.settings, call.body_size, cap)
    if call.bill is not None:  # the model is in the path: bill it by name
        billed = dataclasses.replace(
            usage,
            output_tokens=usage.output_tokens * candidates,
            reasoning_tokens=usage.reasoning_tokens * candidates,
        )
        call.bill(model, billed)
    calls = call.script.tool_calls if call.script is not None else ()
    functions: list[dict[str, Any]] = [
        {"functionCall": {"name": c.name, "args": dict(c.arguments)}} for c in calls
    ]
    pieces = [] if functions else text_pieces(usage.text_tokens)
    finish = "MAX_TOKENS" if usage.truncated else "STOP"
    response_id = f"fake{call.serial:020d}"
    if not stream:
        text_part: list[dict[str, Any]] = [] if functions else [{"text": "".join(pieces)}]
        candidate_list = [
            {
                "content": {"parts": text_part + functions, "role": "model"},
                "finishReason": finish,
                "index": i,
            }
            for i in range(candidates)
        ]
        return JSONReply(
            {
                "candidates": candidate_list,
                "usageMetadata": _usage(usage, candidates, True, 0),
                "modelVersion": model,
                "responseId": response_id,
            }
        )
    chunks = []
    parts: list[list[dict[str, Any]]] = [[{"text": piece}] for piece in pieces or [""]]
    if functions:
        parts = [functions]
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        candidate: dict[str, Any] = {"content": {"parts": part, "role": "model"}}
        if last:
            candidate["finishReason"] = finish
        chunk = {
            "candidates": [{**candidate, "index": n} for n in range(candidates)],
            "usageMetadata": _usage(usage, candidates, last, i + 1),
            "modelVersion": model,
            "responseId": response_id,
        }
        chunks.append(sse(chunk).replace(b"\n\n", b"\r\n\r\n"))
    return StreamReply(chunks)


def _texts(value: object) -> int:
    """UTF-8 bytes of the text parts under ``value`` (what an embedding bills)."""
    if isinstance(value, Mapping):
        text = value.get("text")
        own = len(text.encode("utf-8")) if isinstance(text, str) else 0
        return own + sum(_texts(v) for k, v in value.items() if k != "text")
    if isinstance(value, list):
        return sum(_texts(item) for item in value)
    return 0


def _embed(call: ApiCall, model: str, batch: bool) -> JSONReply:
    body = call.body
    if batch:
        requests = body.get("requests")
        if not isinstance(requests, list) or not requests:
            raise ApiError(400, "* BatchEmbedContentsRequest.requests: requests is not specified")
        count = len(requests)
    else:
        if not isinstance(body.get("content"), Mapping):
            raise ApiError(400, "* EmbedContentRequest.content: content is not specified")
        count = 1
    tokens = max(1, -(-_texts(body) // 4))
    settings = dataclasses.replace(call.settings, input_tokens=tokens, output_tokens=0)
    usage = plan_usage(settings, call.body_size, 0)
    if call.bill is not None:
        call.bill(model, usage)
    vector = {"values": [round(0.1 * (i + 1), 3) for i in range(_EMBEDDING_DIMENSIONS)]}
    metadata = {"promptTokenCount": tokens, "totalTokenCount": tokens}
    if batch:
        return JSONReply({"embeddings": [vector] * count, "usageMetadata": metadata})
    return JSONReply({"embedding": vector, "usageMetadata": metadata})


def _is_embedding(body: Mapping[str, Any]) -> bool:
    instances = body.get("instances")
    return isinstance(instances, list) and all(
        isinstance(i, Mapping) and "content" in i for i in instances
    )


def _predict_embeddings(call: ApiCall, model: str) -> JSONReply:
    """Vertex ``predict`` of embedding instances: usage per prediction (``statistics``)."""
    predictions = []
    total = 0
    for instance in call.body["instances"]:
        content = instance["content"]
        size = len(content.encode("utf-8")) if isinstance(content, str) else _texts(content)
        tokens = max(1, -(-size // 4))
        total += tokens
        vector = [round(0.1 * (i + 1), 3) for i in range(_EMBEDDING_DIMENSIONS)]
        statistics = {"token_count": tokens, "truncated": False}
        predictions.append({"embeddings": {"values": vector, "statistics": statistics}})
    settings = dataclasses.replace(call.settings, input_tokens=total, output_tokens=0)
    if call.bill is not None:
        call.bill(model, plan_usage(settings, call.body_size, 0))
    return JSONReply({"predictions": predictions, "metadata": {"billableCharacterCount": total}})


def _count_tokens(call: ApiCall) -> JSONReply:
    _contents(call.body)
    usage = plan_usage(call.settings, call.body_size, None)  # counting is free: not billed
    return JSONReply({"totalTokens": usage.input_tokens})


def _batch(call: ApiCall, model: str) -> JSONReply:
    """``batches.create`` (Gemini API): the batch's long-running operation, pending."""
    name = f"batches/fake{call.serial}"
    metadata = {
        "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch",
        "name": name,
        "model": f"models/{model}",
        "state": "BATCH_STATE_PENDING",
        "createTime": "2026-01-01T00:00:00Z",
    }
    return JSONReply({"name": name, "metadata": metadata})


def _route(call: ApiCall) -> JSONReply | StreamReply:
    found = _PATH.fullmatch(call.path)
    assert found is not None  # routed here by PATTERNS
    model, method = found["model"], found["method"]
    if method in ("generateContent", "streamGenerateContent"):
        return _generate(call, model, method == "streamGenerateContent")
    if method in ("embedContent", "batchEmbedContents"):
        return _embed(call, model, method == "batchEmbedContents")
    if method == "countTokens":
        return _count_tokens(call)
    if method == "predict" and _is_embedding(call.body):
        return _predict_embeddings(call, model)
    if method == "batchGenerateContent":
        return _batch(call, model)
    raise ApiError(404, f"Method {method} is not found for model {model}")


ROUTES: Mapping[str, Callable[[ApiCall], JSONReply | StreamReply]] = {}
PATTERNS: tuple[tuple[re.Pattern[str], Callable[[ApiCall], JSONReply | StreamReply]], ...] = (
    (_PATH, _route),
)
"""The Gemini API and Vertex AI model routes (the model is in the path)."""
