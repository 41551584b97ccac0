"""Stand-alone counting policies: BudgetEnforcer, AgentStepGuard, LoopGuard.

Each works on its own (``spend``, ``step``, ``observe``) and as a
:class:`RuntimePolicy` in a pipeline. Counting is check-before-increment under
a lock, so ``limit + 1`` never happens however many threads call it. What a
``check`` charged for a call that is then abandoned is given back.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from ._ledger import SIGNATURE_MEMORY
from ._policy import PolicyContext, PolicyDecision
from ._units import check_count, check_usd, nano_to_usd, usd_to_nano

__all__ = ["AgentStepGuard", "BudgetEnforcer", "LoopGuard"]

_ALLOW_BUDGET = PolicyDecision(True, "budget")
_ALLOW_STEP = PolicyDecision(True, "step_guard")
_ALLOW_LOOP = PolicyDecision(True, "loop_guard")


class BudgetEnforcer:
    """A USD ceiling of its own, counted in integer nano-USD.

    As a policy it reserves ``estimated_cost_usd`` in ``check``, commits
    ``actual_cost_usd`` on success and releases on failure or abandonment.
    """

    policy_type = "budget"

    def __init__(self, limit_usd: float) -> None:
        self._limit = usd_to_nano(check_usd("limit_usd", limit_usd))
        self._lock = threading.Lock()
        self._spent = 0
        self._reserved = 0
        self._pending: dict[int, int] = {}
        self._exceeded = False

    @property
    def limit_usd(self) -> float:
        return nano_to_usd(self._limit)

    @property
    def spent_usd(self) -> float:
        return nano_to_usd(self._spent)

    @property
    def exceeded(self) -> bool:
        return self._exceeded

    def spend(self, amount_usd: float) -> bool:
        """Charge ``amount_usd`` if it fits; otherwise mark exceeded, return False."""
        amount = usd_to_nano(check_usd("amount_usd", amount_usd))
        with self._lock:
            if self._exceeded or self._spent + self._reserved + amount > self._limit:
                self._exceeded = True
                return False
            self._spent += amount
            return True

    def check(self, context: PolicyContext) -> PolicyDecision:
        amount = usd_to_nano(check_usd("estimated_cost_usd", context.estimated_cost_usd))
        with self._lock:
            projected = self._spent + self._reserved + amount
            if self._exceeded or projected > self._limit:
                self._exceeded = True
                return PolicyDecision(
                    False,
                    self.policy_type,
                    f"budget of {self.limit_usd:g} USD would be exceeded",
                    limit=self.limit_usd,
                    observed=nano_to_usd(projected),
                )
            self._reserved += amount
            self._pending[id(context)] = amount
            return _ALLOW_BUDGET

    def on_success(self, context: PolicyContext) -> None:
        actual = usd_to_nano(check_usd("actual_cost_usd", context.actual_cost_usd))
        with self._lock:
            self._reserved -= self._pending.pop(id(context), 0)
            self._spent += actual
            if self._spent > self._limit:
                self._exceeded = True

    def on_failure(self, context: PolicyContext, error: BaseException) -> None:
        self.on_abandon(context)

    def on_abandon(self, context: PolicyContext) -> None:
        with self._lock:
            self._reserved -= self._pending.pop(id(context), 0)

    def reset(self) -> None:
        with self._lock:
            self._spent = self._reserved = 0
            self._pending.clear()
            self._exceeded = False


class AgentStepGuard:
    """At most ``max_steps`` steps; the step is counted before it runs."""

    policy_type = "step_guard"

    def __init__(self, max_steps: int) -> None:
        self.max_steps = check_count("max_steps", max_steps)
        self._lock = threading.Lock()
        self._steps = 0
        self._pending: set[int] = set()
        self.last_result: Any = None

    @property
    def current_step(self) -> int:
        return self._steps

    def step(self, result: Any = None) -> bool:
        """Take one step if one is left; keep ``result`` as the partial result."""
        with self._lock:
            if self._steps >= self.max_steps:
                return False
            self._steps += 1
            if result is not None:
                self.last_result = result
            return True

    def check(self, context: PolicyContext) -> PolicyDecision:
        if not context.step:  # joined the wrapped call, whose step was counted
            return _ALLOW_STEP
        with self._lock:
            if self._steps >= self.max_steps:
                return PolicyDecision(
                    False,
                    self.policy_type,
                    f"step limit {self.max_steps} reached",
                    limit=self.max_steps,
                    observed=self._steps + 1,
                    partial_result=self.last_result,
                )
            self._steps += 1
            self._pending.add(id(context))
            return _ALLOW_STEP

    def on_success(self, context: PolicyContext) -> None:
        with self._lock:
            self._pending.discard(id(context))

    def on_failure(self, context: PolicyContext, error: BaseException) -> None:
        self.on_success(context)

    def on_abandon(self, context: PolicyContext) -> None:
        with self._lock:
            if id(context) in self._pending:
                self._pending.discard(id(context))
                self._steps -= 1

    def reset(self) -> None:
        with self._lock:
            self._steps = 0
            self._pending.clear()
            self.last_result = None


class LoopGuard:
    """Denies the ``max_repeats + 1``-th call with an identical signature.

    Remembers the most recent :data:`SIGNATURE_MEMORY` distinct signatures,
    so memory stays bounded on chains that never repeat.
    """

    policy_type = "loop_guard"

    def __init__(self, max_repeats: int = 3) -> None:
        self.max_repeats = check_count("max_repeats", max_repeats)
        if self.max_repeats < 1:
            raise ValueError(f"max_repeats must be >= 1, got {max_repeats!r}")
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, int] = OrderedDict()
        self._pending: dict[int, str] = {}

    def count(self, signature: str) -> int:
        """How many times ``signature`` has been admitted."""
        with self._lock:
            return self._seen.get(signature, 0)

    def observe(self, signature: str) -> bool:
        """Count one call with ``signature``; False when it repeats too often."""
        with self._lock:
            return self._admit(signature)

    def check(self, context: PolicyContext) -> PolicyDecision:
        signature = context.signature
        if signature is None:
            return _ALLOW_LOOP
        with self._lock:
            if not self._admit(signature):
                return PolicyDecision(
                    False,
                    self.policy_type,
                    f"call signature repeated more than {self.max_repeats} times",
                    limit=self.max_repeats,
                    observed=self._seen[signature] + 1,
                )
            self._pending[id(context)] = signature
            return _ALLOW_LOOP

    def on_success(self, context: PolicyContext) -> None:
        with self._lock:
            self._pending.pop(id(context), None)

    def on_failure(self, context: PolicyContext, error: BaseException) -> None:
        self.on_success(context)

    def on_abandon(self, context: PolicyContext) -> None:
        with self._lock:
            signature = self._pending.pop(id(context), None)
            if signature is not None and signature in self._seen:
                self._seen[signature] -= 1

    def reset(self) -> None:
        with self._lock:
            self._seen.clear()
            self._pending.clear()

    def _admit(self, signature: str) -> bool:
        seen = self._seen.get(signature, 0)
        if seen >= self.max_repeats:
            return False
        self._seen[signature] = seen + 1
        self._seen.move_to_end(signature)
        if len(self._seen) > SIGNATURE_MEMORY:
            self._seen.popitem(last=False)
        return True
