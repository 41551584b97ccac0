"""veronica-otel: chain-level containment for LLM agents, inside OpenTelemetry.

Every LLM or tool call made in a chain is checked *before* it is sent: cost
(reserved at its worst case), steps, retries across all layers, tokens,
wall-clock, repeated calls, depth and circuit breakers. A call that does not
fit is never sent; :class:`BudgetExceededError` is raised instead (or
``Decision.HALT`` returned by the ``wrap_*`` functions).

Usage::

    from veronica_otel import ExecutionConfig, ExecutionContext, WrapOptions

    with ExecutionContext(config=ExecutionConfig(max_cost_usd=1.0, max_steps=50)) as ctx:
        ctx.wrap_llm_call(call_model, WrapOptions(cost_estimate_hint=0.01))
"""

import logging as _logging

from ._agents import agent
from ._breaker import CircuitBreaker, CircuitState
from ._config import ExecutionConfig
from ._context import CallHandle, ExecutionContext
from ._errors import BudgetExceededError, TripEvent
from ._guards import AgentStepGuard, BudgetEnforcer, LoopGuard
from ._ledger import Ledger, LocalLedger
from ._notice import StderrFallback
from ._options import ChainSnapshot, Decision, WrapOptions
from ._policy import PolicyContext, PolicyDecision, PolicyPipeline, RuntimePolicy
from ._pools import BudgetPool, PoolSnapshot
from ._pricing import PriceTable, UnitPrices
from ._propagation import current_context
from ._retry import RetryContainer
from ._tools import ToolCall, contained_tool, set_tool_prices
from ._version import __version__

# Warnings reach stderr while the app has configured no logging (_notice).
_logging.getLogger("veronica_otel").addHandler(StderrFallback())

__all__ = [
    "AgentStepGuard",
    "BudgetEnforcer",
    "BudgetExceededError",
    "BudgetPool",
    "CallHandle",
    "ChainSnapshot",
    "CircuitBreaker",
    "CircuitState",
    "Decision",
    "ExecutionConfig",
    "ExecutionContext",
    "Ledger",
    "LocalLedger",
    "LoopGuard",
    "PolicyContext",
    "PolicyDecision",
    "PolicyPipeline",
    "PoolSnapshot",
    "PriceTable",
    "RetryContainer",
    "RuntimePolicy",
    "ToolCall",
    "TripEvent",
    "UnitPrices",
    "WrapOptions",
    "__version__",
    "agent",
    "contained_tool",
    "current_context",
    "set_tool_prices",
]
