"""The tools and graphs tests/integration/test_langchain.py gives its agents.

Apart from the tests so that LangChain and LangGraph are imported when a test
builds one, not when each pytest-xdist worker collects the test module. The
``@tool`` decorator resolves a tool's annotations in its module's globals
(``InjectedToolCallId`` among them), so the imports here are at the top.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from langchain_core.tools import BaseTool, InjectedToolCallId, tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode


def counting_tool(calls: list[int]) -> BaseTool:
    """``count(n)``, which appends ``n`` to ``calls``."""

    @tool
    def count(n: int) -> str:
        """Count to n."""
        calls.append(n)
        return f"counted to {n}"

    return count


def async_counting_tool(calls: list[int]) -> BaseTool:
    """``count(n)`` as a coroutine."""

    @tool
    async def count(n: int) -> str:
        """Count to n."""
        await asyncio.sleep(0)
        calls.append(n)
        return f"counted to {n}"

    return count


def counting_tool_with_call_id(calls: list[int]) -> BaseTool:
    """``count(n)`` with the tool call's id injected (which is not an argument of the call)."""

    @tool
    def count(n: int, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        """Count to n."""
        calls.append(n)
        return f"counted to {n} ({tool_call_id})"

    return count


def failing_tool(error: Exception) -> BaseTool:
    @tool
    def fail() -> str:
        """Always fails."""
        raise error

    return fail


def tool_graph(*tools: BaseTool) -> Any:
    """A graph of one ToolNode that hands every tool error to the model."""
    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode(list(tools), handle_tool_errors=True))
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    return graph.compile()
