"""FilePolicy: a policy file's per-model and per-tool rules as a RuntimePolicy.

A call is matched against the current version of the file on every check,
so a reloaded file applies to the next call. Model rules match the requested
model by ``"provider:model"`` and by ``"model"`` (ignoring case) and *all*
matching rules apply; when one sends the call to a ``fallback`` model, that
model's own ``max_tokens`` and ``max_calls`` apply too, because that is the
model the call reaches. Tool rules match a tool call's name exactly.

``max_calls`` is counted per chain, check-before-increment under one lock,
so ``limit + 1`` calls never pass however many threads call. A sub-agent's
chain id extends its parent's (``a`` -> ``a.1``), so its calls count in its
parent too, as the ledger counts its steps. Counts are per process and kept
for the :data:`MAX_CHAINS` most recently used chains; a call that is then
abandoned (a later policy or the ledger denied it) gives its count back.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from ._agents import agent_limits
from ._ledger import Limits
from ._policy import PolicyContext, PolicyDecision
from ._policy_schema import ModelRule, PolicySpec

__all__ = ["MAX_CHAINS", "FilePolicy", "PolicySource"]

POLICY_TYPE = "policy_file"
MAX_CHAINS = 10_000
_MAX_PLANS = 10_000  # distinct (tool, provider, model) per version; past it, plan uncached
_MAX_PENDING = 100_000  # admitted calls awaiting their outcome; oldest forgotten past it
_ALLOW = PolicyDecision(True, POLICY_TYPE)

Counter = tuple[str, str]  # ("model" | "tool", rule key)


class PolicySource(Protocol):
    """Where :class:`FilePolicy` reads the current rules (a ``PolicyFile``)."""

    def snapshot(self) -> tuple[int, PolicySpec]:
        """The current version number and its rules."""
        ...


@dataclass(frozen=True, slots=True)
class _Limit:
    counter: Counter
    limit: int
    rule: str  # the key path named in a denial


@dataclass(frozen=True, slots=True)
class _Plan:
    decision: PolicyDecision  # what an admitted call gets (allow, or a degradation)
    limits: tuple[_Limit, ...]


_PlanKey = tuple[str | None, str | None, str | None]  # (tool, provider, model)


class FilePolicy:
    """Enforces a policy file's ``[models]`` and ``[tools]`` rules.

    A chain whose pipeline holds one also takes its ``[agents]`` limits
    (:meth:`agent_limits`) for the agents its calls are made for.

    Args:
        source: The rules, usually a :class:`~veronica_otel.policy_file.PolicyFile`;
            each check reads its current version.
    """

    policy_type = POLICY_TYPE

    def __init__(self, source: PolicySource) -> None:
        if not callable(getattr(source, "snapshot", None)):
            raise TypeError(f"source must be a PolicyFile, got {source!r}")
        self._source = source
        self._lock = threading.Lock()
        self._counts: OrderedDict[str, dict[Counter, int]] = OrderedDict()
        self._pending: dict[int, tuple[tuple[str, Counter], ...]] = {}
        self._plans: tuple[int, dict[_PlanKey, _Plan]] = (-1, {})
        self._agents: tuple[int, dict[str, Limits | None]] = (-1, {})

    def check(self, context: PolicyContext) -> PolicyDecision:
        """Allow, degrade (fallback model, token clamp) or deny one call."""
        tool = context.operation_name if context.kind == "tool" else None
        if tool is None and context.model is None:
            return _ALLOW
        version, spec = self._source.snapshot()
        plans = self._plans
        if plans[0] != version:
            plans = self._plans = (version, {})
        key = (tool, context.provider, context.model)
        plan = plans[1].get(key)
        if plan is None:
            plan = _plan(spec, *key)
            if len(plans[1]) < _MAX_PLANS:
                plans[1][key] = plan
        if not plan.limits:
            return plan.decision
        return self._count(context, plan)

    def agent_limits(self, name: str) -> Limits | None:
        """The current version's ``[agents."name"]`` limits, or None.

        Read by the chain before each call made for a named agent, so a
        reloaded file applies to the next call.
        """
        version, spec = self._source.snapshot()
        cached = self._agents
        if cached[0] != version:
            cached = self._agents = (version, {})
        if name in cached[1]:
            return cached[1][name]
        config = spec.agents.get(name)
        limits = None if config is None else agent_limits(config, f'agents."{name}"')
        if len(cached[1]) < _MAX_PLANS:
            cached[1][name] = limits
        return limits

    def count(self, chain_id: str, kind: str, name: str) -> int:
        """Calls counted for ``chain_id`` under the ``kind`` ("model"/"tool") rule ``name``."""
        key = name.lower() if kind == "model" else name
        with self._lock:
            return self._counts.get(chain_id, {}).get((kind, key), 0)

    def on_success(self, context: PolicyContext) -> None:
        with self._lock:
            self._pending.pop(id(context), None)

    def on_failure(self, context: PolicyContext, error: BaseException) -> None:
        self.on_success(context)

    def on_abandon(self, context: PolicyContext) -> None:
        """Give back what ``check`` counted for a call that was not sent."""
        with self._lock:
            for chain, counter in self._pending.pop(id(context), ()):
                counts = self._counts.get(chain)
                if counts is not None and counts.get(counter, 0) > 0:
                    counts[counter] -= 1

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
            self._pending.clear()

    def _count(self, context: PolicyContext, plan: _Plan) -> PolicyDecision:
        chains = _chain_levels(context.chain_id)
        with self._lock:
            for chain in chains:
                counts = self._counts.get(chain)
                for limit in plan.limits:
                    seen = counts.get(limit.counter, 0) if counts is not None else 0
                    if seen >= limit.limit:
                        return PolicyDecision(
                            False,
                            POLICY_TYPE,
                            f"{limit.rule} = {limit.limit} reached in chain {chain}",
                            trip_reason="steps",
                            limit=float(limit.limit),
                            observed=float(seen + 1),
                        )
            taken: list[tuple[str, Counter]] = []
            for chain in chains:
                counts = self._counts.get(chain)
                if counts is None:
                    counts = self._counts[chain] = {}
                else:
                    self._counts.move_to_end(chain)
                for limit in plan.limits:
                    counts[limit.counter] = counts.get(limit.counter, 0) + 1
                    taken.append((chain, limit.counter))
            while len(self._counts) > MAX_CHAINS:
                self._counts.popitem(last=False)
            self._pending[id(context)] = tuple(taken)
            if len(self._pending) > _MAX_PENDING:  # outcomes never reported: forget (no refund)
                del self._pending[next(iter(self._pending))]
        return plan.decision


def _chain_levels(chain_id: str) -> tuple[str, ...]:
    """``"a.1.2"`` -> ``("a", "a.1", "a.1.2")``: the chain and its ancestors."""
    if "." not in chain_id:
        return (chain_id,)
    parts = chain_id.split(".")
    return tuple(".".join(parts[: i + 1]) for i in range(len(parts)))


def _matching(models: Mapping[str, ModelRule], provider: str | None, model: str) -> list[ModelRule]:
    name = model.strip().lower()
    prov = (provider or "").strip().lower()
    keys = [f"{prov}:{name}", name] if prov else [name]
    return [models[k] for k in keys if k in models]


def _plan(spec: PolicySpec, tool: str | None, provider: str | None, model: str | None) -> _Plan:
    limits: list[_Limit] = []
    tool_rule = spec.tools.get(tool) if tool is not None else None
    if tool_rule is not None and tool_rule.max_calls is not None:
        rule = f"{tool_rule.path}.max_calls"
        limits.append(_Limit(("tool", tool_rule.name), tool_rule.max_calls, rule))
    if model is None or not spec.models:
        return _Plan(_ALLOW, tuple(limits))
    rules = _matching(spec.models, provider, model)
    fallback_rule = next((r for r in rules if r.fallback is not None), None)
    fallback = fallback_rule.fallback if fallback_rule is not None else None
    if fallback is not None:
        rules += [r for r in _matching(spec.models, provider, fallback) if r not in rules]
    limits += [
        _Limit(("model", r.key), r.max_calls, f"{r.path}.max_calls")
        for r in rules
        if r.max_calls is not None
    ]
    clamps = [r for r in rules if r.max_tokens is not None]
    tokens_rule = min(clamps, key=lambda r: r.max_tokens or 0) if clamps else None
    if fallback_rule is None and tokens_rule is None:
        return _Plan(_ALLOW, tuple(limits))
    reasons = []
    if fallback_rule is not None:
        reasons.append(f"{fallback_rule.path}.fallback = {json.dumps(fallback)}")
    if tokens_rule is not None:
        reasons.append(f"{tokens_rule.path}.max_tokens = {tokens_rule.max_tokens}")
    decision = PolicyDecision(
        True,
        POLICY_TYPE,
        "; ".join(reasons),
        degradation_action="fallback_model" if fallback is not None else "max_tokens",
        fallback_model=fallback,
        max_tokens=tokens_rule.max_tokens if tokens_rule is not None else None,
    )
    return _Plan(decision, tuple(limits))
