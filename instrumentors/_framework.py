"""Agent frameworks' own agent names, as our ``agent(name)`` scope, and their tool runs.

A framework hook finds the name of the agent a model call is made for and
runs the call under :class:`~veronica_otel._agents.AgentScope`, so a policy
file's ``[agents."name"]`` limits and the chain's ``max_handoffs`` apply to
the agents the framework defined, with no code change. Outside any chain
(none active, no zero-code default) the call runs as it is.

A framework's tool run is one step of the chain (DESIGN: every LLM or tool
call is checked before it runs), as with MCP, LangChain and AG2 tools: it
runs as a :class:`~veronica_otel.ToolCall` (:func:`as_tool`), so
``max_steps`` counts model calls and tool runs alike in every framework.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import AsyncIterator, Callable, Collection, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from veronica_otel._agents import AgentScope
from veronica_otel._errors import BudgetExceededError
from veronica_otel._propagation import default_context
from veronica_otel._tools import ToolCall

from ._breakers import endpoint_breaker
from ._hooks import GuardedInstrumentor
from ._scoped_streams import ScopedIterator, ScopedStream

if TYPE_CHECKING:
    from veronica_otel._context import ExecutionContext

__all__ = [
    "FrameworkInstrumentor",
    "argument",
    "as_agent",
    "as_agent_async",
    "as_agent_iter",
    "as_agent_stream",
    "as_agent_tool_async",
    "as_tool",
    "as_tool_async",
    "as_tool_stream",
    "caused_by_denial",
    "joins_framework_tool",
    "running_tool",
    "scope_for",
]

_MAX_NAME = 256
T = TypeVar("T")


def argument(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
    """The wrapped call's argument ``name``, passed at position ``index`` or by name."""
    return args[index] if len(args) > index else kwargs.get(name)


def caused_by_denial(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a denial, or was raised because of one (its causes walked).

    A framework's retry loop must not retry it: a denial is final. Some tell a
    rate limit by its text (``"429"``, ``"rate"``), which a denial's text may
    hold (a random chain id, an agent's name), and sleep minutes before each retry.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, BudgetExceededError):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def scope_for(name: object) -> AgentScope | None:
    """The scope to run under for an agent called ``name`` (None: no chain, or no name)."""
    if not isinstance(name, str) or not name.strip() or default_context() is None:
        return None
    return AgentScope(name.strip()[:_MAX_NAME])


def as_agent(name: object, call: Callable[[], Any]) -> Any:
    """``call()`` acting for agent ``name``."""
    scope = scope_for(name)
    if scope is None:
        return call()
    with scope:
        return call()


async def as_agent_async(name: object, call: Callable[[], Any]) -> Any:
    """``await call()`` acting for agent ``name``."""
    scope = scope_for(name)
    if scope is None:
        return await call()
    async with scope:
        return await call()


def as_agent_iter(name: object, iterator: Iterator[T]) -> Iterator[T]:
    """``iterator`` (a streamed run) producing each item as agent ``name``."""
    scope = scope_for(name)
    return iterator if scope is None else ScopedIterator(scope, iterator)


def as_agent_stream(name: object, stream: AsyncIterator[T]) -> AsyncIterator[T]:
    """``stream`` (a streamed run) producing each item as agent ``name``."""
    scope = scope_for(name)
    return stream if scope is None else ScopedStream(scope, stream)


class _Run:
    """A framework tool run in progress: its chain, and whether an MCP call joined it."""

    __slots__ = ("context", "joined")

    def __init__(self, context: ExecutionContext) -> None:
        self.context = context
        self.joined = False


_running: contextvars.ContextVar[_Run | None] = contextvars.ContextVar(
    "veronica_framework_tool", default=None
)
_join_lock = threading.Lock()


def joins_framework_tool(context: ExecutionContext) -> bool:
    """Whether the MCP call about to be made in ``context`` is the framework tool
    run around it (DESIGN G13: one call, one count): a framework tool backed by
    an MCP tool (an ``mcp`` session's ``call_tool``) is one step, not two. Only
    the first MCP call of a run joins it; any other is a step of its own."""
    run = _running.get()
    if run is None or run.context is not context:
        return False
    with _join_lock:
        if run.joined:
            return False
        run.joined = True
        return True


@contextlib.contextmanager
def running_tool(context: ExecutionContext) -> Iterator[None]:
    """Inside: a framework's tool run in ``context``, which the first MCP call
    made for it joins (:func:`joins_framework_tool`)."""
    token = _running.set(_Run(context))
    try:
        yield
    finally:
        _running.reset(token)


def _tool_call(
    framework: str, name: object, arguments: object
) -> tuple[ToolCall, ExecutionContext] | None:
    """The contained run of ``framework``'s tool ``name``, and its chain (None: no
    chain, or no name).

    Checked before the tool runs: steps, deadline, repeats of the same tool with
    the same ``arguments`` (``loop``), the tool's price and its circuit breaker.
    """
    if not isinstance(name, str) or not name:
        return None
    ctx = default_context()
    if ctx is None:
        return None
    breaker = endpoint_breaker(framework, name)
    return ToolCall(name[:_MAX_NAME], arguments, breaker=breaker, context=ctx), ctx


def as_tool(framework: str, name: object, arguments: object, call: Callable[[], T]) -> T:
    """``call()`` as one contained run of ``framework``'s tool ``name``."""
    found = _tool_call(framework, name, arguments)
    if found is None:
        return call()
    tool, ctx = found
    with tool, running_tool(ctx):  # raises BudgetExceededError before the tool runs
        return call()


async def as_tool_async(
    framework: str, name: object, arguments: object, call: Callable[[], Any]
) -> Any:
    """``await call()`` as one contained run of ``framework``'s tool ``name``."""
    found = _tool_call(framework, name, arguments)
    if found is None:
        return await call()
    tool, ctx = found
    async with tool:
        with running_tool(ctx):
            return await call()


async def as_agent_tool_async(
    agent: object, framework: str, name: object, arguments: object, call: Callable[[], Any]
) -> Any:
    """``await call()`` as one contained run of ``framework``'s tool ``name``,
    for agent ``agent``: the run is its agent's, as its model calls are."""
    return await as_agent_async(agent, lambda: as_tool_async(framework, name, arguments, call))


def as_tool_stream(
    framework: str, name: object, arguments: object, stream: AsyncIterator[T]
) -> AsyncIterator[T]:
    """``stream`` (a tool run's events) as one contained run of tool ``name``:
    checked before its first item, settled after its last."""
    found = _tool_call(framework, name, arguments)
    if found is None:
        return stream
    tool, ctx = found
    scoped = ScopedStream(tool, stream)
    scoped.context.run(_running.set, _Run(ctx))  # the run, for an MCP call it makes
    return scoped


class FrameworkInstrumentor(GuardedInstrumentor):
    """An agent framework's hooks (``_hooks``) for the releases in ``_instruments``.

    ``active`` is true while instrumented: a wrapper left in place under
    another one after ``uninstrument()`` passes calls through.
    ``instrument()`` raises :class:`~veronica_otel.instrumentors.InstrumentationError`
    when the framework is outside the tested range or a hook changed shape;
    its hooked calls in a chain are then refused (fail closed).
    """

    _instruments: tuple[str, ...] = ()
    active = False

    def instrumentation_dependencies(self) -> Collection[str]:
        return self._instruments

    def _instrument(self, **kwargs: Any) -> None:
        super()._instrument(**kwargs)
        type(self).active = True

    def _uninstrument(self, **kwargs: Any) -> None:
        type(self).active = False
        super()._uninstrument(**kwargs)
