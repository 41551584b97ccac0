"""Agent names for Strands Agents (``strands-agents`` >= 1.62).

Usage::

    from veronica_otel.instrumentors.bedrock import BedrockInstrumentor
    from veronica_otel.instrumentors.strands import StrandsInstrumentor

    BedrockInstrumentor().instrument()  # Strands' default model: Bedrock through boto3
    StrandsInstrumentor().instrument()  # ... each invocation under its agent's name
    with ExecutionContext(ExecutionConfig(max_steps=20)):
        agent("...")

Under ``opentelemetry-instrument`` the ``veronica`` distro installs it once
the application has imported Strands: nothing to write.

Strands' own spans name the agent on the invocation, not on the model call
that happens under it, so without a hook ``[agents."name"]`` never binds.
Where it hooks: ``strands.agent.agent.Agent.invoke_async``, which calling an
agent (``agent("...")``) also goes through; the invocation runs as
:func:`veronica_otel.agent` named after ``Agent.name``. ``stream_async``
iterated directly is not named (its calls are still contained by the chain).

A denial leaves the call as the ``__cause__`` of Strands' ``EventLoopException``.
"""

from __future__ import annotations

from typing import Any

from ._framework import FrameworkInstrumentor, as_agent_async
from ._hooks import Hook, SDKHooks

__all__ = ["StrandsInstrumentor"]

_instruments = ("strands-agents >= 1.62, < 2",)


async def _invoke(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    if not StrandsInstrumentor.active:
        return await wrapped(*args, **kwargs)
    return await as_agent_async(getattr(instance, "name", None), lambda: wrapped(*args, **kwargs))


_HOOKS = SDKHooks(
    _instruments[0],
    "strands.agent.agent",
    (Hook("Agent", "invoke_async", _invoke, ("prompt",), (), True),),
    (("Agent", ("invoke_async",)),),
)


class StrandsInstrumentor(FrameworkInstrumentor):
    """Runs each Strands agent invocation under the agent's name."""

    _hooks = _HOOKS
    _instruments = _instruments
