"""Agent names for the OpenAI Agents SDK (``openai-agents`` >= 0.24).

Usage::

    from veronica_otel.instrumentors.openai import OpenAIInstrumentor
    from veronica_otel.instrumentors.openai_agents import OpenAIAgentsInstrumentor

    OpenAIInstrumentor().instrument()        # its model calls go through the openai SDK
    OpenAIAgentsInstrumentor().instrument()  # ... each under the name of its agent
    with ExecutionContext(ExecutionConfig(max_steps=20, max_handoffs=4)):
        Runner.run_sync(triage, "...")

Under ``opentelemetry-instrument`` the ``veronica`` distro installs it once
the application has imported the SDK: nothing to write.

The SDK sends every model call through the ``openai`` SDK (the Responses API
by default, chat completions with ``OpenAIChatCompletionsModel``), where our
openai adapter admits it; it emits no OpenTelemetry spans, so without this
hook its agents are invisible to us. Where it hooks: each turn of the run
loop, ``agents.run_internal.run_loop.get_new_response`` (one model call and
its retries) and ``run_single_turn_streamed`` (a streamed turn), both given
the turn's agent. The turn runs as :func:`veronica_otel.agent` named after
that agent (``Agent.name``), so ``[agents."Alpha"]`` limits apply to Alpha's
calls and a handoff loop between two agents counts towards ``max_handoffs``.

Configuration: none. A denial is raised from the model call as
``BudgetExceededError`` and leaves ``Runner.run`` / ``run_sync`` as itself
(the SDK does not wrap it); the SDK's own ``max_turns`` still applies.
"""

from __future__ import annotations

from typing import Any

from ._framework import FrameworkInstrumentor, argument, as_agent_async
from ._hooks import Hook, SDKHooks

__all__ = ["OpenAIAgentsInstrumentor"]

_instruments = ("openai-agents >= 0.24, < 0.26",)


def _agent_name(bindings: Any) -> object:
    return getattr(getattr(bindings, "public_agent", None), "name", None)


async def _response(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    if not OpenAIAgentsInstrumentor.active:
        return await wrapped(*args, **kwargs)
    name = _agent_name(argument(args, kwargs, 0, "bindings"))
    return await as_agent_async(name, lambda: wrapped(*args, **kwargs))


async def _streamed_turn(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    if not OpenAIAgentsInstrumentor.active:
        return await wrapped(*args, **kwargs)
    name = _agent_name(argument(args, kwargs, 1, "bindings"))
    return await as_agent_async(name, lambda: wrapped(*args, **kwargs))


_HOOKS = SDKHooks(
    _instruments[0],
    "agents.run_internal.run_loop",
    (
        Hook("", "get_new_response", _response, ("bindings",), (), True),
        Hook(
            "",
            "run_single_turn_streamed",
            _streamed_turn,
            ("streamed_result", "bindings"),
            (),
            True,
        ),
    ),
    (("", ("get_new_response",)), ("", ("run_single_turn_streamed",))),
)


class OpenAIAgentsInstrumentor(FrameworkInstrumentor):
    """Runs each OpenAI Agents SDK turn under the name of its agent."""

    _hooks = _HOOKS
    _instruments = _instruments
