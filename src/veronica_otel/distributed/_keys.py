"""Key names and script arguments of the shared ledger, computed once and cached.

Every key of one chain tree carries the tree's Redis Cluster hash tag, the
id of its root chain: the text before the first ``.`` or ``:`` (``root`` for
``root.1.2``, as ``spawn_child`` names children, and for ``root:ab12cd``, as
a service joining ``root`` over a shared ledger names its request chain), so
the keys of any path hash to one slot (:func:`tree_tag`). See
``_scripts.py`` for what each key holds.

The kinds of keys are disjoint by construction: a chain's keys are
``{<tree tag>}:c:`` / ``s:`` / ``o:`` + its id and the tree's ``rh`` /
``rz`` / ``ad``; an agent's counters are a level of its root's tree whose
id holds ``:agent/`` (``/`` is in no chain id, see ``_agent_limits``); the
pools' keys carry the tag :data:`POOLS_TAG`, ``:pools``, which no tree tag
can be (a tag ends at the first ``:``, and a chain id cannot start with one);
breakers are ``breaker:<name>``, outside any tag; marks are fields of the
chain hashes, not keys. Pools were under ``{pools}`` in earlier releases (where a
chain named ``pools`` shared their records); see the README on upgrading.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from veronica_otel._ledger import Level

from ._scripts import STORE_MAX

__all__ = ["POOLS_TAG", "ChainKeys", "KeySpace", "tree_tag"]

# The pools' hash tag: no chain tree's tag can be this (see the module docstring).
POOLS_TAG = ":pools"
_CACHE_LIMIT = 4096
_FORBIDDEN = "{} \t\r\n"


class ChainKeys(NamedTuple):
    """The keys of one chain."""

    chain: str  # the counters (hash)
    signatures: str  # signature -> count (hash)
    recency: str  # signature -> recency (zset)
    reservations: str  # the tree's reservation records (hash)
    expiries: str  # the tree's reservation expiries (zset)
    base: str  # prefix of every chain hash in the tree
    applied: str  # the tree's applied settlement ids (zset: replay memory)


class KeySpace:
    """Names keys under ``prefix`` and caches per-chain and per-level strings."""

    __slots__ = ("_keys", "_levels", "prefix")

    def __init__(self, prefix: str) -> None:
        if not isinstance(prefix, str) or any(c in prefix for c in _FORBIDDEN):
            raise ValueError(
                f"key_prefix must be a string without braces or whitespace, got {prefix!r}"
            )
        self.prefix = prefix
        self._keys: dict[str, ChainKeys] = {}
        self._levels: dict[int, tuple[Level, tuple[str, ...]]] = {}

    def chain(self, chain_id: str) -> ChainKeys:
        """The keys of ``chain_id`` (ValueError for an id that cannot be stored)."""
        keys = self._keys.get(chain_id)
        if keys is None:
            if (
                not isinstance(chain_id, str)
                or not chain_id
                or chain_id.startswith((".", ":"))
                or any(c in chain_id for c in _FORBIDDEN)
            ):
                raise ValueError(
                    f"chain id {chain_id!r} cannot be stored: it must be non-empty, "
                    "not start with '.' or ':', and contain no braces or whitespace"
                )
            tree = f"{self.prefix}{{{tree_tag(chain_id)}}}:"
            keys = ChainKeys(
                tree + "c:" + chain_id,
                tree + "s:" + chain_id,
                tree + "o:" + chain_id,
                tree + "rh",
                tree + "rz",
                tree + "c:",
                tree + "ad",
            )
            if len(self._keys) >= _CACHE_LIMIT:
                self._keys.clear()
            self._keys[chain_id] = keys
        return keys

    def tree(self, path: Sequence[Level]) -> list[ChainKeys]:
        """The keys of every level; ValueError unless they are one chain tree."""
        if not path:
            raise ValueError("a ledger path needs at least one level")
        keys = [self.chain(level.chain_id) for level in path]
        if any(k.base != keys[0].base for k in keys):
            raise ValueError(
                "every level of a path must belong to one chain tree "
                "(ids sharing the root before the first '.' or ':'): "
                f"{[lv.chain_id for lv in path]}"
            )
        return keys

    def settle_keys(self, path: Sequence[Level]) -> list[str]:
        """KEYS of COMMIT and RELEASE: the chain hashes, then the tree's records."""
        if len(path) == 1:
            keys = self.chain(path[0].chain_id)
            return [keys.chain, keys.reservations, keys.expiries, keys.applied]
        tree = self.tree(path)
        first = tree[0]
        return [k.chain for k in tree] + [first.reservations, first.expiries, first.applied]

    def level_args(self, level: Level) -> tuple[str, ...]:
        """``(chain_id, steps, retries, tokens, cost_nano, repeats)``, ``-1`` = unlimited."""
        hit = self._levels.get(id(level))
        if hit is not None and hit[0] is level:
            return hit[1]
        limits = level.limits
        args = (
            level.chain_id,
            _limit(limits.steps),
            _limit(limits.retries),
            _limit(limits.tokens),
            _limit(limits.cost_nano),
            _limit(limits.repeats),
        )
        if len(self._levels) >= _CACHE_LIMIT:
            self._levels.clear()
        self._levels[id(level)] = (level, args)  # holding the level keeps its id unique
        return args


def tree_tag(chain_id: str) -> str:
    """The hash tag of ``chain_id``'s tree: its id up to the first ``.`` or ``:``."""
    end = len(chain_id)
    for separator in ".:":
        at = chain_id.find(separator)
        if 0 <= at < end:
            end = at
    return chain_id[:end]


def _limit(value: int | None) -> str:
    if value is None:
        return "-1"
    if type(value) is not int or value < 0:
        raise ValueError(f"ledger limits must be non-negative ints or None, got {value!r}")
    # Above STORE_MAX a script's sums would not be exact: such a ceiling
    # counts as STORE_MAX, which denies earlier, never later.
    return str(min(value, STORE_MAX))
