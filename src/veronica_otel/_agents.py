"""Agent identity and the agent-pair handoff ceiling.

Two agents that never agree (a planner and a critic) hand control back and
forth for as long as nobody stops them; each call is legitimate, only the
alternation is wrong. A chain with ``max_handoffs`` counts, per pair of
agents, how often control passed between them (a call by one agent right
after a call by the other) and trips with reason ``loop`` instead of letting
the next handoff's call leave the process.

An agent is named by ``with agent("critic"):`` or, when no name was given,
by the ``gen_ai.agent.name`` attribute of the current span (set by agent
frameworks that follow the GenAI semantic conventions).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from ._cm import AsyncFromSync
from ._version import __version__

__all__ = ["AgentScope", "HandoffCounter", "agent", "current_agent"]

_AGENT_KEY = otel_context.create_key("veronica_otel.agent")
_AGENT_ATTRIBUTE = "gen_ai.agent.name"
_MAX_NAME = 256
_MAX_PAIRS = 1024  # bounded memory: chains with many agents forget the oldest pairs
_tracer = trace.get_tracer("veronica_otel", __version__)


def current_agent() -> str | None:
    """The agent the running code acts for, or None when unknown."""
    name = otel_context.get_value(_AGENT_KEY)
    if name is not None:
        return name  # type: ignore[return-value]
    attributes: Any = getattr(trace.get_current_span(), "attributes", None)
    if attributes:
        value = attributes.get(_AGENT_ATTRIBUTE)
        if isinstance(value, str) and value:
            return value
    return None


class AgentScope(AsyncFromSync):
    """The code inside acts for one named agent (see :func:`agent`)."""

    __slots__ = ("_tokens", "name")

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name.strip() or len(name) > _MAX_NAME:
            raise ValueError(f"agent name must be a non-empty string of at most 256, got {name!r}")
        self.name = name
        self._tokens: list[tuple[object, trace.Span]] = []

    def __enter__(self) -> AgentScope:
        span = _tracer.start_span(
            f"invoke_agent {self.name}",
            kind=trace.SpanKind.INTERNAL,
            attributes={"gen_ai.operation.name": "invoke_agent", _AGENT_ATTRIBUTE: self.name},
        )
        ctx = otel_context.set_value(_AGENT_KEY, self.name, trace.set_span_in_context(span))
        self._tokens.append((otel_context.attach(ctx), span))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        token, span = self._tokens.pop()
        if exc is not None and span.is_recording():
            span.record_exception(exc)
            span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
        span.end()
        otel_context.detach(token)  # type: ignore[arg-type]


def agent(name: str) -> AgentScope:
    """Act as agent ``name`` inside a ``with`` (or ``async with``) block.

    Calls made inside are attributed to the agent (for the chain's
    ``max_handoffs`` ceiling) and run under an ``invoke_agent {name}`` span,
    so the execution graph shows which agent made them.
    """
    return AgentScope(name)


class HandoffCounter:
    """Counts handoffs between each pair of agents of one chain."""

    __slots__ = ("_last", "_lock", "_pairs", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._last: str | None = None
        self._pairs: OrderedDict[tuple[str, str], int] = OrderedDict()

    def observe(self, name: str) -> tuple[str, str, int] | None:
        """Record a call by agent ``name``.

        Returns ``(a, b, handoffs)`` when this call would pass control between
        ``a`` and ``b`` more than ``limit`` times (the call must not run and is
        not counted), else None.
        """
        with self._lock:
            last = self._last
            if last is None or last == name:
                self._last = name
                return None
            pair = (last, name) if last < name else (name, last)
            count = self._pairs.get(pair, 0) + 1
            if count > self.limit:
                return (last, name, count)
            self._pairs[pair] = count
            self._pairs.move_to_end(pair)
            if len(self._pairs) > _MAX_PAIRS:
                self._pairs.popitem(last=False)
            self._last = name
            return None

    def handoffs(self, a: str, b: str) -> int:
        """How many times control passed between ``a`` and ``b``."""
        pair = (a, b) if a < b else (b, a)
        with self._lock:
            return self._pairs.get(pair, 0)
