"""Lua of budget pools in the shared ledger (see ``_pools.py`` for the protocol).

Keys (every pool key carries the one hash tag ``{:pools}``, which no chain
tree's tag can be, so all pools are in one Redis Cluster slot and one script
reserves in all of a call's pools)::

    {prefix}{:pools}:p:{name}  hash    one pool (fields below)
    {prefix}{:pools}:rh        hash    reservation id -> "cost tokens steps name...",
                                       or a reaped one's marker "C cost tokens steps at name..."
    {prefix}{:pools}:rz        zset    reservation id -> expiry (server time, us)
    {prefix}{:pools}:ad        zset    settled reservation id -> expiry (replay memory)

Pool hash fields: ``e`` epoch; ``c`` / ``s`` / ``t`` cost (nano-USD), steps
and tokens spent within the window (all time for a lifetime pool); ``rc`` /
``rs`` / ``rt`` reserved by calls in flight; ``wu`` / ``bu`` the window and
bucket length in microseconds (0: lifetime); ``lo`` the oldest bucket index
that may still hold spend; ``c:{i}`` / ``s:{i}`` / ``t:{i}`` the spend
committed in bucket ``i`` (server time ``[i * bu, (i + 1) * bu)``).

A bucket is dropped (its spend leaves ``c``/``s``/``t``) once all of it is
older than the window: when ``now >= (i + 1) * bu + wu``. Never earlier;
at most ``wu / bu + 2`` buckets are live, so memory is bounded. A pool's
key expires ``max(wu, ku) + bu + chain_ttl`` after its last write (never
under in-window spend); a lifetime pool's key, or one that ever was, never
expires. Time is the server's ``TIME``.

A window change (the same name with another ``wu`` / ``bu``) never drops
spend: what is held moves into the current bucket (it stays longer: denies
earlier, never later), and ``ku`` becomes the longest window the pool has
had (-1: it was a lifetime pool). While ``ku`` is longer than ``wu``, what
leaves the window goes into the lump ``pc`` / ``ps`` / ``pt`` (its newest
time ``pn``) instead of being dropped; the lump counts again when the window
grows back over it (``pn + wu > now``), in full when the pool becomes a
lifetime pool, and goes once ``pn + ku`` has passed.
"""

from __future__ import annotations

from ._lua import source
from ._scripts import _PRELUDE, COMMIT, RELEASE, RESERVE

__all__ = [
    "POOL_COMMIT",
    "POOL_HEARTBEAT",
    "POOL_RELEASE",
    "POOL_RESERVE",
    "POOL_SNAPSHOT",
    "POOLED_COMMIT",
    "POOLED_RELEASE",
    "POOLED_RESERVE",
    "RESERVE_CHECK",
    "SECTION",
]

# ARGV of a pool section (offset po): np id cost tokens steps base rsv_ttl_us
# marker_ttl_us applied_ttl_us applied_cap fresh chain_ttl_ms chain_id clock_us
# ('' = the server's TIME; a test's injected clock otherwise), then
# per pool: name wu bu cost_limit steps_limit tokens_limit (-1 unlimited) and
# the client's marks e c s t. KEYS (offset ko): np pool hashes, rh, rz, ad.
HEAD = 14
PER_POOL = 10
SECTION = (HEAD, PER_POOL)

_POOL_LIB = source("pool_lib")


def _wrapped(chain_script: str, extra: str = "") -> str:
    # The chain's own script, whole, as a function whose parameters shadow
    # KEYS and ARGV: it runs unchanged on its slice of the combined script's.
    return f"local function chain_op(KEYS, ARGV{extra})\n{chain_script}\nend\n"


def _checking(reserve: str) -> str:
    """The chain's RESERVE that, when ``check_only`` is true, stops after its
    checks (step 2: a sticky trip is stored, a soft denial returned) and
    charges nothing: ``{1, 0, '', reseeded, report...}`` when the call fits."""
    if reserve.count(_CHARGE) != 1:
        raise RuntimeError("RESERVE has no single '-- 3. Charge every level' step to stop before")
    stop = "\nif check_only then return report({1, 0, '', reseeded}, n) end"
    return reserve.replace(_CHARGE, stop + _CHARGE)


_CHARGE = "\n-- 3. Charge every level"
_RESERVE_OR_CHECK = _checking(RESERVE)

# The chain's verdict without charging it (Redis Cluster: asked after the
# pools denied in phase one, so the chain's own limits decide first, as in
# LocalLedger). KEYS and ARGV: RESERVE's; the reply: RESERVE's.
RESERVE_CHECK = "local check_only = true\n" + _RESERVE_OR_CHECK


# Combined scripts (one server): the chain's operation and the pools' in one
# atomic script (see pooled_split.lua for their KEYS, ARGV and replies).
_SPLIT = source("pooled_split")
POOLED_RESERVE = (
    _PRELUDE
    + _POOL_LIB
    + _wrapped(_RESERVE_OR_CHECK, ", check_only")
    + _SPLIT
    + source("pooled_reserve")
)
_POOLED_SETTLE = source("pooled_settle")
POOLED_COMMIT = (
    _PRELUDE + _POOL_LIB + _wrapped(COMMIT) + _SPLIT + _POOLED_SETTLE.replace("@COMMIT@", "true")
)
POOLED_RELEASE = (
    _PRELUDE + _POOL_LIB + _wrapped(RELEASE) + _SPLIT + _POOLED_SETTLE.replace("@COMMIT@", "false")
)

# Pool-only scripts (Redis Cluster: the pools' slot; see pool_reserve.lua).
POOL_RESERVE = _PRELUDE + _POOL_LIB + source("pool_reserve")
_POOL_SETTLE = source("pool_settle")
POOL_COMMIT = _PRELUDE + _POOL_LIB + _POOL_SETTLE.replace("@COMMIT@", "true")
POOL_RELEASE = _PRELUDE + _POOL_LIB + _POOL_SETTLE.replace("@COMMIT@", "false")
POOL_HEARTBEAT = _PRELUDE + source("pool_heartbeat")
POOL_SNAPSHOT = _PRELUDE + _POOL_LIB + source("pool_snapshot")
