"""Agent names for LangGraph (``langgraph`` >= 1.2): each node of a graph is an agent.

Usage::

    from veronica_otel.instrumentors.langchain import LangChainInstrumentor
    from veronica_otel.instrumentors.langgraph import LangGraphInstrumentor

    LangChainInstrumentor().instrument()  # tool runs (and, once LangGraph is imported, this)
    LangGraphInstrumentor().instrument()  # ... each node under its name
    with ExecutionContext(ExecutionConfig(max_steps=20, max_handoffs=4)):
        graph.invoke({"messages": [...]})

Under ``opentelemetry-instrument`` nothing needs writing: the LangChain
instrumentor installs this one when the application imports LangGraph.

Where it hooks: ``langgraph.pregel._runner``'s ``run_with_retry`` and
``arun_with_retry``, which run every task (one node, with its retries) of
every graph. A node of the outermost graph runs as :func:`veronica_otel.agent`
named after the node (``add_node("researcher", ...)``; a supervisor's or a
swarm's sub-agents are nodes named after the agent; ``create_react_agent``'s
model node is ``"agent"``, ``create_agent``'s ``"model"``), so
``[agents."researcher"]`` limits and ``max_handoffs`` apply. The nodes inside
a subgraph belong to the node that runs it, and a ``ToolNode`` opens no scope:
its tool runs belong to the agent that asked for them (a ReAct loop is not a
handoff between a model and its tools).
A node's ``RetryPolicy`` never retries a denial
(``langgraph.pregel._retry._should_retry_on`` says no to one anywhere in the
error's causes): its default ``retry_on`` retries any error not of a few
built-in types, ours included, each retry after a longer sleep, and each
denied again.
"""

from __future__ import annotations

import contextvars
from typing import Any

from veronica_otel._agents import AgentScope

from ._framework import FrameworkInstrumentor, argument, caused_by_denial, scope_for
from ._hooks import Hook, SDKHooks

__all__ = ["LangGraphInstrumentor"]

_instruments = ("langgraph >= 1.2, < 2",)
# Set inside a named node: the nodes of its subgraphs are part of that agent.
_in_node: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "veronica_langgraph_node", default=False
)


def _scope(args: tuple[Any, ...], kwargs: dict[str, Any]) -> AgentScope | None:
    """The scope a task runs under: its node's name, unless no agent is named by it."""
    if not LangGraphInstrumentor.active or _in_node.get():
        return None
    task = argument(args, kwargs, 0, "task")
    proc = getattr(task, "proc", None)
    steps = getattr(proc, "steps", None)  # RunnableSeq(node, *writers)
    node = steps[0] if isinstance(steps, list) and steps else proc
    if any(cls.__name__ == "ToolNode" for cls in type(node).__mro__):
        return None
    return scope_for(getattr(task, "name", None))


def _run(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    scope = _scope(args, kwargs)
    if scope is None:
        return wrapped(*args, **kwargs)
    token = _in_node.set(True)
    try:
        with scope:
            return wrapped(*args, **kwargs)
    finally:
        _in_node.reset(token)


async def _arun(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    scope = _scope(args, kwargs)
    if scope is None:
        return await wrapped(*args, **kwargs)
    token = _in_node.set(True)
    try:
        async with scope:
            return await wrapped(*args, **kwargs)
    finally:
        _in_node.reset(token)


def _should_retry_on(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    if LangGraphInstrumentor.active and caused_by_denial(argument(args, kwargs, 1, "exc")):
        return False
    return wrapped(*args, **kwargs)


_HOOKS = SDKHooks(
    _instruments[0],
    "langgraph.pregel",
    (
        Hook("_runner", "run_with_retry", _run, ("task",)),
        Hook("_runner", "arun_with_retry", _arun, ("task",), (), True),
        Hook("_retry", "_should_retry_on", _should_retry_on, ("retry_policy", "exc")),
    ),
    (("_runner", ("run_with_retry",)), ("_runner", ("arun_with_retry",))),
)


class LangGraphInstrumentor(FrameworkInstrumentor):
    """Runs each node of a LangGraph graph under the node's name."""

    _hooks = _HOOKS
    _instruments = _instruments
