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

Every function-tool run (``_invoke_function_tool_with_metadata``, as bound in
``agents.run_internal.tool_execution`` for runs and in ``agents.tool`` for
realtime sessions) is one step of the chain, checked before the tool runs, under the name of
the agent that asked for it (``ToolContext.agent``).

Configuration: none. A denied model call leaves ``Runner.run`` /
``run_sync`` (or ``stream_events()`` of a streamed run) as
``BudgetExceededError`` itself (the SDK does not wrap it); a denied tool run
as the ``__cause__`` of the SDK's ``UserError("Error running tool ...")``.
The SDK's own ``max_turns`` still applies.
"""

from __future__ import annotations

from typing import Any

from ._framework import FrameworkInstrumentor, argument, as_agent_async, as_agent_tool_async
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


async def _tool(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not OpenAIAgentsInstrumentor.active:
        return await wrapped(*args, **kwargs)
    name = getattr(kwargs.get("function_tool"), "name", None)
    arguments = kwargs.get("arguments")
    agent = getattr(getattr(kwargs.get("context"), "agent", None), "name", None)
    return await as_agent_tool_async(
        agent, "openai_agents", name, arguments, lambda: wrapped(*args, **kwargs)
    )


_LOOP = "run_internal.run_loop"
_INVOKE = "_invoke_function_tool_with_metadata"
_TOOL_ARGS = ("function_tool", "context", "arguments")
_HOOKS = SDKHooks(
    _instruments[0],
    "agents",
    (
        Hook(_LOOP, "get_new_response", _response, ("bindings",), (), True),
        Hook(
            _LOOP,
            "run_single_turn_streamed",
            _streamed_turn,
            ("streamed_result", "bindings"),
            (),
            True,
        ),
        Hook("run_internal.tool_execution", _INVOKE, _tool, (), _TOOL_ARGS, True),
        Hook("tool", _INVOKE, _tool, (), _TOOL_ARGS, True),
    ),
    (
        (_LOOP, ("get_new_response",)),
        (_LOOP, ("run_single_turn_streamed",)),
        ("run_internal.tool_execution", (_INVOKE,)),
        ("tool", (_INVOKE,)),
    ),
)


class OpenAIAgentsInstrumentor(FrameworkInstrumentor):
    """Runs each OpenAI Agents SDK turn under the name of its agent."""

    _hooks = _HOOKS
    _instruments = _instruments
