"""Agent frameworks' own agent names, as our ``agent(name)`` scope.

A framework hook finds the name of the agent a model call is made for and
runs the call under :class:`~veronica_otel._agents.AgentScope`, so a policy
file's ``[agents."name"]`` limits and the chain's ``max_handoffs`` apply to
the agents the framework defined, with no code change. Outside any chain
(none active, no zero-code default) the call runs as it is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Iterator
from typing import Any, TypeVar

from veronica_otel._agents import AgentScope
from veronica_otel._propagation import default_context

from ._hooks import GuardedInstrumentor

__all__ = [
    "FrameworkInstrumentor",
    "argument",
    "as_agent",
    "as_agent_async",
    "as_agent_iter",
    "as_agent_stream",
    "scope_for",
]

_MAX_NAME = 256
T = TypeVar("T")


def argument(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
    """The wrapped call's argument ``name``, passed at position ``index`` or by name."""
    return args[index] if len(args) > index else kwargs.get(name)


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
    """``iterator`` (a streamed run) consumed as agent ``name``, from first to last item."""
    scope = scope_for(name)
    return iterator if scope is None else _scoped_iter(scope, iterator)


def _scoped_iter(scope: AgentScope, iterator: Iterator[T]) -> Iterator[T]:
    with scope:
        yield from iterator  # close() and throw() reach the framework's generator


def as_agent_stream(name: object, stream: AsyncIterator[T]) -> AsyncIterator[T]:
    """``stream`` (a streamed run) consumed as agent ``name``, from first to last item."""
    scope = scope_for(name)
    return stream if scope is None else _scoped_stream(scope, stream)


async def _scoped_stream(scope: AgentScope, stream: AsyncIterator[T]) -> AsyncIterator[T]:
    async with scope:
        try:
            async for item in stream:
                yield item
        finally:  # a consumer that stops early closes the framework's generator too
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()


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
