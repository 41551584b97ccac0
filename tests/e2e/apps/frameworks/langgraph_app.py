"""A runaway LangGraph ReAct agent on langchain-openai, unchanged (no veronica-otel import)."""

from __future__ import annotations

from _report import run
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent


@tool
def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


graph = create_react_agent(ChatOpenAI(model="gpt-4o-mini"), [lookup], name="Looper")
run(lambda: graph.invoke({"messages": [("user", "go")]}, {"recursion_limit": 100}))
