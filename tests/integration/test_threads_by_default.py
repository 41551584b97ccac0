"""Enabling an LLM instrumentor carries the chain into threads, with no ThreadingInstrumentor.

The issue's repro: ``OpenAIInstrumentor().instrument()`` alone and a
``ThreadPoolExecutor`` sent 12 of 12 calls under ``max_steps=4``. The fake
server's request count is the truth.
"""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import openai
import pytest
from packaging.requirements import Requirement
from wrapt import FunctionWrapper

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext, current_context
from veronica_otel.instrumentors._hooks import GuardedInstrumentor, InstrumentationError
from veronica_otel.instrumentors.anthropic import AnthropicInstrumentor
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.instrumentors.threading import ThreadingInstrumentor
from veronica_otel.testing import FakeLLMServer

if TYPE_CHECKING:
    import anthropic

CALLS = 12
LIMIT = 4


def _patched() -> bool:
    """Whether Thread.start and ThreadPoolExecutor.submit carry the context now."""
    start = inspect.getattr_static(threading.Thread, "start")
    submit = inspect.getattr_static(ThreadPoolExecutor, "submit")
    return isinstance(start, FunctionWrapper) and isinstance(submit, FunctionWrapper)


@pytest.fixture(autouse=True)
def _nothing_left_on() -> Iterator[None]:
    yield
    for instrumentor in (OpenAIInstrumentor(), AnthropicInstrumentor(), ThreadingInstrumentor()):
        instrumentor.uninstrument()
    assert not _patched()  # the last holder out removed the patches


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=5) as fake:
        yield fake


@pytest.fixture
def client(server: FakeLLMServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.openai_base_url, api_key="t", max_retries=0) as oai:
        yield oai


def _call(client: openai.OpenAI) -> str:
    try:
        client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=8
        )
    except BudgetExceededError as exc:
        return exc.reason
    return "sent"


def _in_pool(client: openai.OpenAI) -> list[str]:
    # One worker per call, each call submitted after the one before it finished:
    # the outcome depends only on the context, not on how the threads interleave.
    outcomes = []
    with ThreadPoolExecutor(max_workers=4) as pool:
        for _ in range(CALLS):
            outcomes.append(pool.submit(_call, client).result())
    return outcomes


def _in_threads(client: openai.OpenAI) -> list[str]:
    outcomes: list[str] = []
    for _ in range(CALLS):
        thread = threading.Thread(target=lambda: outcomes.append(_call(client)))
        thread.start()
        thread.join()
    return outcomes


def _concurrent_pool(client: openai.OpenAI) -> list[str]:
    with ThreadPoolExecutor(max_workers=CALLS) as pool:
        return list(pool.map(lambda _: _call(client), range(CALLS)))


FAN_OUTS = pytest.mark.parametrize("fan_out", [_in_pool, _in_threads, _concurrent_pool])


@FAN_OUTS
def test_openai_instrumentor_alone_keeps_threads_in_the_chain(
    server: FakeLLMServer, client: openai.OpenAI, fan_out: Callable[[openai.OpenAI], list[str]]
) -> None:
    OpenAIInstrumentor().instrument()
    with ExecutionContext(ExecutionConfig(max_steps=LIMIT)) as ctx:
        outcomes = fan_out(client)
        steps = ctx.snapshot().steps
    assert server.request_count == LIMIT
    assert outcomes.count("sent") == LIMIT
    assert outcomes.count("steps") == CALLS - LIMIT
    assert steps == LIMIT


@FAN_OUTS
def test_opt_out_by_environment_lets_threads_escape(
    server: FakeLLMServer,
    client: openai.OpenAI,
    fan_out: Callable[[openai.OpenAI], list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VERONICA_THREADS", "false")
    OpenAIInstrumentor().instrument()
    assert not _patched()
    with ExecutionContext(ExecutionConfig(max_steps=LIMIT)) as ctx:
        outcomes = fan_out(client)
        steps = ctx.snapshot().steps
    # What the opt-out means: work in threads starts outside the chain.
    assert outcomes == ["sent"] * CALLS
    assert server.request_count == CALLS
    assert steps == 0


def test_opt_out_by_keyword(server: FakeLLMServer, client: openai.OpenAI) -> None:
    OpenAIInstrumentor().instrument(propagate_threads=False)
    with ExecutionContext(ExecutionConfig(max_steps=LIMIT)):
        outcomes = _in_pool(client)
    assert outcomes == ["sent"] * CALLS
    assert server.request_count == CALLS


def test_keyword_wins_over_the_environment(
    server: FakeLLMServer, client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VERONICA_THREADS", "false")
    OpenAIInstrumentor().instrument(propagate_threads=True)
    with ExecutionContext(ExecutionConfig(max_steps=LIMIT)):
        outcomes = _in_threads(client)
    assert outcomes.count("sent") == LIMIT == server.request_count


def test_a_malformed_setting_names_the_variable_and_fails_closed(
    server: FakeLLMServer, client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VERONICA_THREADS", "sometimes")
    with pytest.raises(InstrumentationError, match="VERONICA_THREADS='sometimes'"):
        OpenAIInstrumentor().instrument()
    with (
        ExecutionContext(ExecutionConfig(max_steps=LIMIT)),
        pytest.raises(InstrumentationError, match="VERONICA_THREADS"),
    ):
        _call(client)
    assert server.request_count == 0  # refused before anything was sent
    monkeypatch.delenv("VERONICA_THREADS")
    OpenAIInstrumentor().uninstrument()  # the refusal goes with it
    assert _call(client) == "sent"  # no chain: passes, uncontained


def test_a_wrong_keyword_type_is_refused_before_anything_is_patched() -> None:
    with pytest.raises(TypeError, match="propagate_threads='no'"):
        OpenAIInstrumentor().instrument(propagate_threads="no")
    assert not _patched()
    assert not OpenAIInstrumentor().is_instrumented_by_opentelemetry


def _chain_follows() -> bool:
    with ExecutionContext(ExecutionConfig(max_steps=LIMIT)) as ctx:
        thread_seen: list[object] = []
        thread = threading.Thread(target=lambda: thread_seen.append(current_context()))
        thread.start()
        thread.join()
        with ThreadPoolExecutor(max_workers=1) as pool:
            pooled = pool.submit(current_context).result()
        return thread_seen == [ctx] and pooled is ctx


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("openai", "OpenAIInstrumentor"),
        ("anthropic", "AnthropicInstrumentor"),
        ("mcp", "MCPInstrumentor"),
        ("langchain", "LangChainInstrumentor"),  # its module imports langchain-core
        ("ag2", "AG2Instrumentor"),
    ],
)
def test_every_llm_and_tool_instrumentor_carries_the_chain(module: str, name: str) -> None:
    kind: type[GuardedInstrumentor] = getattr(
        importlib.import_module(f"veronica_otel.instrumentors.{module}"), name
    )
    assert not _chain_follows()
    kind().instrument()
    try:
        assert _chain_follows()
    finally:
        kind().uninstrument()
    assert not _chain_follows()


def test_uninstrumenting_one_instrumentor_leaves_threads_to_another() -> None:
    OpenAIInstrumentor().instrument()
    AnthropicInstrumentor().instrument()
    OpenAIInstrumentor().instrument()  # idempotent: still one hold, one wrapper
    assert inspect.isfunction(inspect.getattr_static(threading.Thread, "start").__wrapped__)
    OpenAIInstrumentor().uninstrument()
    assert _chain_follows()  # anthropic still holds the threads
    AnthropicInstrumentor().uninstrument()
    assert not _chain_follows()


def test_a_direct_threading_instrumentor_outlives_the_llm_instrumentors() -> None:
    ThreadingInstrumentor().instrument()
    OpenAIInstrumentor().instrument()
    OpenAIInstrumentor().uninstrument()
    assert _chain_follows()
    ThreadingInstrumentor().uninstrument()
    assert not _chain_follows()


def test_anthropic_instrumentor_alone_keeps_pool_work_in_the_chain(server: FakeLLMServer) -> None:
    import anthropic

    AnthropicInstrumentor().instrument()

    def call(client: anthropic.Anthropic) -> str:
        try:
            client.messages.create(
                model="claude-3-5-haiku-latest",
                max_tokens=8,
                messages=[{"role": "user", "content": "hi"}],
            )
        except BudgetExceededError as exc:
            return exc.reason
        return "sent"

    with (
        anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="t") as client,
        ExecutionContext(ExecutionConfig(max_steps=LIMIT)),
        ThreadPoolExecutor(max_workers=4) as pool,
    ):
        outcomes = [pool.submit(call, client).result() for _ in range(CALLS)]
    assert outcomes.count("sent") == LIMIT == server.count("/v1/messages")
    assert outcomes.count("steps") == CALLS - LIMIT


def test_a_refused_sdk_still_carries_the_chain_until_uninstrumented(
    server: FakeLLMServer, client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The installed openai outside the tested range: nothing wrapped, calls in a
    # chain refused -- in threads too, which needs the chain there.
    monkeypatch.setattr(OpenAIInstrumentor._hooks, "requirement", Requirement("openai < 1"))
    with pytest.raises(InstrumentationError, match="outside the tested range"):
        OpenAIInstrumentor().instrument()
    with (
        ExecutionContext(ExecutionConfig(max_steps=LIMIT)),
        ThreadPoolExecutor(1) as pool,
        pytest.raises(InstrumentationError),
    ):
        pool.submit(client.models.list).result()
    assert server.request_count == 0
    OpenAIInstrumentor().uninstrument()
    assert not _chain_follows()
