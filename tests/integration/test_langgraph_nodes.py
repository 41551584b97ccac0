"""LangGraph's nodes name agents (``LangGraphInstrumentor``, installed by
``LangChainInstrumentor`` once LangGraph is imported, before or after it).

LangGraph is imported before the instrumentor is (in ``instrumented``, not at
the top, so that a pytest-xdist worker collecting this module does not import
it): the order of an application that builds its graph first.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from typing_extensions import TypedDict

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext, ToolCall
from veronica_otel._agents import current_agent
from veronica_otel.instrumentors.langgraph import LangGraphInstrumentor


class State(TypedDict):
    seen: list[str | None]


def note(state: State) -> dict[str, Any]:
    return {"seen": [*state["seen"], current_agent()]}


@pytest.fixture
def instrumented() -> Iterator[None]:
    import langgraph.graph  # noqa: F401  # the application's graph first

    from veronica_otel.instrumentors.langchain import LangChainInstrumentor

    instrumentor = LangChainInstrumentor()
    instrumentor.instrument()
    yield
    instrumentor.uninstrument()
    assert not LangGraphInstrumentor.active  # installed with it, removed with it


def graph() -> Any:
    from langgraph.graph import START, StateGraph

    inner = StateGraph(State).add_node("inner", note).add_edge(START, "inner").compile()
    outer = StateGraph(State)
    outer.add_node("planner", note).add_node("team", inner).add_node("critic", note)
    outer.add_edge(START, "planner").add_edge("planner", "team").add_edge("team", "critic")
    return outer.compile()


def test_each_node_of_the_outermost_graph_is_an_agent(instrumented: None) -> None:
    assert LangGraphInstrumentor.active
    with ExecutionContext(ExecutionConfig(max_steps=10)):
        result = graph().invoke({"seen": []})
    # A subgraph's node belongs to the node that runs it.
    assert result["seen"] == ["planner", "team", "critic"]


@pytest.mark.asyncio
async def test_async_nodes_are_agents_too(instrumented: None) -> None:
    async with ExecutionContext(ExecutionConfig(max_steps=10)):
        result = await graph().ainvoke({"seen": []})
    assert result["seen"] == ["planner", "team", "critic"]


class _NodeFailed(Exception):
    """A node's own error, of a type LangGraph's default ``retry_on`` retries."""


@pytest.mark.parametrize("wrapped", [False, True], ids=["denial", "wrapped-denial"])
def test_a_nodes_retry_policy_never_retries_a_denial(instrumented: None, wrapped: bool) -> None:
    from langgraph.graph import START, StateGraph
    from langgraph.types import RetryPolicy

    attempts: list[int] = []

    def looper(state: State) -> dict[str, Any]:
        attempts.append(1)
        try:
            with ToolCall("lookup"):  # the chain's one step is spent: denied
                pass
        except BudgetExceededError as denial:
            if wrapped:
                raise _NodeFailed("lookup failed") from denial
            raise
        return {}

    policy = RetryPolicy(initial_interval=0, jitter=False, max_attempts=3)  # no sleep
    built = StateGraph(State).add_node("looper", looper, retry_policy=policy)
    compiled = built.add_edge(START, "looper").compile()
    with ExecutionContext(ExecutionConfig(max_steps=1)):
        with ToolCall("lookup"):
            pass
        with pytest.raises((BudgetExceededError, _NodeFailed)):
            compiled.invoke({"seen": []})
    assert len(attempts) == 1  # LangGraph's default retry_on would have run it 3 times
