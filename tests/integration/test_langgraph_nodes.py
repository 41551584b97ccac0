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

from veronica_otel import ExecutionConfig, ExecutionContext
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
