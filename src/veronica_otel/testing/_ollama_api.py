"""Response builders for the Ollama API routes of the fake server.

Routes (``POST``): ``/api/chat``, ``/api/generate``, ``/api/embed``,
``/api/embeddings`` (the legacy one), ``/v1/systemone``, and ollama.com's
``/api/web_search`` and ``/api/web_fetch``.

The wire format is Ollama's own, as the ``ollama`` SDK parses it:

* a stream (``"stream"`` true, or absent: Ollama streams by default) is NDJSON,
  ``application/x-ndjson``, one JSON object per line; each chunk carries a
  piece of text (``message.content`` for chat, ``response`` for generate) and
  ``"done": false``; the last one ``"done": true`` with ``done_reason``
  (``"stop"``, or ``"length"`` when ``options.num_predict`` cut it) and the
  usage;
* usage is ``prompt_eval_count`` (input tokens) and ``eval_count`` (output
  tokens), with durations in nanoseconds; ``/api/embed`` reports only
  ``prompt_eval_count``, ``/api/embeddings`` nothing;
* the output cap is ``options.num_predict``; ``-1``, ``-2`` or absent is none;
* errors are ``{"error": "message"}``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from ._common import ApiCall, ApiError, JSONReply, StreamReply, Usage, dumps, text_pieces

__all__ = ["ROUTES", "error_payload"]

_CREATED_AT = "2026-01-01T00:00:00.000000Z"
_NS_PER_TOKEN = 1_000_000  # a millisecond a token: durations that add up
_DIMENSIONS = 4


def error_payload(status: int, message: str) -> dict[str, Any]:
    """Return an Ollama-style error body: ``{"error": message}``."""
    return {"error": message}


def _model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "model is required")
    return model


def _cap(body: Mapping[str, Any]) -> int | None:
    options = body.get("options")
    if options is None:
        return None
    if not isinstance(options, Mapping):
        raise ApiError(400, "json: cannot unmarshal options")
    value = options.get("num_predict")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ApiError(400, f"option num_predict must be of type integer, got {value!r}")
    value = int(value)  # Ollama reads a number into an int, truncating it
    return value if value > 0 else None


def _schema(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    fmt = body.get("format")
    if isinstance(fmt, Mapping):
        return fmt
    return {"type": "object"} if fmt == "json" else None


def _streams(body: Mapping[str, Any]) -> bool:
    return body.get("stream") is not False


def _final(usage: Usage, model: str) -> dict[str, Any]:
    return {
        "model": model,
        "created_at": _CREATED_AT,
        "done": True,
        "done_reason": "length" if usage.truncated else "stop",
        "total_duration": (usage.input_tokens + usage.output_tokens) * _NS_PER_TOKEN,
        "load_duration": 0,
        "prompt_eval_count": usage.input_tokens,
        "prompt_eval_duration": usage.input_tokens * _NS_PER_TOKEN,
        "eval_count": usage.output_tokens,
        "eval_duration": usage.output_tokens * _NS_PER_TOKEN,
    }


def _ndjson(objects: list[dict[str, Any]]) -> StreamReply:
    return StreamReply([dumps(obj) + b"\n" for obj in objects], content_type="application/x-ndjson")


def _generated(call: ApiCall, piece: Callable[[str], dict[str, Any]]) -> JSONReply | StreamReply:
    body = call.body
    model = _model(body)
    usage = call.plan_usage(_cap(body))
    pieces = text_pieces(usage.output_tokens, _schema(body))
    final = _final(usage, model)
    if not _streams(body):
        return JSONReply({**piece("".join(pieces)), **final})
    head = {"model": model, "created_at": _CREATED_AT}
    chunks = [{**head, **piece(text), "done": False} for text in pieces]
    chunks.append({**piece(""), **final})
    return _ndjson(chunks)


def _chat(call: ApiCall) -> JSONReply | StreamReply:
    if not isinstance(call.body.get("messages", []), list):
        raise ApiError(400, "json: cannot unmarshal messages")
    return _generated(call, lambda text: {"message": {"role": "assistant", "content": text}})


def _generate(call: ApiCall) -> JSONReply | StreamReply:
    reply = _generated(call, lambda text: {"response": text})
    if isinstance(reply, JSONReply):
        return JSONReply({**reply.payload, "context": [1, 2, 3]})
    return reply


def _vector(seed: int) -> list[float]:
    return [round(math.sin(seed + i), 6) for i in range(_DIMENSIONS)]


def _embed(call: ApiCall) -> JSONReply:
    body = call.body
    model = _model(body)
    inputs = body.get("input", "")
    texts = inputs if isinstance(inputs, list) else [inputs]
    usage = call.plan_usage(0)
    return JSONReply(
        {
            "model": model,
            "embeddings": [_vector(i) for i in range(len(texts))],
            "total_duration": usage.input_tokens * _NS_PER_TOKEN,
            "load_duration": 0,
            "prompt_eval_count": usage.input_tokens,
        }
    )


def _embeddings(call: ApiCall) -> JSONReply:
    _model(call.body)
    call.plan_usage(0)  # billed, but the legacy reply reports no usage
    return JSONReply({"embedding": _vector(0)})


def _answer(name: str, question: object) -> dict[str, Any]:
    kind = question.get("type") if isinstance(question, Mapping) else None
    criteria = question.get("criteria") if isinstance(question, Mapping) else None
    if kind == "choice" and isinstance(criteria, Mapping) and criteria:
        keys = list(criteria)
        share = round(1 / len(keys), 6)
        return {
            "type": "choice",
            "choice": keys[0],
            "probabilities": dict.fromkeys(keys, share),
            "confidence": share,
        }
    if kind == "score" and isinstance(criteria, list) and criteria:
        share = round(1 / len(criteria), 6)
        return {
            "type": "score",
            "score": 0.0,
            "legend": {str(i): str(c) for i, c in enumerate(criteria)},
            "probabilities": {str(i): share for i in range(len(criteria))},
            "confidence": share,
        }
    if kind in (None, "noul"):
        return {"type": "noul", "noul": 0.5}
    raise ApiError(400, f"questions.{name}: unknown type {kind!r}")


def _systemone(call: ApiCall) -> JSONReply:
    body = call.body
    model = _model(body)
    questions = body.get("questions")
    if not isinstance(questions, Mapping) or not questions:
        raise ApiError(400, "questions is required")
    answers = {name: _answer(name, question) for name, question in questions.items()}
    usage = call.plan_usage(len(answers))
    return JSONReply(
        {
            "model": model,
            "answers": answers,
            "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens},
        }
    )


def _web_search(call: ApiCall) -> JSONReply:
    query = call.body.get("query")
    if not isinstance(query, str) or not query:
        raise ApiError(400, "query is required")
    count = call.body.get("max_results") or 3
    results = [
        {"title": f"{query} {i}", "url": f"https://example.com/{i}", "content": f"about {query}"}
        for i in range(int(count))
    ]
    return JSONReply({"results": results})


def _web_fetch(call: ApiCall) -> JSONReply:
    url = call.body.get("url")
    if not isinstance(url, str) or not url:
        raise ApiError(400, "url is required")
    return JSONReply({"title": url, "content": f"the page at {url}", "links": [url]})


ROUTES: Mapping[str, Callable[[ApiCall], JSONReply | StreamReply]] = {
    "/api/chat": _chat,
    "/api/generate": _generate,
    "/api/embed": _embed,
    "/api/embeddings": _embeddings,
    "/v1/systemone": _systemone,
    "/api/web_search": _web_search,
    "/api/web_fetch": _web_fetch,
}
"""POST routes of the Ollama API (and ollama.com's web tools), by path."""
