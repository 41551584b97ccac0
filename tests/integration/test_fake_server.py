"""The embedded fake LLM server, exercised through the real openai and anthropic SDKs."""

from __future__ import annotations

import enum
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal
from uuid import UUID

import openai
import pydantic
import pytest
from openai.types.chat import ChatCompletionMessageParam

import veronica_otel.testing
from veronica_otel.testing import FakeLLMServer, RecordedRequest, ScriptedReply, ScriptedToolCall

if TYPE_CHECKING:
    import anthropic
    from anthropic.types import MessageParam

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]
CLAUDE_MESSAGES: list[MessageParam] = [{"role": "user", "content": "Say hello."}]
CHAT = "/v1/chat/completions"


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=6) as fake:
        yield fake


@pytest.fixture
def oai(server: FakeLLMServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.openai_base_url, api_key="test", max_retries=0) as client:
        yield client


@pytest.fixture
def claude(server: FakeLLMServer) -> Iterator[anthropic.Anthropic]:
    import anthropic

    with anthropic.Anthropic(
        base_url=server.anthropic_base_url, api_key="test", max_retries=0
    ) as client:
        yield client


def _body_tokens(server: FakeLLMServer) -> int:
    """Input tokens the server derives from the last request's body size."""
    return math.ceil(int(server.requests[-1].headers["content-length"]) / 4)


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Step(pydantic.BaseModel):
    explanation: str
    count: int


class Plan(pydantic.BaseModel):
    steps: list[Step]
    title: str
    color: Color
    mode: Literal["fast", "slow"]
    due: datetime
    note: str | None
    score: float


class Node(pydantic.BaseModel):
    name: str
    children: list[Node]
    parent: Node | None


class Constrained(pydantic.BaseModel):
    tags: dict[str, int]
    uid: UUID
    level: Annotated[int, pydantic.Field(ge=5, le=9)]
    code: Annotated[str, pydantic.Field(min_length=10)]
    pair: tuple[int, str]


SCHEMA_MODELS = [Plan, Node, Constrained]


# -- public surface ---------------------------------------------------------


def test_exported_names() -> None:
    assert veronica_otel.testing.__all__ == [
        "BilledUsage",
        "FakeLLMServer",
        "RecordedRequest",
        "RedisClusterProcess",
        "RedisServerProcess",
        "ScriptedReply",
        "ScriptedToolCall",
        "find_redis_server",
    ]


def test_urls_and_lifecycle() -> None:
    fake = FakeLLMServer()
    with pytest.raises(RuntimeError):
        _ = fake.base_url
    fake.start()
    try:
        assert fake.base_url == f"http://127.0.0.1:{fake.port}"
        assert fake.openai_base_url == fake.base_url + "/v1"
        assert fake.anthropic_base_url == fake.base_url
        with pytest.raises(RuntimeError):
            fake.start()
    finally:
        fake.stop()
    fake.stop()  # idempotent


@pytest.mark.parametrize(
    "kwargs",
    [
        {"output_tokens": -1},
        {"output_tokens": True},
        {"input_tokens": 1.5},
        {"latency_s": float("nan")},
        {"chunk_delay_s": -0.1},
        {"port": -1},
    ],
)
def test_bad_arguments_raise(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        FakeLLMServer(**kwargs)  # type: ignore[arg-type]


def test_bad_failure_arguments_raise(server: FakeLLMServer) -> None:
    with pytest.raises(ValueError):
        server.fail_next(1, status=200)
    with pytest.raises(ValueError):
        server.fail_next(-1)
    with pytest.raises(ValueError):
        server.set_latency(-1)


# -- OpenAI -----------------------------------------------------------------


def test_chat_create(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    completion = oai.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    choice = completion.choices[0]
    assert choice.message.content == "tok0 tok1 tok2 tok3 tok4 tok5"
    assert choice.finish_reason == "stop"
    assert completion.model == "gpt-4o-mini"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 6
    assert completion.usage.prompt_tokens == _body_tokens(server)
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 6
    recorded = server.requests[-1]
    assert (recorded.method, recorded.path) == ("POST", CHAT)
    assert recorded.body["messages"] == MESSAGES
    assert server.count(CHAT) == 1


def test_chat_stream_usage_in_final_chunk(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(
        model="gpt-4o-mini",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
    )
    with stream:
        chunks = list(stream)
    *body, last = chunks
    assert all(chunk.usage is None for chunk in body)
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens == 6
    assert last.usage.prompt_tokens == _body_tokens(server)
    text = "".join(c.choices[0].delta.content or "" for c in body if c.choices)
    assert text == "tok0 tok1 tok2 tok3 tok4 tok5"
    content_chunks = [c for c in body if c.choices and c.choices[0].delta.content]
    assert len(content_chunks) == 6
    assert body[-1].choices[0].finish_reason == "stop"


def test_chat_stream_without_include_usage(oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    with stream:
        chunks = list(stream)
    assert all(chunk.usage is None and chunk.choices for chunk in chunks)


def test_chat_parse_with_pydantic_model(oai: openai.OpenAI) -> None:
    completion = oai.chat.completions.parse(
        model="gpt-4o-mini",
        messages=MESSAGES,
        response_format=Plan,
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Plan)
    assert parsed.color is Color.RED
    assert parsed.mode == "fast"
    assert len(parsed.steps) == 1


def test_chat_stream_helper_with_pydantic_model(oai: openai.OpenAI) -> None:
    with oai.chat.completions.stream(
        model="gpt-4o-mini",
        messages=MESSAGES,
        response_format=Step,
        stream_options={"include_usage": True},
    ) as stream:
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Step)
    assert final.usage is not None
    assert final.usage.completion_tokens == 6


def test_responses_create(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    response = oai.responses.create(model="gpt-4.1", input="Say hello.")
    assert response.status == "completed"
    assert response.output_text == "tok0 tok1 tok2 tok3 tok4 tok5"
    assert response.usage is not None
    assert response.usage.output_tokens == 6
    assert response.usage.input_tokens == _body_tokens(server)


def test_responses_stream(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    with oai.responses.stream(model="gpt-4.1", input="Say hello.") as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.output_text == "tok0 tok1 tok2 tok3 tok4 tok5"
    assert final.usage is not None
    assert final.usage.output_tokens == 6
    assert final.usage.input_tokens == _body_tokens(server)
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert sum(e.type == "response.output_text.delta" for e in events) == 6


@pytest.mark.parametrize("model", SCHEMA_MODELS)
def test_responses_parse(oai: openai.OpenAI, model: type[pydantic.BaseModel]) -> None:
    response = oai.responses.parse(model="gpt-4.1", input="Plan.", text_format=model)
    assert isinstance(response.output_parsed, model)


@pytest.mark.parametrize("model", SCHEMA_MODELS)
def test_chat_parse_schema_shapes(oai: openai.OpenAI, model: type[pydantic.BaseModel]) -> None:
    completion = oai.chat.completions.parse(
        model="gpt-4o-mini", messages=MESSAGES, response_format=model
    )
    assert isinstance(completion.choices[0].message.parsed, model)


def test_embeddings(oai: openai.OpenAI, server: FakeLLMServer) -> None:
    # Default: the SDK asks for base64 and decodes it.
    result = oai.embeddings.create(model="text-embedding-3-small", input=["a", "b"])
    assert [d.index for d in result.data] == [0, 1]
    assert all(len(d.embedding) == 8 for d in result.data)
    assert result.usage.prompt_tokens == _body_tokens(server)
    floats = oai.embeddings.create(
        model="text-embedding-3-small", input="a", encoding_format="float", dimensions=4
    )
    assert len(floats.data[0].embedding) == 4
    assert floats.data[0].embedding == pytest.approx(result.data[0].embedding[:4])


def test_legacy_completions(oai: openai.OpenAI) -> None:
    completion = oai.completions.create(model="gpt-3.5-turbo-instruct", prompt="Say hello.")
    assert completion.choices[0].text == "tok0 tok1 tok2 tok3 tok4 tok5"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 6
    stream = oai.completions.create(
        model="gpt-3.5-turbo-instruct",
        prompt="Say hello.",
        stream=True,
        stream_options={"include_usage": True},
    )
    with stream:
        chunks = list(stream)
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6


def test_max_tokens_caps_output(oai: openai.OpenAI, claude: anthropic.Anthropic) -> None:
    chat = oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)
    assert chat.usage is not None
    assert chat.usage.completion_tokens == 2
    assert chat.choices[0].message.content == "tok0 tok1"
    assert chat.choices[0].finish_reason == "length"
    chat = oai.chat.completions.create(model="m", messages=MESSAGES, max_completion_tokens=6)
    assert chat.choices[0].finish_reason == "stop"
    response = oai.responses.create(model="m", input="x", max_output_tokens=3)
    assert response.usage is not None
    assert response.usage.output_tokens == 3
    assert response.status == "incomplete"
    message = claude.messages.create(model="claude-x", max_tokens=1, messages=CLAUDE_MESSAGES)
    assert message.usage.output_tokens == 1
    assert message.stop_reason == "max_tokens"


def test_reasoning_and_cached_tokens() -> None:
    import anthropic

    with (
        FakeLLMServer(
            input_tokens=100, output_tokens=10, reasoning_tokens=4, cached_tokens=30
        ) as fake,
        openai.OpenAI(base_url=fake.openai_base_url, api_key="t", max_retries=0) as client,
        anthropic.Anthropic(base_url=fake.anthropic_base_url, api_key="t", max_retries=0) as ac,
    ):
        usage = client.chat.completions.create(model="m", messages=MESSAGES).usage
        assert usage is not None
        assert (usage.prompt_tokens, usage.completion_tokens) == (100, 10)
        assert usage.prompt_tokens_details is not None
        assert usage.prompt_tokens_details.cached_tokens == 30
        assert usage.completion_tokens_details is not None
        assert usage.completion_tokens_details.reasoning_tokens == 4
        response_usage = client.responses.create(model="m", input="x").usage
        assert response_usage is not None
        assert response_usage.input_tokens_details.cached_tokens == 30
        assert response_usage.output_tokens_details.reasoning_tokens == 4
        message = ac.messages.create(model="c", max_tokens=50, messages=CLAUDE_MESSAGES)
        # Anthropic's input_tokens excludes cache reads.
        assert (message.usage.input_tokens, message.usage.cache_read_input_tokens) == (70, 30)
        assert message.usage.output_tokens == 10
        assert message.content[0].type == "text"
        assert message.content[0].text.split() == [f"tok{i}" for i in range(6)]


# -- Anthropic --------------------------------------------------------------


def test_anthropic_create(server: FakeLLMServer, claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(model="claude-x", max_tokens=100, messages=CLAUDE_MESSAGES)
    assert message.content[0].type == "text"
    assert message.content[0].text == "tok0 tok1 tok2 tok3 tok4 tok5"
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens == 6
    assert message.usage.input_tokens == _body_tokens(server)
    assert server.count("/v1/messages") == 1


def test_anthropic_stream_helper_usage_is_cumulative(
    server: FakeLLMServer, claude: anthropic.Anthropic
) -> None:
    with claude.messages.stream(
        model="claude-x", max_tokens=100, messages=CLAUDE_MESSAGES
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "tok0 tok1 tok2 tok3 tok4 tok5"
    assert final.usage.output_tokens == 6  # not 1 + 6
    assert final.usage.input_tokens == _body_tokens(server)
    assert final.stop_reason == "end_turn"


def test_anthropic_raw_stream_events(claude: anthropic.Anthropic) -> None:
    from anthropic.types import RawMessageDeltaEvent, RawMessageStartEvent

    stream = claude.messages.create(
        model="claude-x",
        max_tokens=100,
        messages=CLAUDE_MESSAGES,
        stream=True,
    )
    with stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start"
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_delta") == 6
    start, delta = events[0], events[-2]
    assert isinstance(start, RawMessageStartEvent)
    assert isinstance(delta, RawMessageDeltaEvent)
    assert start.message.usage.output_tokens == 1
    assert delta.usage.output_tokens == 6


def test_anthropic_count_tokens(server: FakeLLMServer, claude: anthropic.Anthropic) -> None:
    counted = claude.messages.count_tokens(model="claude-x", messages=CLAUDE_MESSAGES)
    assert counted.input_tokens == _body_tokens(server)
    assert server.count("/v1/messages/count_tokens") == 1


@pytest.mark.parametrize("model", SCHEMA_MODELS)
def test_anthropic_parse(claude: anthropic.Anthropic, model: type[pydantic.BaseModel]) -> None:
    message = claude.messages.parse(
        model="claude-x",
        max_tokens=100,
        messages=CLAUDE_MESSAGES,
        output_format=model,
    )
    assert isinstance(message.parsed_output, model)


# -- async ------------------------------------------------------------------


@pytest.mark.asyncio
async def test_async_openai_chat_stream(server: FakeLLMServer) -> None:
    async with openai.AsyncOpenAI(
        base_url=server.openai_base_url, api_key="test", max_retries=0
    ) as client:
        stream = await client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6


@pytest.mark.asyncio
async def test_async_anthropic_stream_helper(server: FakeLLMServer) -> None:
    import anthropic

    async with anthropic.AsyncAnthropic(
        base_url=server.anthropic_base_url, api_key="test", max_retries=0
    ) as client:
        async with client.messages.stream(
            model="claude-x",
            max_tokens=100,
            messages=CLAUDE_MESSAGES,
        ) as stream:
            final = await stream.get_final_message()
        created = await client.messages.create(model="c", max_tokens=3, messages=CLAUDE_MESSAGES)
    assert final.usage.output_tokens == 6
    assert created.usage.output_tokens == 3
    assert server.count("/v1/messages") == 2


# -- counting ---------------------------------------------------------------


def test_counting_is_exact_under_concurrency(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    threads_n, per_thread = 8, 25
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads_n)

    def worker(worker_id: int) -> None:
        try:
            barrier.wait()
            for i in range(per_thread):
                oai.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": f"{worker_id}-{i}"}],
                )
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    total = threads_n * per_thread
    assert server.request_count == total
    assert server.count(CHAT) == total
    contents = {r.body["messages"][0]["content"] for r in server.requests}
    assert len(contents) == total
    server.reset()
    assert (server.request_count, server.count(CHAT), server.requests) == (0, 0, [])


def test_max_recorded_bounds_the_log_not_the_counts() -> None:
    with (
        FakeLLMServer(max_recorded=3) as fake,
        openai.OpenAI(base_url=fake.openai_base_url, api_key="t", max_retries=0) as client,
    ):
        for _ in range(5):
            client.models.list()
        assert fake.request_count == 5
        assert fake.count("/v1/models") == 5
        assert len(fake.requests) == 3


# -- failures and latency ---------------------------------------------------


def test_fail_next_then_sdk_retries_succeed(server: FakeLLMServer) -> None:
    server.fail_next(2, status=500, retry_after_ms=1)
    with openai.OpenAI(base_url=server.openai_base_url, api_key="t", max_retries=2) as client:
        started = time.monotonic()
        completion = client.chat.completions.create(model="m", messages=MESSAGES)
        elapsed = time.monotonic() - started
    assert completion.choices[0].message.content
    assert server.request_count == 3
    assert [r.headers["x-stainless-retry-count"] for r in server.requests] == ["0", "1", "2"]
    assert elapsed < 0.5  # retry-after-ms=1 replaced the 0.5 s + 1 s backoff


def test_fail_next_anthropic_retries(server: FakeLLMServer) -> None:
    import anthropic

    server.fail_next(2, status=529, retry_after_ms=1)
    with anthropic.Anthropic(
        base_url=server.anthropic_base_url, api_key="t", max_retries=2
    ) as client:
        message = client.messages.create(model="c", max_tokens=10, messages=CLAUDE_MESSAGES)
    assert message.usage.output_tokens == 6
    assert server.count("/v1/messages") == 3


def test_failures_use_each_api_error_shape(
    server: FakeLLMServer, oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    import anthropic

    server.fail_next(1, status=429)
    with pytest.raises(openai.RateLimitError) as oai_error:
        oai.chat.completions.create(model="m", messages=MESSAGES)
    assert oai_error.value.code == "rate_limit_exceeded"
    assert oai_error.value.request_id == "req_fake1"
    server.fail_next(1, status=529)
    with pytest.raises(anthropic.OverloadedError) as claude_error:
        claude.messages.create(model="c", max_tokens=10, messages=CLAUDE_MESSAGES)
    assert claude_error.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Injected failure"},
        "request_id": "req_fake2",
    }


def test_custom_failure_body_and_should_retry_header(server: FakeLLMServer) -> None:
    server.fail_next(
        3, status=503, body={"error": {"message": "custom"}}, headers={"x-should-retry": "false"}
    )
    with (
        openai.OpenAI(base_url=server.openai_base_url, api_key="t", max_retries=2) as client,
        pytest.raises(openai.InternalServerError, match="custom"),
    ):
        client.chat.completions.create(model="m", messages=MESSAGES)
    assert server.request_count == 1  # the SDK obeyed x-should-retry: false


def test_fail_always_until_cleared(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    server.fail_always(status=500)
    for _ in range(3):
        with pytest.raises(openai.InternalServerError):
            oai.chat.completions.create(model="m", messages=MESSAGES)
    server.clear_failures()
    assert oai.chat.completions.create(model="m", messages=MESSAGES).choices
    assert server.request_count == 4


def test_bad_requests_get_api_errors(oai: openai.OpenAI, claude: anthropic.Anthropic) -> None:
    import anthropic

    with pytest.raises(anthropic.BadRequestError):
        claude.post("/v1/messages", body={"model": "c", "messages": []}, cast_to=object)
    with pytest.raises(openai.NotFoundError):
        oai.post("/nowhere", body={}, cast_to=object)


def test_latency_and_chunk_delay(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    server.set_latency(0.1)
    started = time.monotonic()
    oai.chat.completions.create(model="m", messages=MESSAGES)
    assert time.monotonic() - started >= 0.1
    server.set_latency(0)
    server.set_chunk_delay(0.03)
    started = time.monotonic()
    stream = oai.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    with stream:
        list(stream)
    # 6 words plus the role, finish and [DONE] chunks: 8 gaps of 30 ms.
    assert time.monotonic() - started >= 0.2


def test_client_abandoning_a_slow_stream_leaves_server_healthy(
    server: FakeLLMServer, oai: openai.OpenAI
) -> None:
    server.set_chunk_delay(0.05)
    stream = oai.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    with stream:
        first = next(iter(stream))
    assert first.choices[0].delta.role == "assistant"
    server.set_chunk_delay(0)
    assert oai.chat.completions.create(model="m", messages=MESSAGES).choices
    assert server.request_count == 2


def test_stop_interrupts_latency() -> None:
    fake = FakeLLMServer(latency_s=30.0).start()
    with openai.OpenAI(base_url=fake.openai_base_url, api_key="t", max_retries=0) as client:
        outcome: list[object] = []

        def call() -> None:
            try:
                outcome.append(client.chat.completions.create(model="m", messages=MESSAGES))
            except openai.APIError as exc:  # the connection may close before the reply
                outcome.append(exc)

        caller = threading.Thread(target=call)
        caller.start()
        while fake.request_count == 0:
            time.sleep(0.01)
        started = time.monotonic()
        fake.stop()
        caller.join(5)
        assert time.monotonic() - started < 2.0
        assert len(outcome) == 1


def test_stop_interrupts_slow_stream() -> None:
    fake = FakeLLMServer(chunk_delay_s=30.0).start()
    with openai.OpenAI(base_url=fake.openai_base_url, api_key="t", max_retries=0) as client:
        stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        with stream:
            chunks = iter(stream)
            next(chunks)
            started = time.monotonic()
            fake.stop()
            with pytest.raises(openai.APIConnectionError):
                list(chunks)
        assert time.monotonic() - started < 2.0


def test_stop_closes_keep_alive_connections() -> None:
    fake = FakeLLMServer().start()
    with openai.OpenAI(base_url=fake.openai_base_url, api_key="t", max_retries=0) as client:
        client.models.list()  # leaves a pooled keep-alive connection open
        started = time.monotonic()
        fake.stop()
        assert time.monotonic() - started < 2.0
        with pytest.raises(openai.APIConnectionError):
            client.models.list()


# -- CLI --------------------------------------------------------------------


def test_cli_serves_until_terminated() -> None:
    src = str(Path(veronica_otel.testing.__file__).resolve().parents[2])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
    }
    with subprocess.Popen(
        [sys.executable, "-m", "veronica_otel.testing", "--port", "0", "--output-tokens", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as process:
        try:
            assert process.stdout is not None
            first = process.stdout.readline()
            assert first.startswith("Fake LLM server listening on http://127.0.0.1:"), first
            base_url = first.rsplit(" ", 1)[1].strip()
            with openai.OpenAI(base_url=base_url + "/v1", api_key="t", max_retries=0) as client:
                completion = client.chat.completions.create(model="m", messages=MESSAGES)
            assert completion.usage is not None
            assert completion.usage.completion_tokens == 3
        finally:
            process.terminate()
            _, stderr = process.communicate(timeout=10)
    assert process.returncode == 0, stderr


def test_billed_usage_matches_what_the_replies_reported(
    server: FakeLLMServer, oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    claude.messages.count_tokens(
        model="claude-3-5-haiku-latest", messages=[{"role": "user", "content": "hi"}]
    )
    assert server.billed == []  # counting tokens is free
    reply = oai.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert reply.usage is not None
    (billed,) = server.billed
    assert billed.model == "gpt-4o-mini"
    assert (billed.input_tokens, billed.output_tokens) == (
        reply.usage.prompt_tokens,
        reply.usage.completion_tokens,
    )
    server.reset()
    assert server.billed == []


# -- scripted replies ---------------------------------------------------------


def test_scripted_replies_call_tools_then_answer(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    server.script(ScriptedReply.tool_call("add", {"a": 1, "b": 2}, id="call_1"), "It is 3.")
    first = oai.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (tool_call,) = choice.message.tool_calls or []
    assert tool_call.type == "function"
    assert (tool_call.id, tool_call.function.name) == ("call_1", "add")
    assert json.loads(tool_call.function.arguments) == {"a": 1, "b": 2}
    second = oai.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    assert second.choices[0].message.content == "It is 3."
    assert second.choices[0].finish_reason == "stop"
    assert second.usage is not None and second.usage.completion_tokens == 6  # as any reply
    third = oai.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    assert third.choices[0].message.content == "tok0 tok1 tok2 tok3 tok4 tok5"  # script used up


def test_scripted_tool_calls_stream(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    calls = (ScriptedToolCall("look", {"q": "x"}), ScriptedToolCall("note"))
    server.script(ScriptedReply(text="Checking two things.", tool_calls=calls))
    with oai.chat.completions.stream(model="gpt-4o-mini", messages=MESSAGES) as stream:
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls"
    assert message.content == "Checking two things."
    tools = message.tool_calls or []
    assert [(t.id, t.function.name, t.function.arguments) for t in tools] == [
        (f"call_fake{server.request_count}_0", "look", '{"q":"x"}'),
        (f"call_fake{server.request_count}_1", "note", "{}"),
    ]


def test_responder_picks_replies_from_requests(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    seen: list[RecordedRequest] = []

    def responder(request: RecordedRequest) -> ScriptedReply | str | None:
        seen.append(request)
        turns = len(request.body["messages"])
        return ScriptedReply.tool_call("again", {"turn": turns}) if turns < 2 else None

    server.script("queued first")
    server.set_responder(responder)
    assert oai.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content == (
        "queued first"
    )
    assert seen == []  # the queue comes before the responder
    reply = oai.chat.completions.create(model="m", messages=MESSAGES)
    assert [t.function.arguments for t in reply.choices[0].message.tool_calls or []] == [
        '{"turn":1}'
    ]
    assert seen[-1].path == CHAT
    two_turns: list[ChatCompletionMessageParam] = [*MESSAGES, {"role": "user", "content": "go"}]
    generated = oai.chat.completions.create(model="m", messages=two_turns)
    assert generated.choices[0].message.content == "tok0 tok1 tok2 tok3 tok4 tok5"
    oai.embeddings.create(model="text-embedding-3-small", input="x")
    assert len(seen) == 2  # only chat completions are scripted
    server.set_responder(None)
    server.script("left over")
    server.reset()
    assert oai.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content == (
        "tok0 tok1 tok2 tok3 tok4 tok5"
    )


def test_injected_failure_does_not_use_up_a_scripted_reply(server: FakeLLMServer) -> None:
    server.script("after the retry")
    server.fail_next(1, status=500, retry_after_ms=1)
    with openai.OpenAI(base_url=server.openai_base_url, api_key="t", max_retries=1) as client:
        reply = client.chat.completions.create(model="m", messages=MESSAGES)
    assert reply.choices[0].message.content == "after the retry"
    assert server.count(CHAT) == 2


def test_a_failing_responder_is_a_server_error(server: FakeLLMServer, oai: openai.OpenAI) -> None:
    def responder(request: RecordedRequest) -> None:
        raise RuntimeError("boom")

    server.set_responder(responder)
    with pytest.raises(openai.InternalServerError):
        oai.chat.completions.create(model="m", messages=MESSAGES)


@pytest.mark.parametrize(
    "make",
    [
        lambda: ScriptedToolCall(""),
        lambda: ScriptedToolCall("t", ["not", "a", "mapping"]),  # type: ignore[arg-type]
        lambda: ScriptedToolCall("t", {"x": object()}),
        lambda: ScriptedReply(text=3),  # type: ignore[arg-type]
        lambda: ScriptedReply(tool_calls=["t"]),  # type: ignore[list-item]
    ],
)
def test_bad_scripts_are_rejected(make: object) -> None:
    with pytest.raises(ValueError):
        make()  # type: ignore[operator]


def test_bad_script_arguments_are_rejected(server: FakeLLMServer) -> None:
    with pytest.raises(ValueError):
        server.script(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        server.set_responder("not callable")  # type: ignore[arg-type]


def test_stats_counts_requests_per_route_and_not_itself() -> None:
    import httpx2

    with FakeLLMServer() as fake:
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(2):
            httpx2.post(fake.openai_base_url + "/chat/completions", json=body)
        httpx2.post(fake.base_url + "/api/chat", json={"model": "llama3.2", "messages": []})
        first = httpx2.get(fake.base_url + "/stats").json()
        second = httpx2.get(fake.base_url + "/stats").json()
    assert first == {"total": 3, "routes": {"/api/chat": 1, "/v1/chat/completions": 2}}
    assert second == first  # asking is not a request to the API
    assert fake.request_count == 3


def test_delete_stats_resets_the_counts_of_a_stand_alone_server() -> None:
    import httpx2

    with FakeLLMServer() as fake:
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
        httpx2.post(fake.openai_base_url + "/chat/completions", json=body)
        assert httpx2.delete(fake.base_url + "/stats").json() == {"total": 0, "routes": {}}
        httpx2.post(fake.openai_base_url + "/chat/completions", json=body)
        after = httpx2.get(fake.base_url + "/stats").json()
    assert after == {"total": 1, "routes": {"/v1/chat/completions": 1}}
