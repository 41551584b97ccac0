"""Agent names for pydantic-ai (``pydantic-ai-slim`` >= 2.60).

Usage::

    from veronica_otel.instrumentors.openai import OpenAIInstrumentor
    from veronica_otel.instrumentors.pydantic_ai import PydanticAIInstrumentor

    OpenAIInstrumentor().instrument()      # the model's SDK (openai, anthropic, ...)
    PydanticAIInstrumentor().instrument()  # ... each request under the name of its agent
    with ExecutionContext(ExecutionConfig(max_steps=20)):
        agent.run_sync("...")

Under ``opentelemetry-instrument`` the ``veronica`` distro installs it once
the application has imported pydantic-ai: nothing to write.

pydantic-ai sends model requests through each provider's SDK (openai,
anthropic, google-genai, boto3, mistralai, groq, cohere), whose adapters
admit them. Where it hooks: the agent graph's model-request node,
``pydantic_ai._agent_graph.ModelRequestNode.run`` and ``.stream`` (one model
request each, streamed or not), whose graph context holds the agent: the
request runs as :func:`veronica_otel.agent` named after ``Agent.name``
(an agent without a name is not scoped), so ``[agents."name"]`` limits
apply, also to an agent delegated to from another agent's tool. Every run
of a function tool (``pydantic_ai.toolsets.function.FunctionToolset.call_tool``)
is one step of the chain, checked before the tool runs, under the name of
the agent whose run called it (``RunContext.agent``); MCP toolsets go
through the ``mcp`` client, whose instrumentor counts them.

A denial is not a ``ModelAPIError``: pydantic-ai neither retries it nor
falls back on it by default, and it leaves ``run`` / ``run_sync`` as
``BudgetExceededError`` itself. Under ``FallbackModel(fallback_on=...)``
catching every exception it arrives inside a ``FallbackExceptionGroup``:
``except* BudgetExceededError``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from ._framework import (
    FrameworkInstrumentor,
    argument,
    as_agent_async,
    as_agent_tool_async,
    scope_for,
)
from ._hooks import Hook, SDKHooks

__all__ = ["PydanticAIInstrumentor"]

_instruments = ("pydantic-ai-slim >= 2.60, < 3",)


def _agent_name(args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
    ctx = argument(args, kwargs, 0, "ctx")
    return getattr(getattr(getattr(ctx, "deps", None), "agent", None), "name", None)


async def _run(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not PydanticAIInstrumentor.active:
        return await wrapped(*args, **kwargs)
    return await as_agent_async(_agent_name(args, kwargs), lambda: wrapped(*args, **kwargs))


def _stream(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    scope = scope_for(_agent_name(args, kwargs)) if PydanticAIInstrumentor.active else None
    if scope is None:
        return wrapped(*args, **kwargs)

    @asynccontextmanager
    async def scoped() -> AsyncIterator[Any]:
        async with scope, wrapped(*args, **kwargs) as stream:
            yield stream

    return scoped()


async def _tool(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not PydanticAIInstrumentor.active:
        return await wrapped(*args, **kwargs)
    name = argument(args, kwargs, 0, "name")
    arguments = argument(args, kwargs, 1, "tool_args")
    agent = getattr(getattr(argument(args, kwargs, 2, "ctx"), "agent", None), "name", None)
    return await as_agent_tool_async(
        agent, "pydantic_ai", name, arguments, lambda: wrapped(*args, **kwargs)
    )


_GRAPH = "_agent_graph.ModelRequestNode"
_TOOLS = "toolsets.function.FunctionToolset"
_HOOKS = SDKHooks(
    _instruments[0],
    "pydantic_ai",
    (
        Hook(_GRAPH, "run", _run, ("ctx",), (), True),
        Hook(_GRAPH, "stream", _stream, ("ctx",)),
        Hook(_TOOLS, "call_tool", _tool, ("name", "tool_args", "ctx"), (), True),
    ),
    ((_GRAPH, ("run",)), (_GRAPH, ("stream",)), (_TOOLS, ("call_tool",))),
)


class PydanticAIInstrumentor(FrameworkInstrumentor):
    """Runs each pydantic-ai model request under the name of its agent."""

    _hooks = _HOOKS
    _instruments = _instruments
