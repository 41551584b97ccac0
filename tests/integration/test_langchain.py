"""LangChain containment with the real libraries: a ``create_agent`` agent on LangGraph,
``ChatOpenAI`` against FakeLLMServer, tools that count their runs.

The model is scripted to keep calling a tool, so only containment ends the
run: every model call (OpenAIInstrumentor) and tool call (LangChainInstrumentor)
is a step of the chain, and a denial is raised out of ``agent.invoke`` with
nothing sent or run after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any

import pytest
import wrapt
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer, RecordedRequest, ScriptedReply

if TYPE_CHECKING:  # imported for the tests by _langchain, below
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.runnables import Runnable, RunnableLambda
    from langchain_core.tools import BaseTool, InjectedToolCallId, tool
    from langchain_core.tools import base as tools_base
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode
    from langgraph.prebuilt import tool_node as tool_node_module

    from veronica_otel.instrumentors.langchain import (
        ContainedRunnable,
        LangChainInstrumentor,
        contain,
    )

MODEL = "gpt-4o-mini"
QUESTION = {"messages": [{"role": "user", "content": "Count for me."}]}
CHAT = "/v1/chat/completions"


class Counter:
    """What the tools did, in order."""

    def __init__(self) -> None:
        self.calls: list[int] = []


@pytest.fixture(scope="module", autouse=True)
def _langchain() -> None:
    """LangChain, LangGraph and our instrumentor, imported for this module's tests.

    Imported at the module's top, every pytest-xdist worker would import them
    while collecting (about 1.3 CPU-seconds each), although one worker runs
    these tests (tests/conftest.py). A module fixture imports them before any
    test's fixture turns OpenAIInstrumentor on, as an import at the top did:
    langchain-openai imported under it left two asyncio transports unclosed.
    """
    global create_agent, AIMessage, ToolMessage, Runnable, RunnableLambda
    global BaseTool, InjectedToolCallId, tool, tools_base, ChatOpenAI
    global END, START, MessagesState, StateGraph, ToolNode, tool_node_module
    global ContainedRunnable, LangChainInstrumentor, contain
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.runnables import Runnable, RunnableLambda
    from langchain_core.tools import BaseTool, InjectedToolCallId, tool
    from langchain_core.tools import base as tools_base
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode
    from langgraph.prebuilt import tool_node as tool_node_module

    from veronica_otel.instrumentors.langchain import (
        ContainedRunnable,
        LangChainInstrumentor,
        contain,
    )


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=3) as fake:
        yield fake


@pytest.fixture
def instrumented() -> Iterator[LangChainInstrumentor]:
    openai_instrumentor = OpenAIInstrumentor()
    openai_instrumentor.instrument()
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument()
    yield instrumentor
    instrumentor.uninstrument()
    openai_instrumentor.uninstrument()


@pytest.fixture
def counter() -> Counter:
    return Counter()


@pytest.fixture
def count_tool(counter: Counter) -> BaseTool:
    @tool
    def count(n: int) -> str:
        """Count to n."""
        counter.calls.append(n)
        return f"counted to {n}"

    return count


@pytest.fixture
def acount_tool(counter: Counter) -> BaseTool:
    @tool
    async def count(n: int) -> str:
        """Count to n."""
        await asyncio.sleep(0)
        counter.calls.append(n)
        return f"counted to {n}"

    return count


def _model(server: FakeLLMServer) -> ChatOpenAI:
    return ChatOpenAI(model=MODEL, base_url=server.openai_base_url, api_key="test", max_retries=0)


def _keep_counting(request: RecordedRequest) -> ScriptedReply:
    """A runaway model: always one more tool call, with new arguments each time."""
    return ScriptedReply.tool_call("count", {"n": len(request.body["messages"])})


def _count_once(request: RecordedRequest) -> ScriptedReply:
    """A well-behaved model: one tool call, then the answer."""
    if request.body["messages"][-1]["role"] == "tool":
        return ScriptedReply(text="Done counting.")
    return ScriptedReply.tool_call("count", {"n": 1})


def _spans(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


# -- tools are steps; a denial stops the agent ------------------------------------------


def test_steps_ceiling_stops_the_agent(
    server: FakeLLMServer,
    instrumented: LangChainInstrumentor,
    count_tool: BaseTool,
    counter: Counter,
    span_exporter: InMemorySpanExporter,
) -> None:
    server.set_responder(_keep_counting)
    agent = create_agent(_model(server), [count_tool])
    with (
        pytest.raises(BudgetExceededError) as caught,
        ExecutionContext(ExecutionConfig(max_steps=5)) as ctx,
    ):
        agent.invoke(QUESTION)
    assert caught.value.reason == "steps"
    # model, tool, model, tool, model: the third tool call is denied before it runs
    assert counter.calls == [1, 3]
    assert server.count(CHAT) == 3  # nothing was sent after the trip
    assert ctx.snapshot().steps == 5  # model and tool calls are steps of one chain
    tool_spans = _spans(span_exporter, "execute_tool count")
    assert [s.attributes["veronica.decision"] for s in tool_spans] == ["ALLOW", "ALLOW", "HALT"]
    assert all(s.attributes["gen_ai.tool.call.id"] for s in tool_spans)
    assert len(_spans(span_exporter, f"chat {MODEL}")) == 3


def test_same_tool_with_same_arguments_trips_loop(
    server: FakeLLMServer, instrumented: LangChainInstrumentor, counter: Counter
) -> None:
    @tool
    def count(n: int, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        """Count to n."""
        counter.calls.append(n)
        return f"counted to {n} ({tool_call_id})"

    # The same arguments every time; the injected call id differs, and must not count.
    server.set_responder(lambda request: ScriptedReply.tool_call("count", {"n": 7}))
    agent = create_agent(_model(server), [count])
    with (
        pytest.raises(BudgetExceededError) as caught,
        ExecutionContext(ExecutionConfig(max_repeats=2, max_steps=50)),
    ):
        agent.invoke(QUESTION)
    assert caught.value.reason == "loop"
    assert counter.calls == [7, 7]
    assert server.count(CHAT) == 3


@pytest.mark.asyncio
async def test_ainvoke_is_contained(
    server: FakeLLMServer,
    instrumented: LangChainInstrumentor,
    acount_tool: BaseTool,
    counter: Counter,
) -> None:
    server.set_responder(_keep_counting)
    agent = create_agent(_model(server), [acount_tool])
    with pytest.raises(BudgetExceededError) as caught:
        async with ExecutionContext(ExecutionConfig(max_steps=4)) as ctx:
            await agent.ainvoke(QUESTION)
    assert caught.value.reason == "steps"
    assert counter.calls == [1, 3]
    assert server.count(CHAT) == 2  # the third model call was the denied step
    assert ctx.snapshot().steps == 4


@pytest.mark.asyncio
async def test_a_sync_tool_on_the_async_path_is_contained(
    server: FakeLLMServer, instrumented: LangChainInstrumentor, count_tool: BaseTool
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=1)) as ctx:
        assert await count_tool.ainvoke({"n": 2}) == "counted to 2"
        with pytest.raises(BudgetExceededError):
            await count_tool.ainvoke({"n": 3})
    assert ctx.snapshot().steps == 1


def test_a_tool_node_that_handles_all_errors_does_not_swallow_a_denial(
    instrumented: LangChainInstrumentor, count_tool: BaseTool, counter: Counter
) -> None:
    node = _tool_graph(count_tool)

    def ask(n: int) -> dict[str, Any]:
        call = {"name": "count", "args": {"n": n}, "id": f"call_{n}", "type": "tool_call"}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}

    with ExecutionContext(ExecutionConfig(max_steps=1)):
        message = node.invoke(ask(1))["messages"][-1]
        assert isinstance(message, ToolMessage) and message.status == "success"
        with pytest.raises(BudgetExceededError):
            node.invoke(ask(2))
    assert counter.calls == [1]
    # The tool's own errors are still handed to the model, as configured.
    broken = _tool_graph(_failing_tool(ValueError("bad input")))
    with ExecutionContext(ExecutionConfig(max_steps=5)):
        call = {"name": "fail", "args": {}, "id": "c", "type": "tool_call"}
        message = broken.invoke({"messages": [AIMessage("", tool_calls=[call])]})["messages"][-1]
    assert message.status == "error" and "bad input" in str(message.content)


def _tool_graph(*tools: BaseTool) -> Any:
    """A graph of one ToolNode that hands every tool error to the model."""
    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode(list(tools), handle_tool_errors=True))
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    return graph.compile()


def _failing_tool(error: Exception) -> BaseTool:
    @tool
    def fail() -> str:
        """Always fails."""
        raise error

    return fail


def test_user_errors_pass_through_unchanged(
    instrumented: LangChainInstrumentor, span_exporter: InMemorySpanExporter
) -> None:
    error = KeyError("mine")
    failing = _failing_tool(error)
    with ExecutionContext(ExecutionConfig(max_steps=5)) as ctx, pytest.raises(KeyError) as caught:
        failing.invoke({})
    assert caught.value is error
    assert ctx.snapshot().steps == 1
    (span,) = _spans(span_exporter, "execute_tool fail")
    assert span.attributes is not None and span.attributes["error.type"] == "KeyError"


def test_without_a_chain_tools_run_untouched(
    instrumented: LangChainInstrumentor,
    count_tool: BaseTool,
    counter: Counter,
    span_exporter: InMemorySpanExporter,
) -> None:
    assert count_tool.invoke({"n": 1}) == "counted to 1"
    assert counter.calls == [1]
    assert _spans(span_exporter, "execute_tool count") == []


def test_suppressed_instrumentation_records_no_span_but_still_contains(
    instrumented: LangChainInstrumentor,
    count_tool: BaseTool,
    counter: Counter,
    span_exporter: InMemorySpanExporter,
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=1)) as ctx, suppress_instrumentation():
        count_tool.invoke({"n": 1})
        with pytest.raises(BudgetExceededError):
            count_tool.invoke({"n": 2})
    assert counter.calls == [1]
    assert ctx.snapshot().steps == 1
    assert _spans(span_exporter, "execute_tool count") == []


# -- instrument / uninstrument ---------------------------------------------------------


def test_instrument_is_idempotent_and_uninstrument_restores(
    count_tool: BaseTool, counter: Counter
) -> None:
    originals = {name: vars(BaseTool)[name] for name in ("run", "arun")}
    instrumentor = LangChainInstrumentor()
    assert instrumentor.instrumentation_dependencies() == ("langchain-core >= 1.0, < 2",)
    instrumentor.instrument()
    instrumentor.instrument()
    try:
        for name, original in originals.items():
            wrapper = vars(BaseTool)[name]
            assert wrapper is not original
            assert wrapper.__wrapped__ is original  # one layer, however often instrumented
        assert isinstance(vars(tool_node_module)["_handle_tool_error"], wrapt.FunctionWrapper)
    finally:
        instrumentor.uninstrument()
    assert {name: vars(BaseTool)[name] for name in ("run", "arun")} == originals
    assert not isinstance(vars(tool_node_module)["_handle_tool_error"], wrapt.FunctionWrapper)
    assert tools_base.BaseTool is BaseTool
    with ExecutionContext(ExecutionConfig(max_steps=1)) as ctx:
        count_tool.invoke({"n": 1})
        count_tool.invoke({"n": 2})  # no longer a step
    assert counter.calls == [1, 2]
    assert ctx.snapshot().steps == 0


# -- contain(): one run, one chain -----------------------------------------------------


def test_contain_gives_each_run_its_own_budget(
    server: FakeLLMServer,
    instrumented: LangChainInstrumentor,
    count_tool: BaseTool,
    counter: Counter,
) -> None:
    server.set_responder(_count_once)
    agent = contain(create_agent(_model(server), [count_tool]), ExecutionConfig(max_steps=3))
    assert isinstance(agent, ContainedRunnable) and isinstance(agent, Runnable)
    for _ in range(3):  # model, tool, model: three steps each, never shared
        result = agent.invoke(QUESTION)
        assert result["messages"][-1].content == "Done counting."
    assert counter.calls == [1, 1, 1]
    assert len(agent.batch([QUESTION, QUESTION])) == 2
    chunks = list(agent.stream(QUESTION, stream_mode="updates"))
    assert chunks and counter.calls == [1] * 6
    server.set_responder(_keep_counting)
    with pytest.raises(BudgetExceededError):
        agent.invoke(QUESTION)  # a runaway run still meets its own ceiling
    assert counter.calls[-1:] == [1]


@pytest.mark.asyncio
async def test_contain_async_runs(
    server: FakeLLMServer,
    instrumented: LangChainInstrumentor,
    acount_tool: BaseTool,
    counter: Counter,
) -> None:
    server.set_responder(_count_once)
    agent = contain(create_agent(_model(server), [acount_tool]), ExecutionConfig(max_steps=3))
    await agent.ainvoke(QUESTION)
    assert len(await agent.abatch([QUESTION, QUESTION])) == 2
    assert [chunk async for chunk in agent.astream(QUESTION, stream_mode="updates")]
    assert counter.calls == [1, 1, 1, 1]


def test_contained_runs_inside_a_chain_are_its_children(
    server: FakeLLMServer, instrumented: LangChainInstrumentor, count_tool: BaseTool
) -> None:
    server.set_responder(_count_once)
    agent = contain(create_agent(_model(server), [count_tool]), ExecutionConfig(max_steps=10))
    with ExecutionContext(ExecutionConfig(max_steps=4)) as parent:
        agent.invoke(QUESTION)
        assert parent.snapshot().steps == 3  # the child's steps count in the parent
        with pytest.raises(BudgetExceededError):
            agent.invoke(QUESTION)  # only one step of the parent's budget is left
    assert server.count(CHAT) == 3


def test_contain_checks_its_arguments() -> None:
    with pytest.raises(TypeError):
        contain(lambda x: x)  # type: ignore[arg-type]
    runnable = RunnableLambda(lambda x: x)
    with pytest.raises(TypeError):
        contain(runnable, {"max_steps": 3})  # type: ignore[arg-type]
    contained = contain(runnable, name="echo")
    assert contained.get_name() == "echo"
    assert contained.invoke(5) == 5
