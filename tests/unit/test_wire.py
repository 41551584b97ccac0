"""Wire-format readers of the vendor guard: requests and replies of every provider API."""

from __future__ import annotations

import base64
import gzip
import json
import struct
import zlib
from typing import Any

import pytest

from veronica_otel.instrumentors._common import ContainedCall
from veronica_otel.instrumentors._wire import (
    UNREADABLE,
    decode_body,
    maybe_api_path,
    output_cap,
    read_body,
    route_of,
)
from veronica_otel.instrumentors._wire_reply import ReplyReader


def _call() -> ContainedCall:
    return ContainedCall.__new__(ContainedCall)  # only its usage fields are used here


def _read(content_type: str, *chunks: bytes, stream: bool = False, encoding: str = "") -> Any:
    call = _call()
    reader = ReplyReader(call, content_type, stream, encoding)
    for chunk in chunks:
        reader.feed_raw(chunk)
    reader.end()
    if not call.usage_seen:
        return None
    return (
        call.input_tokens,
        call.output_tokens,
        call.cached_tokens,
        call.reasoning_tokens,
        call.cache_write_tokens,
    )


def _sse(*events: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


# -- routes and request bodies -------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "wire", "operation", "model", "stream", "priced"),
    [
        ("/v1/chat/completions", "openai", "chat", None, False, True),
        ("/openai/deployments/my-gpt/chat/completions", "openai", "chat", "my-gpt", False, True),
        ("/v1/responses", "openai", "chat", None, False, True),
        ("/v1/embeddings", "openai", "embeddings", None, False, True),
        ("/v1/images/generations", "openai", "generate", None, False, False),
        ("/v1/messages", "anthropic", "chat", None, False, True),
        ("/v1/messages/batches", "anthropic", "batch", None, False, False),
        (
            "/v1beta/models/gemini-2.0-flash:streamGenerateContent",
            "gemini",
            "generate_content",
            "gemini-2.0-flash",
            True,
            True,
        ),
        (
            "/v1/projects/p/locations/us/publishers/anthropic/models/claude-3-5-haiku:rawPredict",
            "anthropic",
            "chat",
            "claude-3-5-haiku",
            False,
            True,
        ),
        (
            "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse-stream",
            "bedrock",
            "chat",
            "anthropic.claude-3-haiku-20240307-v1:0",
            True,
            True,
        ),
        ("/v2/chat", "cohere", "chat", None, False, True),
        ("/v2/rerank", "cohere", "rerank", None, False, False),
        ("/api/chat", "ollama", "chat", None, False, True),
    ],
)
def test_routes(
    path: str, wire: str, operation: str, model: str | None, stream: bool, priced: bool
) -> None:
    assert maybe_api_path(path)
    route = route_of(path)
    assert route is not None
    assert (route.wire, route.operation, route.model, route.stream, route.priced) == (
        wire,
        operation,
        model,
        stream,
        priced,
    )


@pytest.mark.parametrize(
    "path", ["/health", "/v1/models", "/v1/messages/count_tokens", "/api/orders", "/x:y"]
)
def test_other_paths_are_no_api(path: str) -> None:
    assert not maybe_api_path(path) or route_of(path) is None


@pytest.mark.parametrize(
    ("body", "cap"),
    [
        ({"max_tokens": 10}, 10),
        ({"max_tokens": 10, "max_completion_tokens": 30}, 30),  # the largest counts
        ({"max_output_tokens": 7}, 7),
        ({"generationConfig": {"maxOutputTokens": 64}}, 64),
        ({"inferenceConfig": {"maxTokens": 128}}, 128),
        ({"textGenerationConfig": {"maxTokenCount": 5}}, 5),
        ({"max_gen_len": 9}, 9),
        ({"options": {"num_predict": 42}}, 42),
        ({"options": {"num_predict": -1}}, None),  # Ollama's "no limit"
        ({"max_tokens": "10"}, None),
        ({"max_tokens": True}, None),
        ({}, None),
    ],
)
def test_output_cap_under_any_providers_key(body: dict[str, Any], cap: int | None) -> None:
    assert output_cap(body) == cap


def test_read_body() -> None:
    route = route_of("/api/chat")
    assert route is not None
    request = read_body(route, {"model": "llama3", "messages": [{"role": "user"}] * 3})
    assert (request.model, request.n_messages, request.stream) == ("llama3", 3, True)
    gemini = route_of("/v1beta/models/gemini-2.0-flash:generateContent")
    assert gemini is not None
    body = {"contents": [{}], "generationConfig": {"candidateCount": 2, "maxOutputTokens": 8}}
    request = read_body(gemini, body)
    assert (request.model, request.choices, request.cap) == ("gemini-2.0-flash", 2, 8)
    embed = route_of("/v1/embeddings")
    assert embed is not None
    assert read_body(embed, {"model": "m", "input": "x"}).cap == 0


def test_decode_body() -> None:
    assert decode_body(b'{"a": 1}') == {"a": 1}
    assert decode_body(None) is None
    assert decode_body(b"[1]") is UNREADABLE
    assert decode_body(b"not json") is UNREADABLE
    assert decode_body(iter([b"{}"])) is UNREADABLE


# -- replies ---------------------------------------------------------------------------


def test_openai_chat_and_embeddings() -> None:
    chat = {
        "usage": {
            "prompt_tokens": 20,
            "completion_tokens": 9,
            "prompt_tokens_details": {"cached_tokens": 4},
            "completion_tokens_details": {"reasoning_tokens": 3},
        }
    }
    assert _read("application/json", json.dumps(chat).encode()) == (20, 9, 4, 3, 0)
    embeddings = {"usage": {"prompt_tokens": 8, "total_tokens": 8}}
    assert _read("application/json", json.dumps(embeddings).encode()) == (8, 0, 0, 0, 0)


def test_openai_responses_stream() -> None:
    usage = {
        "input_tokens": 11,
        "output_tokens": 6,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 2},
    }
    body = _sse(
        {"type": "response.created", "response": {"usage": None}},
        {"type": "response.output_text.delta", "delta": "hi"},
        {"type": "response.completed", "response": {"usage": usage}},
    )
    assert _read("text/event-stream", body, stream=True) == (11, 6, 0, 2, 0)


def test_anthropic_stream_counts_the_cache_in_the_input() -> None:
    start = {
        "type": "message_start",
        "message": {
            "usage": {
                "input_tokens": 10,
                "cache_read_input_tokens": 4,
                "cache_creation_input_tokens": 2,
                "output_tokens": 1,
            }
        },
    }
    delta = {"type": "message_delta", "usage": {"output_tokens": 15}}
    assert _read("text/event-stream", _sse(start, delta), stream=True) == (16, 15, 4, 0, 2)
    # Cut before message_delta: message_start's output (1) is not the usage.
    assert _read("text/event-stream", _sse(start), stream=True) is None


def test_gemini_json_and_stream() -> None:
    meta = {
        "promptTokenCount": 12,
        "candidatesTokenCount": 7,
        "thoughtsTokenCount": 5,
        "cachedContentTokenCount": 2,
        "toolUsePromptTokenCount": 1,
    }
    whole = {"candidates": [{"finishReason": "STOP"}], "usageMetadata": meta}
    assert _read("application/json", json.dumps(whole).encode()) == (13, 12, 2, 5, 0)
    partial = {
        "candidates": [{"content": {}}],
        "usageMetadata": {**meta, "candidatesTokenCount": 1},
    }
    stream = _sse(partial, whole)
    assert _read("text/event-stream", stream, stream=True) == (13, 12, 2, 5, 0)
    assert _read("text/event-stream", _sse(partial), stream=True) is None  # cut: no finish


def test_bedrock_converse_json_and_invoke_headers() -> None:
    converse = {
        "output": {},
        "usage": {
            "inputTokens": 30,
            "outputTokens": 8,
            "cacheReadInputTokens": 5,
            "cacheWriteInputTokens": 0,
            "totalTokens": 43,
        },
    }
    assert _read("application/json", json.dumps(converse).encode()) == (35, 8, 5, 0, 0)
    call = _call()
    reader = ReplyReader(call, "application/json", False)
    reader.headers(
        {"x-amzn-bedrock-input-token-count": "21", "x-amzn-bedrock-output-token-count": "4"}.get
    )
    assert (call.input_tokens, call.output_tokens) == (21, 4)


def _aws_message(event_type: str, payload: dict[str, Any]) -> bytes:
    name, value = b":event-type", event_type.encode()
    headers = bytes([len(name)]) + name + b"\x07" + struct.pack(">H", len(value)) + value
    body = json.dumps(payload).encode()
    total = 12 + len(headers) + len(body) + 4
    prelude = struct.pack(">II", total, len(headers))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    message = prelude + headers + body
    return message + struct.pack(">I", zlib.crc32(message))


def test_bedrock_event_streams() -> None:
    converse = _aws_message("contentBlockDelta", {"delta": {"text": "hi"}}) + _aws_message(
        "metadata", {"usage": {"inputTokens": 9, "outputTokens": 3}, "metrics": {}}
    )
    kind = "application/vnd.amazon.eventstream"
    # Fed in pieces that cut the frames anywhere.
    assert _read(kind, converse[:7], converse[7:50], converse[50:], stream=True) == (
        9,
        3,
        0,
        0,
        0,
    )
    inner = {
        "type": "message_stop",
        "amazon-bedrock-invocationMetrics": {"inputTokenCount": 14, "outputTokenCount": 6},
    }
    chunk = {"bytes": base64.b64encode(json.dumps(inner).encode()).decode()}
    assert _read(kind, _aws_message("chunk", chunk), stream=True) == (14, 6, 0, 0, 0)


def test_cohere_v1_v2() -> None:
    v2 = {
        "usage": {
            "billed_units": {"input_tokens": 6, "output_tokens": 2},
            "tokens": {"input_tokens": 70, "output_tokens": 2},
        }
    }
    assert _read("application/json", json.dumps(v2).encode()) == (6, 2, 0, 0, 0)
    end = {"type": "message-end", "delta": {"usage": v2["usage"]}}
    assert _read("text/event-stream", _sse({"type": "content-delta"}, end), stream=True) == (
        6,
        2,
        0,
        0,
        0,
    )
    v1 = {
        "event_type": "stream-end",
        "response": {"meta": {"billed_units": {"input_tokens": 5, "output_tokens": 3}}},
    }
    lines = b'{"event_type": "text-generation", "text": "a"}\n' + json.dumps(v1).encode() + b"\n"
    assert _read("application/stream+json", lines, stream=True) == (5, 3, 0, 0, 0)


def test_ollama_ndjson_stream_and_json() -> None:
    lines = [
        {"model": "llama3", "message": {"content": "a"}, "done": False},
        {"model": "llama3", "done": True, "prompt_eval_count": 26, "eval_count": 4},
    ]
    raw = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    assert _read("application/x-ndjson", raw[:10], raw[10:], stream=True) == (26, 4, 0, 0, 0)
    assert _read("application/json", json.dumps(lines[1]).encode()) == (26, 4, 0, 0, 0)
    assert _read("application/x-ndjson", json.dumps(lines[0]).encode(), stream=True) is None


def test_gzip_and_unreadable_bodies() -> None:
    chat = json.dumps({"usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode()
    packed = gzip.compress(chat)
    assert _read("application/json", packed[:5], packed[5:], encoding="gzip") == (3, 1, 0, 0, 0)
    assert _read("application/json", packed, encoding="br") is None  # not read: reservation
    assert _read("application/json", chat[:-3]) is None  # cut JSON
    bad = json.dumps({"usage": {"prompt_tokens": -3, "completion_tokens": 1}}).encode()
    assert _read("application/json", bad) is None
