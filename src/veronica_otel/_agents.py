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

Per-agent limits: ``agent("researcher", config=ExecutionConfig(max_steps=3))``
(or a policy file's ``[agents."researcher"]``) bounds what is done under that
name in the current chain; :func:`bound_agents` lists the limited agents a
call is made for, and ``_agent_limits.AgentLevels`` turns them into ledger
levels.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from ._attributes import GEN_AI_AGENT_NAME, GEN_AI_OPERATION_NAME
from ._cm import AsyncFromSync
from ._config import ExecutionConfig
from ._ledger import Limits
from ._units import usd_to_nano
from ._version import __version__

__all__ = [
    "AGENT_FIELDS",
    "AgentScope",
    "HandoffCounter",
    "agent",
    "agent_limits",
    "agent_scopes",
    "bound_agents",
    "check_agent_name",
    "current_agent",
    "limits_in_code",
]

_AGENT_KEY = otel_context.create_key("veronica_otel.agent")
# Every enclosing agent scope, outer first: ((name, Limits | None), ...).
_SCOPES_KEY = otel_context.create_key("veronica_otel.agent_scopes")
# The ExecutionConfig fields an agent's limits may use: counters that add up
# across the agent's entries. A deadline, a depth or a handoff count do not.
AGENT_FIELDS = ("max_cost_usd", "max_steps", "max_tokens", "max_retries_total", "max_repeats")
_limited_in_code = False  # set once any agent(..., config=...) exists: the hot path looks
_MAX_NAME = 256
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_MAX_PAIRS = 1024  # bounded memory: chains with many agents forget the oldest pairs
_tracer = trace.get_tracer("veronica_otel", __version__)


def limits_in_code() -> bool:
    """Whether any ``agent(name, config=...)`` was made (else no scope has limits)."""
    return _limited_in_code


def agent_limits(config: ExecutionConfig, argument: str = "config") -> Limits:
    """``config`` as an agent's ledger limits; ValueError for a field agents cannot use."""
    if not isinstance(config, ExecutionConfig):
        raise TypeError(f"{argument} must be an ExecutionConfig, got {config!r}")
    for name in ("timeout_ms", "max_depth", "max_handoffs", "reservation_wait_s"):
        if getattr(config, name) is not None:
            raise ValueError(
                f"{argument}.{name} does not apply to an agent (an agent's limits add up "
                f"across its entries: {', '.join(AGENT_FIELDS)}), got {getattr(config, name)!r}"
            )
    cost = config.max_cost_usd
    return Limits(
        cost_nano=None if cost is None else usd_to_nano(cost),
        steps=config.max_steps,
        retries=config.max_retries_total,
        tokens=config.max_tokens,
        repeats=config.max_repeats,
    )


def agent_scopes() -> object:
    """The enclosing agent scopes as one immutable value (None when none):
    the same object for as long as the same scopes enclose the code."""
    return otel_context.get_value(_SCOPES_KEY)


def bound_agents(
    lookups: tuple[Callable[[str], Limits | None], ...], scopes: Any = None
) -> tuple[tuple[str, Limits], ...]:
    """The limited agents the running code acts for, outer first.

    Each enclosing :func:`agent` scope (its own ``config``, else the first of
    ``lookups`` that knows the name: the chain's policy files), then the
    current span's ``gen_ai.agent.name`` when no scope named it. A name that
    appears twice is bound once, by the tighter of each limit. ``scopes``:
    :func:`agent_scopes`, when the caller read it already.
    """
    if scopes is None:
        scopes = otel_context.get_value(_SCOPES_KEY)
    found: dict[str, Limits] = {}
    named: set[str] = set()
    if scopes:
        for name, own in scopes:
            named.add(name)
            limits = own if own is not None else _lookup(lookups, name)
            if limits is not None:
                known = found.get(name)
                found[name] = limits if known is None else _tighter(known, limits)
    if lookups:
        attributes: Any = getattr(trace.get_current_span(), "attributes", None)
        if attributes:
            value = attributes.get(GEN_AI_AGENT_NAME)
            if isinstance(value, str) and value and value not in named:
                limits = _lookup(lookups, value)
                if limits is not None:
                    found[value] = limits
    return tuple(found.items())


def _lookup(lookups: tuple[Callable[[str], Limits | None], ...], name: str) -> Limits | None:
    for lookup in lookups:
        limits = lookup(name)
        if limits is not None:
            return limits
    return None


def _tighter(a: Limits, b: Limits) -> Limits:
    def low(x: int | None, y: int | None) -> int | None:
        return y if x is None else x if y is None else min(x, y)

    return Limits(
        low(a.cost_nano, b.cost_nano),
        low(a.steps, b.steps),
        low(a.retries, b.retries),
        low(a.tokens, b.tokens),
        low(a.repeats, b.repeats),
    )


def current_agent() -> str | None:
    """The agent the running code acts for, or None when unknown."""
    name = otel_context.get_value(_AGENT_KEY)
    if name is not None:
        return name  # type: ignore[return-value]
    attributes: Any = getattr(trace.get_current_span(), "attributes", None)
    if attributes:
        value = attributes.get(GEN_AI_AGENT_NAME)
        if isinstance(value, str) and value:
            return value
    return None


def check_agent_name(name: object) -> str:
    """``name`` if it can name an agent, else ValueError naming ``name`` and the value.

    It must be a non-empty string of at most 256 characters that encodes as
    UTF-8 (a lone surrogate would make every call under it fail) and holds no
    control character (it goes into span names, log lines and ledger ids).
    """
    if not isinstance(name, str) or not name.strip() or len(name) > _MAX_NAME:
        raise ValueError(f"agent name must be a non-empty string of at most 256, got {name!r}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"agent name must encode as UTF-8 (no lone surrogate), got {name!r}"
        ) from None
    if _CONTROL.search(name) is not None:
        raise ValueError(f"agent name must hold no control character, got {name!r}")
    return name


class AgentScope(AsyncFromSync):
    """The code inside acts for one named agent (see :func:`agent`)."""

    __slots__ = ("_tokens", "config", "limits", "name")

    def __init__(self, name: str, config: ExecutionConfig | None = None) -> None:
        global _limited_in_code
        self.name = check_agent_name(name)
        self.config = config
        self.limits = None if config is None else agent_limits(config)
        if self.limits is not None:
            _limited_in_code = True
        self._tokens: list[tuple[object, trace.Span]] = []

    def __enter__(self) -> AgentScope:
        span = _tracer.start_span(
            f"invoke_agent {self.name}",
            kind=trace.SpanKind.INTERNAL,
            attributes={GEN_AI_OPERATION_NAME: "invoke_agent", GEN_AI_AGENT_NAME: self.name},
        )
        ctx = otel_context.set_value(_AGENT_KEY, self.name, trace.set_span_in_context(span))
        scopes: Any = otel_context.get_value(_SCOPES_KEY, ctx) or ()
        ctx = otel_context.set_value(_SCOPES_KEY, (*scopes, (self.name, self.limits)), ctx)
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


def agent(name: str, config: ExecutionConfig | None = None) -> AgentScope:
    """Act as agent ``name`` inside a ``with`` (or ``async with``) block.

    Calls made inside are attributed to the agent (for the chain's
    ``max_handoffs`` ceiling) and run under an ``invoke_agent {name}`` span,
    so the execution graph shows which agent made them.

    With ``config``, everything done under ``name`` in the current chain
    (counted from the chain's root, across every entry of this name and in
    sub-agent chains) is bounded by ``config``'s ``max_cost_usd``,
    ``max_steps``, ``max_tokens``, ``max_retries_total`` and ``max_repeats``:
    exhausting them denies this agent's further calls
    (``BudgetExceededError.agent`` is ``name``) while the chain and its other
    agents go on. Nested agents are each bound. Without ``config``, a policy
    file's ``[agents."name"]`` applies, if the chain follows one.

    Raises:
        ValueError: ``name`` is empty or too long, or ``config`` sets
            ``timeout_ms``, ``max_depth`` or ``max_handoffs``.
        TypeError: ``config`` is not an ExecutionConfig.
    """
    return AgentScope(name, config)


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
