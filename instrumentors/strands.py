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
Where it hooks: ``strands.agent.agent.Agent.stream_async``, which calling an
agent (``agent("...")``) and ``invoke_async`` also go through; the stream,
from its first event to its last, runs as :func:`veronica_otel.agent` named
after ``Agent.name``, iterated directly or not. Every tool run
(``strands.tools.executors._executor._run_tool``, each retry a run of its
own) is one step of the chain, checked before the tool runs.

A denial leaves the call as the ``__cause__`` of Strands' ``EventLoopException``.

A denial is never retried by Strands' retry strategy
(``strands.event_loop._retry.ModelRetryStrategy.is_retryable`` says no to
one anywhere in the error's causes): its Mistral and llama.cpp models turn any
error whose text holds ``"rate"`` or ``"429"`` into ``ModelThrottledException``,
retried after 4, 8, 16, 32 and 64 seconds, and a denial's text may hold either
(an agent called ``"Strategist"``; a random chain id holds ``"429"`` about once in
140 chains).
"""

from __future__ import annotations

from typing import Any

from ._framework import (
    FrameworkInstrumentor,
    argument,
    as_agent_stream,
    as_tool_stream,
    caused_by_denial,
)
from ._hooks import Hook, SDKHooks

__all__ = ["StrandsInstrumentor"]

_instruments = ("strands-agents >= 1.62, < 2",)


def _stream(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    stream = wrapped(*args, **kwargs)
    if not StrandsInstrumentor.active:
        return stream
    return as_agent_stream(getattr(instance, "name", None), stream)


def _tool(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    stream = wrapped(*args, **kwargs)
    if not StrandsInstrumentor.active:
        return stream
    tool_use = getattr(argument(args, kwargs, 0, "ctx"), "tool_use", None)
    if not isinstance(tool_use, dict):
        return stream
    return as_tool_stream("strands", tool_use.get("name"), tool_use.get("input"), stream)


def _is_retryable(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    if StrandsInstrumentor.active and caused_by_denial(argument(args, kwargs, 0, "exception")):
        return False
    return wrapped(*args, **kwargs)


_AGENT = "agent.agent.Agent"
_EXECUTOR = "tools.executors._executor"
_HOOKS = SDKHooks(
    _instruments[0],
    "strands",
    (
        Hook(_AGENT, "stream_async", _stream, ("prompt",)),
        Hook(_EXECUTOR, "_run_tool", _tool, ("ctx", "extra_kwargs", "tool_context")),
        Hook("event_loop._retry.ModelRetryStrategy", "is_retryable", _is_retryable, ("exception",)),
    ),
    ((_AGENT, ("stream_async",)), (_EXECUTOR, ("_run_tool",))),
)


class StrandsInstrumentor(FrameworkInstrumentor):
    """Runs each Strands agent invocation (its event stream) under the agent's name."""

    _hooks = _HOOKS
    _instruments = _instruments
