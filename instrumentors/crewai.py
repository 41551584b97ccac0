"""Agent names for crewAI (``crewai`` >= 1.15): each agent's role.

Usage::

    from veronica_otel.instrumentors.crewai import CrewAIInstrumentor
    from veronica_otel.instrumentors.openai import OpenAIInstrumentor

    OpenAIInstrumentor().instrument()  # crewAI's native OpenAI provider uses the openai SDK
    CrewAIInstrumentor().instrument()  # ... each call under the role of its agent
    with ExecutionContext(ExecutionConfig(max_steps=20)):
        crew.kickoff()

Under ``opentelemetry-instrument`` the ``veronica`` distro installs it once
the application has imported crewAI: nothing to write.

crewAI sends its model calls through its native providers (the ``openai``,
``anthropic``, ``google-genai`` and ``boto3`` SDKs, whose adapters admit
them) or litellm. Where it hooks: ``crewai.agent.core.Agent.execute_task``
and ``aexecute_task``, where a crew hands a task to an agent; the task runs
as :func:`veronica_otel.agent` named after the agent's ``role``, so a policy
file's ``[agents."Researcher"]`` limits apply to that agent's calls (crewAI's
own timeout thread inherits the scope through our threading instrumentor).

Every tool run is one step of the chain, checked before the tool runs:
``crewai.tools.base_tool.BaseTool.run`` / ``arun`` and ``Tool.run`` /
``arun`` (native function calling) and ``CrewStructuredTool.invoke`` /
``ainvoke`` (crewAI's text tool usage); none of them calls another.

A denial leaves ``Crew.kickoff`` as ``BudgetExceededError`` itself; crewAI
logs it and retries the call once, which the sticky trip refuses before it
is sent.
"""

from __future__ import annotations

from typing import Any

from ._framework import (
    FrameworkInstrumentor,
    argument,
    as_agent,
    as_agent_async,
    as_tool,
    as_tool_async,
)
from ._hooks import Hook, SDKHooks

__all__ = ["CrewAIInstrumentor"]

_instruments = ("crewai >= 1.15, < 2",)


def _execute(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not CrewAIInstrumentor.active:
        return wrapped(*args, **kwargs)
    return as_agent(getattr(instance, "role", None), lambda: wrapped(*args, **kwargs))


async def _aexecute(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    if not CrewAIInstrumentor.active:
        return await wrapped(*args, **kwargs)
    return await as_agent_async(getattr(instance, "role", None), lambda: wrapped(*args, **kwargs))


def _run(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not CrewAIInstrumentor.active:
        return wrapped(*args, **kwargs)
    name = getattr(instance, "name", None)
    return as_tool("crewai", name, [args, kwargs], lambda: wrapped(*args, **kwargs))


async def _arun(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not CrewAIInstrumentor.active:
        return await wrapped(*args, **kwargs)
    name = getattr(instance, "name", None)
    return await as_tool_async("crewai", name, [args, kwargs], lambda: wrapped(*args, **kwargs))


def _invoke(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not CrewAIInstrumentor.active:
        return wrapped(*args, **kwargs)
    name, arguments = getattr(instance, "name", None), argument(args, kwargs, 0, "input")
    return as_tool("crewai", name, arguments, lambda: wrapped(*args, **kwargs))


async def _ainvoke(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    if not CrewAIInstrumentor.active:
        return await wrapped(*args, **kwargs)
    name, arguments = getattr(instance, "name", None), argument(args, kwargs, 0, "input")
    return await as_tool_async("crewai", name, arguments, lambda: wrapped(*args, **kwargs))


_AGENT = "agent.core.Agent"
_BASE = "tools.base_tool.BaseTool"
_TOOL = "tools.base_tool.Tool"
_STRUCTURED = "tools.structured_tool.CrewStructuredTool"
_HOOKS = SDKHooks(
    _instruments[0],
    "crewai",
    (
        Hook(_AGENT, "execute_task", _execute, ("task",)),
        Hook(_AGENT, "aexecute_task", _aexecute, ("task",), (), True),
        Hook(_BASE, "run", _run),
        Hook(_BASE, "arun", _arun, (), (), True),
        Hook(_TOOL, "run", _run),
        Hook(_TOOL, "arun", _arun, (), (), True),
        Hook(_STRUCTURED, "invoke", _invoke, ("input",)),
        Hook(_STRUCTURED, "ainvoke", _ainvoke, ("input",), (), True),
    ),
    (
        (_AGENT, ("execute_task",)),
        (_AGENT, ("aexecute_task",)),
        (_BASE, ("run", "arun")),
        (_TOOL, ("run", "arun")),
        (_STRUCTURED, ("invoke", "ainvoke")),
    ),
)


class CrewAIInstrumentor(FrameworkInstrumentor):
    """Runs each crewAI agent's tasks under its role as agent name."""

    _hooks = _HOOKS
    _instruments = _instruments
