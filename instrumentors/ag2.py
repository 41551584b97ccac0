"""Containment for the tool runs of AG2 (``ag2`` >= 1.2) agents.

Usage::

    from veronica_otel.instrumentors.ag2 import AG2Instrumentor
    from veronica_otel.instrumentors.openai import OpenAIInstrumentor

    OpenAIInstrumentor().instrument()  # AG2's model calls go through the openai SDK
    AG2Instrumentor().instrument()     # its tool runs
    async with ExecutionContext(ExecutionConfig(max_steps=20, max_repeats=3)):
        await agent.ask("...")         # BudgetExceededError when the chain is over

Under ``opentelemetry-instrument`` the ``veronica`` distro installs it once
the application has imported AG2 (``ag2.agent``): nothing to write.

Where it hooks: ``ag2.tools.final.function_tool.FunctionTool.__call__``, the
one place every function tool of an AG2 agent runs (after AG2's tool
middleware, so a call a middleware refused is not counted). Each run is one
:class:`~veronica_otel.ToolCall`, checked before the function runs: steps,
deadline, repeats of the same tool with the same arguments (``loop``), the
tool's price (``cost``) and its circuit breaker (``circuit_open``; an error
the tool raised, which AG2 hands back to the model as a ``ToolErrorEvent``,
counts as a failure). AG2 turns any exception from a tool, a denial included,
into an error message for the model; the trip is sticky, so the model call
that would follow is denied and ``BudgetExceededError`` leaves ``ask``.

Agent identity: every turn of an AG2 agent (``ask``, ``run``, ``resume``, a
reply's ``ask``: all open ``ag2.Agent._turn_scope``) runs as
:func:`veronica_otel.agent` named after the AG2 agent, so ``[agents."name"]``
limits apply to its model calls and tool runs, and two AG2 agents handing a
conversation back and forth count towards the chain's ``max_handoffs``
(reason ``loop``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Collection
from typing import Any

from opentelemetry.util.types import AttributeValue

from veronica_otel._agents import AgentScope
from veronica_otel._attributes import GEN_AI_SYSTEM, GEN_AI_TOOL_CALL_ID
from veronica_otel._propagation import default_context
from veronica_otel._tools import ToolCall

from ._breakers import endpoint_breaker
from ._framework import running_tool, scope_for
from ._hooks import GuardedInstrumentor, Hook, SDKHooks

__all__ = ["AG2Instrumentor"]

_logger = logging.getLogger(__name__)
_instruments = ("ag2 >= 1.2, < 2",)
PROVIDER = "ag2"
_ATTRIBUTES: dict[str, AttributeValue] = {GEN_AI_SYSTEM: PROVIDER}
_active = False  # False after uninstrument: a wrapper left under another passes through


def _arguments(event: Any) -> object:
    try:
        return event.serialized_arguments
    except Exception:  # malformed JSON from the model: AG2 reports it; sign the raw text
        return getattr(event, "arguments", None)


async def _call_tool(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    ctx = default_context() if _active else None
    event = args[0] if args else kwargs.get("event")
    name = getattr(event, "name", None)
    if ctx is None or not isinstance(name, str) or not name:
        return await wrapped(*args, **kwargs)
    tool = ToolCall(
        name,
        _arguments(event),
        breaker=endpoint_breaker(PROVIDER, name),
        attributes={**_ATTRIBUTES, GEN_AI_TOOL_CALL_ID: str(getattr(event, "id", ""))},
        context=ctx,
    )
    async with tool:  # raises BudgetExceededError before the function runs
        with running_tool(ctx):  # an MCP-backed tool counts once
            result = await wrapped(*args, **kwargs)
        error = getattr(result, "error", None)
        if isinstance(error, BaseException):  # AG2 returns a tool's error as an event
            tool.mark_failed(f"{type(error).__name__}: {error}"[:200])
        return result


def _turn_scope(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    scope = scope_for(getattr(instance, "name", None)) if _active else None
    inner = wrapped(*args, **kwargs)
    return inner if scope is None else _named(scope, inner)


@contextlib.asynccontextmanager
async def _named(scope: AgentScope, inner: Any) -> AsyncIterator[Any]:
    """``inner`` (a turn's scope) entered as ``scope``'s agent: the turn's task,
    made inside it, carries the name to the agent's model and tool calls."""
    async with scope, inner as drive:
        yield drive


_HOOKS = SDKHooks(
    _instruments[0],
    "ag2.agent",
    (
        Hook("FunctionTool", "__call__", _call_tool, ("event",), (), True),
        Hook("Agent", "_turn_scope", _turn_scope, ("event",), ("context",)),
    ),
    (("FunctionTool", ("__call__",)),),
)


class AG2Instrumentor(GuardedInstrumentor):
    """Contains every function-tool run of AG2 agents in the active chain.

    ``instrument()`` raises :class:`~veronica_otel.instrumentors.InstrumentationError`
    when ``ag2`` is outside the tested range or a hook changed shape; tool runs
    in a chain are then refused (fail closed).
    """

    _hooks = _HOOKS

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        global _active
        super()._instrument(**kwargs)
        _active = True

    def _uninstrument(self, **kwargs: Any) -> None:
        global _active
        _active = False
        super()._uninstrument(**kwargs)
