"""The fake server's runaway model, read by each real SDK: every reply is a tool call.

A framework's agent loop ends when the model stops calling tools; these check
that each wire format's runaway reply (streamed and not) parses in its own
SDK as a call of the declared tool with arguments valid for its schema, and
that the server setting, ``set_runaway`` and the per-request header switch it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import openai
import pytest

from veronica_otel.testing import FakeLLMServer

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 2}},
    "required": ["city", "days"],
}


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=3, runaway=True) as fake:
        yield fake


@pytest.fixture
def closing() -> Iterator[ExitStack]:
    """Closes each test's clients (an unclosed one leaves its socket to a later GC)."""
    with ExitStack() as stack:
        yield stack


def _check(name: str, arguments: Any) -> None:
    args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments)
    assert name == "weather"
    assert isinstance(args["city"], str) and args["days"] >= 2


@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat_calls_the_declared_tool(
    server: FakeLLMServer, closing: ExitStack, stream: bool
) -> None:
    client = closing.enter_context(
        openai.OpenAI(base_url=server.openai_base_url, api_key="t", max_retries=0)
    )
    tools: Any = [
        {"type": "function", "function": {"name": "final_result", "parameters": WEATHER}},
        {"type": "function", "function": {"name": "weather", "parameters": WEATHER}},
    ]
    messages: Any = [{"role": "user", "content": "hi"}]
    if stream:
        with client.chat.completions.stream(model="m", messages=messages, tools=tools) as events:
            message: Any = events.get_final_completion().choices[0]
    else:
        message = client.chat.completions.create(model="m", messages=messages, tools=tools).choices[
            0
        ]
    assert message.finish_reason == "tool_calls"
    [call] = message.message.tool_calls or []
    assert call.type == "function"
    _check(call.function.name, call.function.arguments)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_responses_calls_the_declared_tool(
    server: FakeLLMServer, closing: ExitStack, stream: bool
) -> None:
    client = closing.enter_context(
        openai.OpenAI(base_url=server.openai_base_url, api_key="t", max_retries=0)
    )
    tools: Any = [{"type": "function", "name": "weather", "parameters": WEATHER, "strict": True}]
    if stream:
        with client.responses.stream(model="m", input="hi", tools=tools) as events:
            response: Any = events.get_final_response()
    else:
        response = client.responses.create(model="m", input="hi", tools=tools)
    [item] = response.output
    assert item.type == "function_call"
    _check(item.name, item.arguments)
    assert response.output_text == ""


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_calls_the_declared_tool(
    server: FakeLLMServer, closing: ExitStack, stream: bool
) -> None:
    import anthropic

    client = closing.enter_context(
        anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="t", max_retries=0)
    )
    tools: Any = [{"name": "weather", "description": "w", "input_schema": WEATHER}]
    messages: Any = [{"role": "user", "content": "hi"}]
    if stream:
        with client.messages.stream(
            model="m", max_tokens=50, messages=messages, tools=tools
        ) as events:
            message: Any = events.get_final_message()
    else:
        message = client.messages.create(model="m", max_tokens=50, messages=messages, tools=tools)
    assert message.stop_reason == "tool_use"
    [block] = message.content
    assert block.type == "tool_use"
    _check(block.name, block.input)


@pytest.mark.parametrize("stream", [False, True])
def test_gemini_calls_the_declared_tool(
    server: FakeLLMServer, closing: ExitStack, stream: bool
) -> None:
    from google import genai
    from google.genai import types

    gemini = genai.Client(api_key="t", http_options=types.HttpOptions(base_url=server.base_url))
    closing.callback(gemini.close)
    declaration = types.FunctionDeclaration(name="weather", parameters_json_schema=WEATHER)
    config = types.GenerateContentConfig(tools=[types.Tool(function_declarations=[declaration])])
    if stream:
        chunks = list(
            gemini.models.generate_content_stream(model="gemini-x", contents="hi", config=config)
        )
        calls = [c for chunk in chunks for c in chunk.function_calls or []]
    else:
        response = gemini.models.generate_content(model="gemini-x", contents="hi", config=config)
        calls = response.function_calls or []
    [call] = calls
    _check(call.name or "", call.args)


def test_gemini_typed_schema_uppercase_types(server: FakeLLMServer, closing: ExitStack) -> None:
    from google import genai
    from google.genai import types

    gemini = genai.Client(api_key="t", http_options=types.HttpOptions(base_url=server.base_url))
    closing.callback(gemini.close)
    schema = types.Schema(
        type=types.Type.OBJECT,
        properties={"city": types.Schema(type=types.Type.STRING)},
        required=["city"],
    )
    declaration = types.FunctionDeclaration(name="weather", parameters=schema)
    config = types.GenerateContentConfig(tools=[types.Tool(function_declarations=[declaration])])
    response = gemini.models.generate_content(model="gemini-x", contents="hi", config=config)
    [call] = response.function_calls or []
    assert call.name == "weather" and isinstance((call.args or {})["city"], str)


@pytest.mark.parametrize("stream", [False, True])
def test_bedrock_converse_calls_the_declared_tool(
    server: FakeLLMServer, closing: ExitStack, stream: bool
) -> None:
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "bedrock-runtime",
        endpoint_url=server.base_url,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        config=Config(retries={"mode": "standard", "max_attempts": 1}),
    )
    closing.callback(client.close)
    request: Any = {
        "modelId": "anthropic.claude-x",
        "messages": [{"role": "user", "content": [{"text": "hi"}]}],
        "toolConfig": {
            "tools": [{"toolSpec": {"name": "weather", "inputSchema": {"json": WEATHER}}}]
        },
    }
    if not stream:
        reply = client.converse(**request)
        assert reply["stopReason"] == "tool_use"
        [block] = reply["output"]["message"]["content"]
        _check(block["toolUse"]["name"], block["toolUse"]["input"])
        return
    events = list(client.converse_stream(**request)["stream"])
    start = next(
        e["contentBlockStart"]["start"]["toolUse"] for e in events if "contentBlockStart" in e
    )
    raw = "".join(
        e["contentBlockDelta"]["delta"]["toolUse"]["input"]
        for e in events
        if "contentBlockDelta" in e
    )
    assert next(e["messageStop"]["stopReason"] for e in events if "messageStop" in e) == "tool_use"
    _check(start["name"], raw)


def test_header_and_setter_switch_it(server: FakeLLMServer, closing: ExitStack) -> None:
    client = closing.enter_context(
        openai.OpenAI(base_url=server.openai_base_url, api_key="t", max_retries=0)
    )
    tools: Any = [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}}]
    messages: Any = [{"role": "user", "content": "hi"}]

    def finish(**headers: str) -> str | None:
        reply = client.chat.completions.create(
            model="m", messages=messages, tools=tools, extra_headers=headers
        )
        return reply.choices[0].finish_reason

    assert finish() == "tool_calls"
    assert finish(**{"x-fake-runaway": "0"}) == "stop"
    server.set_runaway(False)
    assert finish() == "stop"
    assert finish(**{"x-fake-runaway": "1"}) == "tool_calls"
    # No tool declared: nothing to call, the ordinary reply.
    plain = client.chat.completions.create(
        model="m", messages=messages, extra_headers={"x-fake-runaway": "1"}
    )
    assert plain.choices[0].finish_reason == "stop"
    assert server.request_count == 5


def test_the_cli_flag_turns_it_on() -> None:
    from veronica_otel.testing.__main__ import _parser

    assert _parser().parse_args(["--runaway"]).runaway is True
    assert _parser().parse_args([]).runaway is False
    with pytest.raises(ValueError, match="runaway"):
        FakeLLMServer(runaway="yes")  # type: ignore[arg-type]
