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

A denial leaves ``Crew.kickoff`` as ``BudgetExceededError`` itself; crewAI
logs it and retries the call once, which the sticky trip refuses before it
is sent.
"""

from __future__ import annotations

from typing import Any

from ._framework import FrameworkInstrumentor, as_agent, as_agent_async
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


_HOOKS = SDKHooks(
    _instruments[0],
    "crewai.agent.core",
    (
        Hook("Agent", "execute_task", _execute, ("task",)),
        Hook("Agent", "aexecute_task", _aexecute, ("task",), (), True),
    ),
    (("Agent", ("execute_task",)), ("Agent", ("aexecute_task",))),
)


class CrewAIInstrumentor(FrameworkInstrumentor):
    """Runs each crewAI agent's tasks under its role as agent name."""

    _hooks = _HOOKS
    _instruments = _instruments
