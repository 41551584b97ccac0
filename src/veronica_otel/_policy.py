"""The policy protocol and the pipeline that composes policies.

:class:`PolicyPipeline` evaluates policies in order and the first denial wins;
there is no override path inside it. Policies that hold a resource between
``check`` and the call's outcome (a breaker's half-open probe slot, a
reservation) get it back through the optional hooks ``on_success``,
``on_failure`` and ``on_abandon``: the pipeline calls ``on_abandon`` on every
policy that allowed a call that a later policy (or the ledger) then denied.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ._errors import REASONS, TripReason

__all__ = ["PolicyContext", "PolicyDecision", "PolicyPipeline", "RuntimePolicy"]

_logger = logging.getLogger(__name__)

# Built-in policy types and the trip reason their denials carry.
_REASON_BY_POLICY: dict[str, TripReason] = {
    "budget": "cost",
    "step_guard": "steps",
    "circuit_breaker": "circuit_open",
    "retry": "retries",
    "loop_guard": "loop",
    "timeout": "timeout",
    "tokens": "tokens",
    "depth": "depth",
}


@dataclass(slots=True)
class PolicyContext:
    """What a policy sees about the call about to be made.

    Attributes:
        chain_id: The chain making the call.
        kind: ``"llm"`` or ``"tool"``.
        operation_name: The call's name (``"chat"``, a tool name, ...).
        provider: Provider id when known (``"openai"``).
        model: Requested model when known.
        cost_usd: The chain's committed cost so far.
        step_count: The chain's steps so far.
        estimated_cost_usd: What this call reserves.
        signature: A digest of the call's inputs (for loop detection).
        actual_cost_usd: Filled in after the call, before ``on_success``.
        timestamp: ``time.time()`` when the context was built.
        metadata: Free-form extra data.
        step: Whether the call counts a step of its own: False for an
            instrumented LLM call that joined the ``wrap_llm_call`` around it,
            whose step the wrap already counted (a step policy lets it pass
            uncounted).
    """

    chain_id: str = ""
    kind: str = "llm"
    operation_name: str = ""
    provider: str | None = None
    model: str | None = None
    cost_usd: float = 0.0
    step_count: int = 0
    estimated_cost_usd: float = 0.0
    signature: str | None = None
    actual_cost_usd: float = 0.0
    timestamp: float = field(default_factory=time.time)
    metadata: dict[str, Any] = field(default_factory=dict)
    step: bool = True


@dataclass(frozen=True, slots=True)
class PolicyDecision:
    """A policy's answer: allow, allow with a degradation, or deny.

    Attributes:
        allowed: Whether the call may run.
        policy_type: Which policy decided.
        reason: A sentence explaining a denial or degradation.
        trip_reason: The :class:`BudgetExceededError` reason of a denial
            (defaults from ``policy_type`` for the built-in policies).
        limit: The ceiling behind a denial, when there is one.
        observed: The value that crossed it.
        partial_result: Anything a policy wants to hand back to the caller.
        degradation_action: Name of a degradation applied instead of a denial.
        fallback_model: Send the call to this model instead.
        rate_limit_ms: Wait this long before sending.
        max_tokens: Clamp the call's output tokens to this.
    """

    allowed: bool
    policy_type: str
    reason: str = ""
    trip_reason: TripReason | None = None
    limit: float = 0.0
    observed: float = 0.0
    partial_result: Any = None
    degradation_action: str | None = None
    fallback_model: str | None = None
    rate_limit_ms: int = 0
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.trip_reason is not None and self.trip_reason not in REASONS:
            raise ValueError(
                f"trip_reason must be one of {sorted(REASONS)}, got {self.trip_reason!r}"
            )
        if not self.allowed and self.trip_reason is None:
            reason = _REASON_BY_POLICY.get(self.policy_type)
            if reason is None:
                raise ValueError(
                    f"a denial from policy {self.policy_type!r} must name trip_reason "
                    f"(one of {sorted(REASONS)})"
                )
            object.__setattr__(self, "trip_reason", reason)
        if isinstance(self.rate_limit_ms, bool) or self.rate_limit_ms < 0:
            raise ValueError(
                f"rate_limit_ms must be a non-negative int, got {self.rate_limit_ms!r}"
            )
        if self.max_tokens is not None and (
            isinstance(self.max_tokens, bool) or self.max_tokens < 0
        ):
            raise ValueError(f"max_tokens must be a non-negative int, got {self.max_tokens!r}")

    @property
    def degraded(self) -> bool:
        """True when the call may run but changed (model, rate or tokens)."""
        return (
            self.fallback_model is not None or self.rate_limit_ms > 0 or self.max_tokens is not None
        )


ALLOW = PolicyDecision(True, "pipeline")


@runtime_checkable
class RuntimePolicy(Protocol):
    """A containment policy. ``check`` must be cheap and must not block."""

    def check(self, context: PolicyContext) -> PolicyDecision: ...

    def reset(self) -> None: ...

    @property
    def policy_type(self) -> str: ...


_Hook = Callable[[PolicyContext], None]


class PolicyPipeline:
    """Runs policies in order; the first denial wins.

    Degradations from allowing policies are merged: the first fallback model,
    the smallest token clamp and the longest rate-limit wait.
    """

    def __init__(self, policies: Iterable[RuntimePolicy] = ()) -> None:
        self._policies: tuple[RuntimePolicy, ...] = tuple(policies)
        for policy in self._policies:
            if not isinstance(policy, RuntimePolicy):
                raise TypeError(f"{policy!r} does not implement RuntimePolicy")
        self._abandon: dict[int, _Hook] = {
            id(p): p.on_abandon for p in self._policies if hasattr(p, "on_abandon")
        }

    @property
    def policies(self) -> tuple[RuntimePolicy, ...]:
        return self._policies

    def __len__(self) -> int:
        return len(self._policies)

    def __bool__(self) -> bool:
        return bool(self._policies)

    def evaluate(self, context: PolicyContext) -> PolicyDecision:
        """Return the first denial, or an allow carrying merged degradations."""
        merged = ALLOW
        passed: list[RuntimePolicy] = []
        for policy in self._policies:
            decision = policy.check(context)
            if not decision.allowed:
                self._abandon_all(passed, context)
                return decision
            passed.append(policy)
            if decision.degraded:
                merged = _merge(merged, decision)
        return merged

    def abandon(self, context: PolicyContext) -> None:
        """Tell every policy that the allowed call was not sent after all."""
        self._abandon_all(self._policies, context)

    def record_success(self, context: PolicyContext) -> None:
        """Feed a successful outcome to policies that track outcomes."""
        for policy in self._policies:
            hook = getattr(policy, "on_success", None)
            if hook is not None:
                _guarded(hook, context)

    def record_failure(self, context: PolicyContext, error: BaseException) -> None:
        """Feed a failed outcome to policies that track outcomes."""
        for policy in self._policies:
            hook = getattr(policy, "on_failure", None)
            if hook is not None:
                _guarded(hook, context, error)

    def reset(self) -> None:
        for policy in self._policies:
            policy.reset()

    def _abandon_all(self, policies: Iterable[RuntimePolicy], context: PolicyContext) -> None:
        for policy in policies:
            hook = self._abandon.get(id(policy))
            if hook is not None:
                _guarded(hook, context)


def _merge(a: PolicyDecision, b: PolicyDecision) -> PolicyDecision:
    tokens = [t for t in (a.max_tokens, b.max_tokens) if t is not None]
    return PolicyDecision(
        True,
        b.policy_type if a.policy_type == "pipeline" else a.policy_type,
        reason="; ".join(r for r in (a.reason, b.reason) if r),
        degradation_action=a.degradation_action or b.degradation_action,
        fallback_model=a.fallback_model or b.fallback_model,
        rate_limit_ms=max(a.rate_limit_ms, b.rate_limit_ms),
        max_tokens=min(tokens) if tokens else None,
    )


def _guarded(hook: Callable[..., object], *args: object) -> None:
    try:
        hook(*args)
    except Exception:
        _logger.exception("policy hook %r failed", hook)
