"""Per-agent limits as ledger levels: one more level on a call's path per limited agent.

An agent's counters live in the ledger like a chain's, under the id
``<root chain id>:agent/<name, percent-encoded>``: the text up to the first
``.`` or ``:`` is the root's, so on Redis the level shares the chain tree's
hash tag (one slot, one script, Redis Cluster included), and ``/`` never
occurs in a chain id, so no chain can collide with an agent. A call made for
limited agents is reserved in its chain path *and* each agent's level in the
ledger's one atomic step; a denial by an agent level is stored (sticky) on
that level only, so the agent stays stopped while the chain and its other
agents go on.

Counters are per root chain: a sub-agent chain's calls under ``researcher``
count in its root's ``researcher`` too, as its spending counts in the root.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol
from urllib.parse import quote

from ._agents import agent_scopes, bound_agents
from ._errors import TripEvent
from ._fork import remake_locks_after_fork
from ._ledger import Ledger, Level, Limits, LocalLedger

if TYPE_CHECKING:
    from ._policy import PolicyPipeline


class _Root(Protocol):
    """What agent levels keep of their root chain's state (so this module does not import it)."""

    @property
    def chain_id(self) -> str: ...

    @property
    def ledger(self) -> Ledger: ...


__all__ = ["AgentLevels", "agent_level_id", "lookups_of"]

_MAX_CACHED = 1024  # (name, limits) pairs kept as Level objects per root chain
Lookup = Callable[[str], "Limits | None"]


def agent_level_id(root_chain_id: str, name: str) -> str:
    """The ledger id of agent ``name``'s counters in the tree of ``root_chain_id``."""
    return f"{root_chain_id}:agent/{quote(name, safe='')}"


def lookups_of(pipeline: PolicyPipeline) -> tuple[Lookup, ...]:
    """The ``agent_limits`` of the pipeline's policies that know agents by name
    (a :class:`FilePolicy`'s ``[agents]``)."""
    return tuple(
        p.agent_limits  # type: ignore[attr-defined]
        for p in pipeline.policies
        if callable(getattr(p, "agent_limits", None))
    )


class AgentLevels:
    """The agent levels of one chain tree (shared by its in-process contexts).

    The root context owns it: on a :class:`LocalLedger` each agent level is
    held (``acquire``) until the root context is garbage, like the chain's own.
    """

    __slots__ = (
        "__weakref__",
        "_cache",
        "_holder",
        "_last",
        "_ledger",
        "_lock",
        "_names",
        "_root",
        "_tripped",
    )

    def __init__(self, root: _Root) -> None:
        self._root = root.chain_id
        self._ledger = root.ledger
        self._holder = weakref.ref(root)
        self._lock = threading.Lock()
        remake_locks_after_fork(self)  # a parent thread may hold it at fork
        self._cache: dict[tuple[str, Limits], Level] = {}
        self._names: dict[str, str] = {}  # level id -> agent name
        self._tripped: set[str] = set()  # level ids whose sticky trip was announced
        # Limits from code alone depend on the scopes only: the last answer, by identity.
        self._last: tuple[object, tuple[Level, ...], tuple[tuple[Level, ...], str] | None] = (
            self,
            (),
            None,
        )

    def path(
        self, base: tuple[Level, ...], lookups: tuple[Lookup, ...]
    ) -> tuple[tuple[Level, ...], str] | None:
        """``base`` plus the levels of the limited agents acting now, and the
        innermost agent's name; None when no agent limit applies."""
        scopes = agent_scopes()
        if not lookups:
            last = self._last
            if last[0] is scopes and last[1] is base:
                return last[2]
        bound = bound_agents(lookups, scopes)
        result: tuple[tuple[Level, ...], str] | None = None
        if bound:
            levels = tuple(self._level(name, limits) for name, limits in bound)
            result = (*base, *levels), bound[-1][0]
        if not lookups:
            self._last = (scopes, base, result)
        return result

    def _level(self, name: str, limits: Limits) -> Level:
        key = (name, limits)
        level = self._cache.get(key)
        if level is not None:
            return level
        level_id = agent_level_id(self._root, name)
        level = Level(level_id, limits)
        with self._lock:
            if level_id not in self._names:
                self._names[level_id] = name
                holder = self._holder()
                if isinstance(self._ledger, LocalLedger) and holder is not None:
                    self._ledger.acquire(level_id)
                    weakref.finalize(holder, self._ledger.discard, level_id)
            if len(self._cache) >= _MAX_CACHED:
                self._cache.clear()
            self._cache[key] = level
        return level

    def adopt(self, root: _Root) -> AgentLevels:
        """Carry these agents' counters over to ``root``, a context replacing the
        root under the same chain id (a policy reload rebuilding the default chain)."""
        with self._lock:
            if isinstance(self._ledger, LocalLedger):
                for level_id in self._names:
                    self._ledger.acquire(level_id)
                    weakref.finalize(root, self._ledger.discard, level_id)
            self._holder = weakref.ref(root)
        return self

    def denial(self, trip: TripEvent, chain_id: str) -> tuple[TripEvent, bool] | None:
        """``trip`` as the agent's own denial in chain ``chain_id`` and whether
        it is news (announce it); None when no agent level made ``trip``."""
        name = self._names.get(trip.chain_id)
        if name is None:
            return None
        event = dataclasses.replace(
            trip,
            chain_id=chain_id,
            agent=name,
            message=trip.message.replace(
                f"chain {trip.chain_id}", f"agent {name!r} of chain {chain_id}", 1
            ),
        )
        if not trip.sticky:
            return event, True
        with self._lock:
            news = trip.chain_id not in self._tripped
            self._tripped.add(trip.chain_id)
        return event, news
