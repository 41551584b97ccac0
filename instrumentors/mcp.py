"""Containment for MCP tool calls made with the ``mcp`` SDK (2.x) client.

Usage::

    from veronica_otel.instrumentors.mcp import MCPInstrumentor

    MCPInstrumentor().instrument()
    with ExecutionContext(ExecutionConfig(max_steps=20, max_repeats=3)):
        async with Client(server) as client:
            await client.call_tool("search", {"q": "cats"})  # BudgetExceededError when over

Under ``opentelemetry-instrument`` the ``veronica`` distro installs it as soon
as the application imports the ``mcp`` client: nothing to write.

Configuration: limits come from the active :class:`ExecutionContext`, else the
process default chain (zero-code: ``VERONICA_*`` variables). With neither,
calls pass through untouched. A tool's price comes from
:func:`veronica_otel.set_tool_prices` or a policy file's ``[tools]`` table.

Where it hooks: ``mcp.client.session.ClientSession.call_tool``, once per
``tools/call`` request (``Client.call_tool`` and ``ClientSessionGroup.call_tool``
go through it; an input-required round is a request of its own). Each request
is one :class:`~veronica_otel.ToolCall`, checked before anything is sent:
steps, deadline, repeats of the same tool with the same arguments (``loop``),
the tool's price (``cost``) and the tool's own circuit breaker
(``circuit_open``, one per tool name, see
:func:`~veronica_otel.instrumentors._breakers.configure_endpoint_breakers`).
A result with ``is_error`` set counts as a failure of the tool, as does an
error raised by the call. ``veronica.*`` baggage entries are kept out of the
request's ``_meta``: an MCP server may be anyone's. The first request made
inside an agent framework's tool run (a framework tool backed by an MCP tool,
see :mod:`veronica_otel.instrumentors._framework`) is that run, already
counted: it is sent without a second count (DESIGN G13).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.util.types import AttributeValue

from veronica_otel._attributes import GEN_AI_SYSTEM
from veronica_otel._propagation import default_context
from veronica_otel._tools import ToolCall

from ._breakers import endpoint_breaker
from ._common import without_veronica_baggage
from ._framework import joins_framework_tool
from ._hooks import GuardedInstrumentor, Hook, SDKHooks

__all__ = ["MCPInstrumentor"]

_logger = logging.getLogger(__name__)
_instruments = ("mcp >= 2.0, < 3",)
PROVIDER = "mcp"
_ATTRIBUTES: dict[str, AttributeValue] = {
    GEN_AI_SYSTEM: PROVIDER,
    "mcp.method.name": "tools/call",
}
_active = False  # False after uninstrument: a wrapper left under another passes through


def _request_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str | None, object]:
    """The tool's name and arguments as ``call_tool(name, arguments=None, ...)`` takes them."""
    name = args[0] if args else kwargs.get("name")
    arguments = args[1] if len(args) > 1 else kwargs.get("arguments")
    return (name if isinstance(name, str) and name else None), arguments


def _error_text(result: Any) -> str:
    """A short description of an error result, from its first text block."""
    try:
        for block in result.content or ():
            text = getattr(block, "text", None)
            if isinstance(text, str) and text:
                return text[:200]
    except Exception:
        _logger.debug("an MCP error result without readable content", exc_info=True)
    return "the tool returned an error result"


async def _call_tool(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    ctx = default_context() if _active else None
    name, arguments = _request_of(args, kwargs) if ctx is not None else (None, None)
    if ctx is None or name is None:  # no chain, or a call the SDK itself will reject
        return await wrapped(*args, **kwargs)
    if joins_framework_tool(ctx):  # a framework's tool run, counted there already (G13)
        with without_veronica_baggage():
            return await wrapped(*args, **kwargs)
    tool = ToolCall(
        name,
        arguments,
        breaker=endpoint_breaker(PROVIDER, name),
        attributes=_ATTRIBUTES,
        context=ctx,
        traced=is_instrumentation_enabled(),  # suppression hides the span, never the check
    )
    async with tool:  # raises BudgetExceededError before the request is sent
        with without_veronica_baggage():
            result = await wrapped(*args, **kwargs)
        if getattr(result, "is_error", False) is True:
            tool.mark_failed(_error_text(result))
        return result


_HOOKS = SDKHooks(
    _instruments[0],
    "mcp.client.session",
    (Hook("ClientSession", "call_tool", _call_tool, ("name", "arguments"), (), True),),
    (("ClientSession", ("call_tool",)),),
)


class MCPInstrumentor(GuardedInstrumentor):
    """Contains every ``tools/call`` request of the ``mcp`` client in the active chain.

    ``instrument()`` raises :class:`~veronica_otel.instrumentors.InstrumentationError`
    when ``mcp`` is outside the tested range or ``call_tool`` changed shape; tool
    calls in a chain are then refused (fail closed).
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
