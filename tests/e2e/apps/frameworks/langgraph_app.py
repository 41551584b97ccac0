"""A runaway LangGraph ReAct agent on langchain-openai, unchanged (no veronica-otel import).

``nested``: the ReAct graph is the node ``Looper`` of an outer graph, as a
supervisor's sub-agent is.
"""

from __future__ import annotations

from typing import Any

from _report import run
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import create_react_agent


@tool
def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


graph = create_react_agent(ChatOpenAI(model="gpt-4o-mini"), [lookup], name="Looper")


def invoke(graph: Any) -> object:
    return graph.invoke({"messages": [("user", "go")]}, {"recursion_limit": 100})


def nested() -> object:
    outer = StateGraph(MessagesState).add_node("Looper", graph).add_edge(START, "Looper")
    return invoke(outer.compile())


run({"": lambda: invoke(graph), "nested": nested})
