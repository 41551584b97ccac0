"""Budget pools whose limits come from a policy file's ``[pools]`` tables.

A :class:`FilePool` is a :class:`BudgetPool` that re-reads its limits from
the file's current version whenever a ledger asks for them (each
reservation reads ``pool.level``): a hot reload applies new limits, or a new
window, from the next call. Nothing global is mutated: the pool's counters
stay in the ledger, keyed by its name, and only the limits it reports change.
A reload that removes the pool's table keeps the last limits it had (a
budget never silently disappears) and logs a WARNING once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from ._ledger import Ledger
from ._policy_schema import PolicySpec, PoolRule
from ._pools import BudgetPool, PoolLimits, pool_limits

__all__ = ["POOLS_ENV", "FilePool", "file_pool_limits", "parse_pool_names", "pools_from_env"]

_logger = logging.getLogger("veronica_otel.policy_file")


class PolicySource(Protocol):
    """What a file pool reads of its :class:`~veronica_otel.PolicyFile` (a protocol,
    so this module does not import the policy file back)."""

    @property
    def path(self) -> Path: ...

    def snapshot(self) -> tuple[int, PolicySpec]: ...


def file_pool_limits(rule: PoolRule) -> PoolLimits:
    """A validated ``[pools."name"]`` table as pool limits."""
    return pool_limits(rule.name, rule.max_cost_usd, rule.max_steps, rule.max_tokens, rule.window)


class FilePool(BudgetPool):
    """A pool named in ``policy_file``'s ``[pools]``, following its reloads.

    Made by :meth:`PolicyFile.pool`; raises ValueError when the file's
    current version does not define ``name``.
    """

    __slots__ = ("_file", "_version")

    def __init__(
        self, policy_file: PolicySource, name: str, *, ledger: Ledger | None = None
    ) -> None:
        version, spec = policy_file.snapshot()
        rule = spec.pools.get(name)
        if rule is None:
            known = ", ".join(repr(n) for n in spec.pools) or "none"
            raise ValueError(
                f"pool {name!r} is not defined in policy file {policy_file.path} "
                f"(its [pools] define: {known})"
            )
        super().__init__(
            name,
            max_cost_usd=rule.max_cost_usd,
            max_steps=rule.max_steps,
            max_tokens=rule.max_tokens,
            window=rule.window,
            ledger=ledger,
        )
        self._file = policy_file
        self._version = version

    @property
    def policy_file(self) -> PolicySource:
        return self._file

    def _current(self) -> PoolLimits:
        version, spec = self._file.snapshot()
        if version == self._version:  # the common case: one comparison
            return self._limits
        rule = spec.pools.get(self.name)
        if rule is None:
            _logger.warning(
                "veronica-otel: policy file %s (version %d) no longer defines pool %r; "
                "it keeps its last limits",
                self._file.path,
                version,
                self.name,
            )
        else:
            self._limits = file_pool_limits(rule)  # one attribute: never half-updated
        self._version = version
        return self._limits


POOLS_ENV = "VERONICA_POOLS"


def parse_pool_names(raw: str, variable: str = POOLS_ENV) -> tuple[str, ...]:
    """Pool names from a comma-separated list (``"tenant:acme,user:alice"``).

    Raises:
        ValueError: An empty entry, a name that is not a valid pool name, a
            name listed twice or more names than a chain may use (naming
            ``variable`` and the entry).
    """
    from ._pools import MAX_POOLS_PER_CHAIN, check_pool_name

    if not raw.strip():
        return ()
    names: list[str] = []
    for item in raw.split(","):
        name = item.strip()
        if not name:
            raise ValueError(f"{variable}={_short(raw)}: has an empty entry (expected name,name)")
        try:
            check_pool_name(name)
        except ValueError:
            raise ValueError(
                f"{variable}={_short(raw)}: {_short(name)} is not a pool name "
                "(1-128 letters, digits or -_.:@/)"
            ) from None
        if name in names:
            raise ValueError(f"{variable}={_short(raw)}: lists pool {name!r} twice")
        names.append(name)
    if len(names) > MAX_POOLS_PER_CHAIN:
        raise ValueError(
            f"{variable}: lists {len(names)} pools; a chain may use at most {MAX_POOLS_PER_CHAIN}"
        )
    return tuple(names)


def pools_from_env(
    environ: Mapping[str, str], policy_file: PolicySource | None, ledger: Ledger | None
) -> tuple[BudgetPool, ...]:
    """The pools ``VERONICA_POOLS`` names, with limits from ``policy_file``'s ``[pools]``.

    Raises:
        ValueError: The list is malformed, names a pool the file does not
            define, is set without a policy file, or ``ledger`` cannot hold
            pools (naming the variable).
    """
    names = parse_pool_names(environ.get(POOLS_ENV, ""))
    if not names:
        return ()
    if policy_file is None:
        raise ValueError(
            f"{POOLS_ENV} is set but VERONICA_POLICY_FILE is not: a pool's limits come from "
            'the policy file\'s [pools."name"] tables'
        )
    pools: list[BudgetPool] = []
    for name in names:
        try:
            pools.append(FilePool(policy_file, name, ledger=ledger))
        except (ValueError, TypeError) as exc:  # TypeError: a ledger without pools
            raise ValueError(f"{POOLS_ENV}: {exc}") from None
    return tuple(pools)


def _short(text: str) -> str:
    return repr(text) if len(text) <= 80 else repr(text[:77]) + "..."
