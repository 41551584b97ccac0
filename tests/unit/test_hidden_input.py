"""Input a request's bytes do not show, per provider: images at their documented
maximum, server-side input at the context window, cache marks (Bedrock's readers;
the openai and anthropic ones are exercised through their SDKs in
tests/integration/test_worst_case.py)."""

from __future__ import annotations

import json
from typing import Any

from veronica_otel.instrumentors._bedrock_request import converse_request, invoke_request
from veronica_otel.instrumentors._hidden_input import (
    ANTHROPIC_IMAGE_TOKENS,
    OPENAI_IMAGE_TOKENS_UNKNOWN,
    anthropic_hidden,
    openai_image_tokens,
)

CLAUDE = "anthropic.claude-3-5-haiku-20241022-v1:0"
TINY_PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 40  # a few bytes can be a large flat image


def _converse(*blocks: dict[str, Any], model: str = CLAUDE, **params: Any) -> Any:
    message = {"role": "user", "content": [{"text": "Look."}, *blocks]}
    return converse_request({"modelId": model, "messages": [message], **params}, False)


def test_a_bedrock_image_adds_its_most_tokens_whatever_its_bytes() -> None:
    image = {"image": {"format": "png", "source": {"bytes": TINY_PNG}}}
    assert _converse(image).extra_input_tokens == ANTHROPIC_IMAGE_TOKENS
    assert _converse(image, image).extra_input_tokens == 2 * ANTHROPIC_IMAGE_TOKENS
    other = _converse(image, model="meta.llama3-2-90b-instruct-v1:0").extra_input_tokens
    assert other == 4 * 1_601


def test_a_bedrock_pdf_or_video_is_bounded_by_the_context_window() -> None:
    pdf = {"document": {"format": "pdf", "name": "a", "source": {"bytes": b"%PDF-1.7"}}}
    text = {"document": {"format": "txt", "name": "a", "source": {"bytes": b"hello"}}}
    video = {"video": {"format": "mp4", "source": {"bytes": b"\x00" * 10}}}
    assert _converse(pdf).extra_input_tokens >= 200_000
    assert _converse(video).extra_input_tokens >= 200_000
    assert _converse(text).extra_input_tokens == 0


def test_bedrock_cache_writes_only_where_a_cache_point_is_set() -> None:
    assert _converse().cache_writes is False
    assert _converse({"cachePoint": {"type": "default"}}).cache_writes is True
    system = [{"text": "Be brief."}, {"cachePoint": {"type": "default"}}]
    assert _converse(system=system).cache_writes is True
    tools = {"tools": [{"toolSpec": {"name": "f"}}, {"cachePoint": {"type": "default"}}]}
    assert _converse(toolConfig=tools).cache_writes is True


def test_bedrock_invoke_model_reads_the_anthropic_body() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}
    body = {
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": [image]}],
    }
    request = invoke_request({"modelId": CLAUDE, "body": json.dumps(body)}, False)
    assert request.extra_input_tokens == ANTHROPIC_IMAGE_TOKENS
    assert request.cache_writes is False


def test_anthropic_cache_marks_anywhere() -> None:
    mark = {"cache_control": {"type": "ephemeral"}}
    text = {"type": "text", "text": "x"}
    assert anthropic_hidden({"messages": [{"role": "user", "content": [text]}]})[2] is False
    assert anthropic_hidden({"messages": [{"role": "user", "content": [{**text, **mark}]}]})[2]
    assert anthropic_hidden({"system": [{**text, **mark}], "messages": []})[2]
    assert anthropic_hidden({"tools": [{"name": "f", **mark}], "messages": []})[2]
    assert anthropic_hidden({**mark, "messages": []})[2]  # automatic caching
    nested = {"type": "tool_result", "tool_use_id": "t", "content": [{**text, **mark}]}
    assert anthropic_hidden({"messages": [{"role": "user", "content": [nested]}]})[2]


def test_openai_image_tokens_per_model_family() -> None:
    assert openai_image_tokens("gpt-4o", "low") == 85
    assert openai_image_tokens("gpt-4o-2024-08-06", "high") == 85 + 8 * 170
    assert openai_image_tokens("gpt-4o-mini", None) == 2_833 + 8 * 5_667
    assert openai_image_tokens("gpt-4.1-nano", "low") == 3_779  # patches: any detail
    assert openai_image_tokens("o3", "auto") == 75 + 8 * 150
    assert openai_image_tokens("some-new-model", "low") == OPENAI_IMAGE_TOKENS_UNKNOWN


def test_converse_reads_text_only_messages_in_its_lane_as_the_general_walk_does() -> None:
    """converse_request skips _unseen when every block is a text block (its rule,
    copied inline); every other shape asks _unseen, and both agree."""
    from collections import UserDict

    from veronica_otel.instrumentors import _bedrock_request

    image = {"image": {"format": "png", "source": {"bytes": TINY_PNG}}}
    cache = {"cachePoint": {"type": "default"}}
    text = {"text": "Look.", "cachePoint": {"type": "default"}}  # a text block: nothing else
    shapes: list[object] = [
        [{"role": "user", "content": [{"text": "a"}, {"text": "b"}]}],
        [{"role": "user", "content": "not blocks"}, {"role": "user"}],
        [{"role": "user", "content": [text]}],
        [{"role": "user", "content": [{"text": "a"}, image]}],
        [{"role": "user", "content": [cache]}],
        [UserDict({"role": "user", "content": [image]})],
        [{"role": "user", "content": ["a string block", image]}],
        "not a list",
    ]
    for messages in shapes:
        read = converse_request({"modelId": CLAUDE, "messages": messages}, False)
        extra, cache_writes = _bedrock_request._unseen(messages, CLAUDE)
        assert (read.extra_input_tokens, read.cache_writes) == (extra, cache_writes)
    assert _bedrock_request._unseen(shapes[3], CLAUDE)[0] == ANTHROPIC_IMAGE_TOKENS
    assert _bedrock_request._unseen(shapes[4], CLAUDE)[1]


def test_converse_plain_reader_counts_the_input_as_the_byte_walk_does() -> None:
    """read_plain's input bytes (a role and text blocks per message, messages only)
    are ``_utf8_bytes`` of the request's input; any other shape reads -1, and the
    request is read_converse's either way."""
    from veronica_otel.instrumentors import _bedrock_request
    from veronica_otel.instrumentors._admit import _utf8_bytes

    two = [
        {"role": "user", "content": [{"text": "héllo ✓"}, {"text": ""}]},
        {"content": [], "role": "assistant"},
    ]
    plain: list[dict[str, Any]] = [
        {"messages": two, "inferenceConfig": {"maxTokens": 5}},
        {"messages": [], "inferenceConfig": {"maxTokens": 5}},
        {"messages": [{"role": "ü", "content": [{"text": "a"}]}]},
    ]
    general: list[dict[str, Any]] = [
        {"messages": two, "system": [{"text": "s"}]},
        {"messages": [{"role": "user", "content": [{"text": "a", "cachePoint": {}}]}]},
        {"messages": [{"role": "user", "content": [{"text": 7}]}]},
        {"messages": [{"role": "user", "content": "text", "x": 1}]},
        {"messages": [{"role": "user", "content": [{"text": "a"}], "x": "y"}]},
        {"messages": [{"role": 1, "content": [{"text": "a"}]}]},
        {"messages": [{"role": "user"}]},
        {"messages": [{"role": "user", "content": [{"image": {}}]}]},
        {"messages": "not a list"},
        {},
    ]
    for given, expect_plain in [(p, True) for p in plain] + [(p, False) for p in general]:
        params = {"modelId": CLAUDE, **given}
        for method in ("Converse", "ConverseStream"):
            args = (method, params)
            request, size = _bedrock_request.read_plain(None, args, {}, None, method)
            assert request == _bedrock_request.read_converse(None, None, args, {}, method)
            assert request == converse_request(params, method == "ConverseStream")
            assert (size >= 0) is expect_plain, params
            if expect_plain:
                assert size == _utf8_bytes(request.input_parts)
