"""Response builders for the OpenAI API routes of the fake server.

Routes: ``POST /v1/chat/completions``, ``/v1/responses``, ``/v1/embeddings`` and
``/v1/completions`` (legacy), each non-streamed or streamed where the real API
streams; ``/v1/images/generations``, ``/v1/audio/speech`` (audio bytes),
``/v1/files`` (multipart uploads), and
jobs billed later (``/v1/batches``, ``/v1/fine_tuning/jobs``, ``/v1/videos``),
answered as queued. Bodies follow the shapes the ``openai`` SDK parses, including the
details a strict client checks: the usage-only final chunk of a chat stream
(``choices: []``) when ``stream_options.include_usage`` is set, the ``[DONE]``
sentinel, and the Responses event sequence with increasing ``sequence_number``
and stable item ids.

Structured output: when a request asks for ``response_format`` /
``text.format`` of type ``json_schema``, the text is a JSON document built from
the schema's required properties, so ``client.chat.completions.parse`` and
``client.responses.parse`` validate it into the caller's pydantic model.

Scripted replies (:class:`~veronica_otel.testing.ScriptedReply`) replace a
chat completion's text and can ask for tool calls (``message.tool_calls``,
streamed as ``delta.tool_calls`` with an ``index``, ``finish_reason``
``"tool_calls"``), so a real agent loop calls its tools; the runaway model's
replies are scripted ones, on the Responses API too (``function_call``
output items, streamed with ``response.function_call_arguments.*`` events).
"""

from __future__ import annotations

import base64
import struct
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
    script_pieces,
    sse,
    text_pieces,
)

__all__ = ["ROUTES", "error_payload"]

_PIXEL = base64.b64encode(b"fake image bytes").decode("ascii")  # each image returned

_DEFAULT_EMBEDDING_DIMENSIONS = 8

_ERROR_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    408: ("timeout", None),
    409: ("invalid_request_error", "conflict"),
    422: ("invalid_request_error", None),
    429: ("requests", "rate_limit_exceeded"),
}


def error_payload(status: int, message: str) -> dict[str, Any]:
    """Return an OpenAI-style error body: ``{"error": {"message", "type", "param", "code"}}``."""
    kind, code = _ERROR_TYPES.get(status, ("server_error" if status >= 500 else "error", None))
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _require_model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "you must provide a model parameter")
    return model


def _json_schema(response_format: Any) -> Mapping[str, Any] | None:
    """Schema of a ``json_schema`` / ``json_object`` response format, if any."""
    if not isinstance(response_format, Mapping):
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return {"type": "object"}
    if kind != "json_schema":
        return None
    # Chat nests it under "json_schema"; the Responses API puts it inline.
    holder = response_format.get("json_schema", response_format)
    schema = holder.get("schema") if isinstance(holder, Mapping) else None
    return schema if isinstance(schema, Mapping) else {"type": "object"}


def _include_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, Mapping) and options.get("include_usage") is True


def _completion_usage(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": usage.reasoning_tokens,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _tool_calls(call: ApiCall, streamed: bool) -> list[dict[str, Any]]:
    """The scripted reply's tool calls as the API sends them (streamed: with ``index``)."""
    calls = call.script.tool_calls if call.script is not None else ()
    out = []
    for index, tool in enumerate(calls):
        item: dict[str, Any] = {
            "id": tool.id or f"call_fake{call.serial}_{index}",
            "type": "function",
            "function": {"name": tool.name, "arguments": dumps(dict(tool.arguments)).decode()},
        }
        out.append({"index": index, **item} if streamed else item)
    return out


def _chat_completions(call: ApiCall) -> JSONReply | StreamReply:
    body = call.body
    model = _require_model(body)
    if not isinstance(body.get("messages"), list):
        raise ApiError(400, "'messages' is a required property")
    usage = call.plan_usage(read_cap(body, "max_completion_tokens", "max_tokens"))
    script = call.script
    if script is None:
        pieces = text_pieces(usage.text_tokens, _json_schema(body.get("response_format")))
    elif script.text is None:
        pieces = [] if script.tool_calls else text_pieces(usage.text_tokens)
    else:
        pieces = script_pieces(script.text)
    finish = "length" if usage.truncated else "stop"
    if script is not None and script.tool_calls:
        finish = "tool_calls"
    head = {
        "id": f"chatcmpl-fake{call.serial}",
        "created": call.created,
        "model": model,
        "system_fingerprint": "fp_fake",
        "service_tier": "default",
    }
    if not body.get("stream"):
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(pieces) if pieces or finish != "tool_calls" else None,
            "refusal": None,
            "annotations": [],
        }
        if finish == "tool_calls":
            message["tool_calls"] = _tool_calls(call, streamed=False)
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        return JSONReply(
            {
                **head,
                "object": "chat.completion",
                "choices": [choice],
                "usage": _completion_usage(usage),
            }
        )
    with_usage = _include_usage(body)
    extra: dict[str, Any] = {"usage": None} if with_usage else {}

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return sse({**head, "object": "chat.completion.chunk", "choices": [choice], **extra})

    chunks = [chunk({"role": "assistant", "content": "", "refusal": None})]
    chunks.extend(chunk({"content": piece}) for piece in pieces)
    chunks.extend(chunk({"tool_calls": [tool]}) for tool in _tool_calls(call, streamed=True))
    chunks.append(chunk({}, finish))
    if with_usage:
        last = {**head, "object": "chat.completion.chunk", "choices": []}
        chunks.append(sse({**last, "usage": _completion_usage(usage)}))
    chunks.append(sse("[DONE]"))
    return StreamReply(chunks)


def _text_choice(text: str, finish_reason: str | None) -> dict[str, Any]:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}


def _legacy_completions(call: ApiCall) -> JSONReply | StreamReply:
    body = call.body
    model = _require_model(body)
    if "prompt" not in body:
        raise ApiError(400, "'prompt' is a required property")
    usage = call.plan_usage(read_cap(body, "max_tokens"))
    pieces = text_pieces(usage.text_tokens)
    finish = "length" if usage.truncated else "stop"
    head = {
        "id": f"cmpl-fake{call.serial}",
        "object": "text_completion",
        "created": call.created,
        "model": model,
        "system_fingerprint": "fp_fake",
    }
    if not body.get("stream"):
        choice = _text_choice("".join(pieces), finish)
        return JSONReply({**head, "choices": [choice], "usage": _completion_usage(usage)})
    with_usage = _include_usage(body)
    extra: dict[str, Any] = {"usage": None} if with_usage else {}
    chunks = [sse({**head, "choices": [_text_choice(piece, None)], **extra}) for piece in pieces]
    chunks.append(sse({**head, "choices": [_text_choice("", finish)], **extra}))
    if with_usage:
        chunks.append(sse({**head, "choices": [], "usage": _completion_usage(usage)}))
    chunks.append(sse("[DONE]"))
    return StreamReply(chunks)


def _embedding_inputs(raw: Any) -> list[str]:
    """One string per embedding the request asks for."""
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list) and raw:
        if all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
            return [repr(raw)]
        return [x if isinstance(x, str) else repr(x) for x in raw]
    raise ApiError(400, "'input' must be a non-empty string or array")


def _embeddings(call: ApiCall) -> JSONReply:
    body = call.body
    model = _require_model(body)
    inputs = _embedding_inputs(body.get("input"))
    dimensions = body.get("dimensions", _DEFAULT_EMBEDDING_DIMENSIONS)
    if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
        raise ApiError(400, "'dimensions' must be a positive integer")
    as_base64 = body.get("encoding_format") == "base64"
    data = []
    for index, text in enumerate(inputs):
        seed = zlib.crc32(text.encode("utf-8"))
        vector = [((seed >> (i % 24)) % 1000) / 1000.0 for i in range(dimensions)]
        embedding: Any = vector
        if as_base64:
            packed = struct.pack(f"<{dimensions}f", *vector)
            embedding = base64.b64encode(packed).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    usage = call.plan_usage(None)
    return JSONReply(
        {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": usage.input_tokens, "total_tokens": usage.input_tokens},
        }
    )


def _responses_usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def _response_object(
    call: ApiCall, status: str, output: list[Any], usage: Usage | None
) -> dict[str, Any]:
    body = call.body
    text_config = body.get("text")
    return {
        "id": f"resp_fake{call.serial}",
        "object": "response",
        "created_at": call.created,
        "status": status,
        "background": False,
        "completed_at": call.created if status == "completed" else None,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": None,
        "model": body.get("model"),
        "output": output,
        "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": bool(body.get("store", True)),
        "temperature": body.get("temperature", 1.0),
        "text": text_config if isinstance(text_config, Mapping) else {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []),
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": _responses_usage(usage) if usage is not None else None,
        "user": None,
        "metadata": body.get("metadata") or {},
    }


def _function_call_items(call: ApiCall) -> list[dict[str, Any]]:
    """The scripted reply's tool calls as Responses ``function_call`` output items."""
    calls = call.script.tool_calls if call.script is not None else ()
    return [
        {
            "id": f"fc_fake{call.serial}_{index}",
            "type": "function_call",
            "status": "completed",
            "call_id": tool.id or f"call_fake{call.serial}_{index}",
            "name": tool.name,
            "arguments": dumps(dict(tool.arguments)).decode(),
        }
        for index, tool in enumerate(calls)
    ]


def _responses(call: ApiCall) -> JSONReply | StreamReply:
    body = call.body
    _require_model(body)
    usage = call.plan_usage(read_cap(body, "max_output_tokens"))
    text_config = body.get("text")
    schema = _json_schema(text_config.get("format")) if isinstance(text_config, Mapping) else None
    script = call.script
    functions = _function_call_items(call)
    if script is not None and script.text is not None:
        pieces = script_pieces(script.text)
    elif functions:
        pieces = []
    else:
        pieces = text_pieces(usage.text_tokens, schema)
    text = "".join(pieces)
    status = "incomplete" if usage.truncated else "completed"
    item_id = f"msg_fake{call.serial}"
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    item = {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [part],
    }
    output = ([item] if pieces or not functions else []) + functions
    if not body.get("stream"):
        return JSONReply(_response_object(call, status, output, usage))
    sequence: list[bytes] = []

    def emit(kind: str, **fields: Any) -> None:
        event = {"type": kind, "sequence_number": len(sequence), **fields}
        sequence.append(sse(event, event=kind))

    emit("response.created", response=_response_object(call, "in_progress", [], None))
    emit("response.in_progress", response=_response_object(call, "in_progress", [], None))
    for index, out in enumerate(output):
        if out["type"] == "message":
            where = {"item_id": item_id, "output_index": index, "content_index": 0}
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "content": []},
            )
            emit("response.content_part.added", **where, part={**part, "text": ""})
            for piece in pieces:
                emit("response.output_text.delta", **where, delta=piece, logprobs=[])
            emit("response.output_text.done", **where, text=text, logprobs=[])
            emit("response.content_part.done", **where, part=part)
        else:
            where = {"item_id": out["id"], "output_index": index}
            added = {**out, "status": "in_progress", "arguments": ""}
            emit("response.output_item.added", output_index=index, item=added)
            emit("response.function_call_arguments.delta", **where, delta=out["arguments"])
            emit(
                "response.function_call_arguments.done",
                **where,
                name=out["name"],
                arguments=out["arguments"],
            )
        emit("response.output_item.done", output_index=index, item=out)
    emit(f"response.{status}", response=_response_object(call, status, output, usage))
    return StreamReply(sequence)


def _images(call: ApiCall) -> JSONReply:
    """``images.generate``: ``n`` images, and the token usage a
    ``gpt-image`` model reports (a per-image price must not be applied to it)."""
    body = call.body
    n = body.get("n") or 1
    if type(n) is not int or not 1 <= n <= 10:
        raise ApiError(400, "n must be an integer between 1 and 10")
    model = _require_model(body) if "model" in body else "dall-e-2"
    reply: dict[str, Any] = {
        "created": call.created,
        "data": [{"b64_json": _PIXEL} for _ in range(n)],
    }
    if model.startswith("gpt-image"):
        reply["usage"] = {
            "input_tokens": 50,
            "output_tokens": 4160 * n,
            "total_tokens": 50 + 4160 * n,
            "input_tokens_details": {"text_tokens": 50, "image_tokens": 0},
        }
    return JSONReply(reply)


def _speech(call: ApiCall) -> StreamReply:
    """``audio.speech.create``: audio bytes (not JSON)."""
    if not isinstance(call.body.get("input"), str):
        raise ApiError(400, "input: Field required")
    return StreamReply([b"ID3 fake audio"], content_type="audio/mpeg")


def _files(call: ApiCall) -> JSONReply:
    """``files.create`` (multipart): the file object, its size as received."""
    body = call.body
    size = body.get("file")
    if type(size) is not int or not isinstance(body.get("purpose"), str):
        raise ApiError(400, "file and purpose are required")
    return JSONReply(
        {
            "id": f"file-fake{call.serial}",
            "object": "file",
            "bytes": size,
            "created_at": call.created,
            "filename": "upload",
            "purpose": body["purpose"],
            "status": "processed",
        }
    )


def _job(kind: str, **fields: Any) -> Callable[[ApiCall], JSONReply]:
    """A job the API queues and bills later (a batch, a tuning job, a video)."""

    def build(call: ApiCall) -> JSONReply:
        body = call.body
        job = {"id": f"{kind}_fake{call.serial}", "object": kind, "created_at": call.created}
        job.update({key: body.get(key, value) for key, value in fields.items()})
        return JSONReply(job)

    return build


_OPENAI_ROUTES: dict[str, Callable[[ApiCall], JSONReply | StreamReply]] = {
    "/v1/chat/completions": _chat_completions,
    "/v1/responses": _responses,
    "/v1/embeddings": _embeddings,
    "/v1/completions": _legacy_completions,
    "/v1/images/generations": _images,
    "/v1/audio/speech": _speech,
    "/v1/files": _files,
    "/v1/batches": _job(
        "batch", endpoint=None, input_file_id=None, completion_window="24h", status="validating"
    ),
    "/v1/fine_tuning/jobs": _job(
        "fine_tuning.job", model=None, training_file=None, status="validating_files"
    ),
    "/v1/videos": _job("video", model="sora-2", seconds="4", size="720x1280", status="queued"),
}
ROUTES: Mapping[str, Callable[[ApiCall], JSONReply | StreamReply]] = {
    **_OPENAI_ROUTES,
    # Groq speaks this wire format under /openai (``groq.Groq(base_url=server.base_url)``).
    **{f"/openai{path}": builder for path, builder in _OPENAI_ROUTES.items()},
}
"""POST routes of the OpenAI API (and of the OpenAI-compatible APIs), by path."""
