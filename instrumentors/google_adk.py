"""Tool runs of Google ADK agents (``google-adk`` >= 2.13) as steps.

Usage::

    from veronica_otel.instrumentors.google_genai import GoogleGenAIInstrumentor
    from veronica_otel.instrumentors.google_adk import GoogleADKInstrumentor

    GoogleGenAIInstrumentor().instrument()  # Gemini: the google-genai SDK
    GoogleADKInstrumentor().instrument()    # ... each tool run a step, under its agent's name
    with ExecutionContext(ExecutionConfig(max_steps=20)):
        for event in runner.run(...):
            ...

Under ``opentelemetry-instrument`` the ``veronica`` distro installs it once
the application has imported ADK's runners: nothing to write.

ADK sends model requests through google-genai, whose adapter admits them,
each under the name of its agent (ADK's spans carry ``gen_ai.agent.name``),
so ``[agents."name"]`` limits apply. Where it hooks: every tool run goes
through ``google.adk.flows.llm_flows.tools._caller._call_tool_async`` (the
live flow imports it by name: its binding is hooked too); the run is one step
of the chain, checked before the tool runs, under the name of the agent that
called it (``tool_context.agent_name``).

A denial leaves ``Runner.run`` / ``run_async`` as ``BudgetExceededError``
itself: ADK re-raises a tool's error unless an ``on_tool_error`` callback
answers it (one that does lets the model read it; the sticky trip then
denies the model request after it).
"""

from __future__ import annotations

from typing import Any

from ._framework import FrameworkInstrumentor, argument, as_agent_tool_async
from ._hooks import Hook, SDKHooks

__all__ = ["GoogleADKInstrumentor"]

_instruments = ("google-adk >= 2.13, < 3",)


async def _tool(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not GoogleADKInstrumentor.active:
        return await wrapped(*args, **kwargs)
    name = getattr(argument(args, kwargs, 0, "tool"), "name", None)
    arguments = argument(args, kwargs, 1, "args")
    agent = getattr(argument(args, kwargs, 2, "tool_context"), "agent_name", None)
    return await as_agent_tool_async(  # "unknown": ADK's name for a context without an agent
        None if agent == "unknown" else agent,
        "google_adk",
        name,
        arguments,
        lambda: wrapped(*args, **kwargs),
    )


_CALLER = "flows.llm_flows.tools._caller"
_LIVE = "flows.llm_flows.tools._live_caller"
_SIGNATURE = ("tool", "args", "tool_context")
_HOOKS = SDKHooks(
    _instruments[0],
    "google.adk",
    (
        Hook(_CALLER, "_call_tool_async", _tool, _SIGNATURE, (), True),
        # Bound at its import: the original, unless _caller was hooked first
        # (then it is ours already, and not wrapped twice).
        Hook(_LIVE, "_call_tool_async", _tool, _SIGNATURE, (), True),
    ),
    ((_CALLER, ("_call_tool_async",)), (_LIVE, ("_call_tool_async",))),
)


class GoogleADKInstrumentor(FrameworkInstrumentor):
    """Runs each Google ADK tool run as a step, under the name of its agent."""

    _hooks = _HOOKS
    _instruments = _instruments
