"""``veronica-otel pools``: every budget pool in the shared ledger, as a table.

The store holds what each pool spent, not its limits: those are
configuration, written in the policy file every process reads
(``[pools."name"]``). Given that file (``--policy``, else
``VERONICA_POLICY_FILE``), the table adds each pool's limits and what is
left of them, and lists the file's pools that have spent nothing yet.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from veronica_otel._ledger import Limits, PoolLevel, PoolSnapshot
from veronica_otel._pools import PoolLimits

from ._store import StoreDown, quiet_store_log, store_down

__all__ = ["show_pools", "pool_table"]

_HEADERS = ("POOL", "WINDOW", "SPENT USD", "STEPS", "TOKENS", "RESERVED USD", "FREES IN")
_LIMIT_HEADERS = ("LIMIT", "LEFT")


def show_pools(args: argparse.Namespace) -> int:
    """Print each pool's window usage, reserved amount and time to free."""
    url = args.redis or os.environ.get("VERONICA_REDIS_URL", "").strip()
    if not url:
        print(
            "veronica-otel pools: needs the shared ledger: set VERONICA_REDIS_URL or pass "
            "--redis (pools kept in one process's memory are shown by pool.snapshot())",
            file=sys.stderr,
        )
        return 2
    policy = getattr(args, "policy", None) or os.environ.get("VERONICA_POLICY_FILE", "").strip()
    try:
        limits = _policy_limits(policy) if policy else None
    except (OSError, ValueError) as exc:  # PolicyFileError is a ValueError
        print(f"veronica-otel pools: {exc}", file=sys.stderr)
        return 2
    try:
        from veronica_otel.distributed import RedisLedger
    except ImportError as exc:
        print(f"veronica-otel pools: install the redis extra ({exc})", file=sys.stderr)
        return 1
    quiet_store_log()
    try:
        prefix = os.environ.get("VERONICA_REDIS_PREFIX", "").strip() or "veronica:"
        ledger = RedisLedger.from_url(url, key_prefix=prefix, fail_open=False)
        try:
            names = ledger.pool_names()
            names += [name for name in limits or () if name not in names]
            snapshots = [ledger.pool_snapshot(PoolLevel(name, Limits())) for name in names]
        finally:
            ledger.client.close()
    except ValueError as exc:
        print(f"veronica-otel pools: {exc}", file=sys.stderr)
        return 2
    except StoreDown as exc:
        print(f"veronica-otel pools: {store_down(exc)}", file=sys.stderr)
        return 1
    except Exception as exc:
        print(f"veronica-otel pools: failed: {exc}", file=sys.stderr)
        return 1
    if not snapshots:
        print(f"no pools in {ledger.store} (key prefix {prefix!r})")
        return 0
    print(pool_table(snapshots, limits))
    if limits is None:
        print(
            "limits are in the policy file: pass --policy FILE (or set VERONICA_POLICY_FILE) "
            "to show them and what is left",
            file=sys.stderr,
        )
    return 0


def _policy_limits(path: str) -> dict[str, PoolLimits]:
    """Each ``[pools."name"]`` of the policy file at ``path``, as checked limits."""
    from veronica_otel._file_pools import file_pool_limits
    from veronica_otel._policy_schema import load_policy

    return {name: file_pool_limits(rule) for name, rule in load_policy(Path(path)).pools.items()}


def pool_table(
    snapshots: Sequence[PoolSnapshot], limits: Mapping[str, PoolLimits] | None = None
) -> str:
    """The snapshots as an aligned text table, one pool per row.

    With ``limits`` (by pool name), two more columns: each pool's limits, and
    what is left of them: the limit less what was spent within the window
    and what calls in flight hold (never below zero).
    """
    headers = _HEADERS + (_LIMIT_HEADERS if limits is not None else ())
    rows = [headers]
    for snap in snapshots:
        row: tuple[str, ...] = (
            snap.name,
            "lifetime" if snap.window_s is None else _duration(snap.window_s),
            f"{snap.cost_usd:.6f}",
            str(snap.steps),
            str(snap.tokens),
            f"{snap.reserved_cost_usd:.6f}",
            "-" if snap.free_in_s is None else _duration(snap.free_in_s),
        )
        if limits is not None:
            row += _limit_and_left(snap, limits.get(snap.name))
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(headers))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        cells += [cell.rjust(width) for cell, width in zip(row[2:7], widths[2:7], strict=True)]
        cells += [cell.ljust(width) for cell, width in zip(row[7:], widths[7:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _limit_and_left(snap: PoolSnapshot, limits: PoolLimits | None) -> tuple[str, str]:
    if limits is None:
        return "not in the policy file", "-"
    cost, steps, tokens = limits.max_cost_usd, limits.max_steps, limits.max_tokens
    if cost is None and steps is None and tokens is None:
        return "none", "-"
    given, left = [], []
    if cost is not None:
        given.append(_dollars(cost))
        left.append(_dollars(max(cost - snap.cost_usd - snap.reserved_cost_usd, 0.0)))
    if steps is not None:
        given.append(f"{steps} steps")
        left.append(f"{max(steps - snap.steps - snap.reserved_steps, 0)} steps")
    if tokens is not None:
        given.append(f"{tokens} tokens")
        left.append(f"{max(tokens - snap.tokens - snap.reserved_tokens, 0)} tokens")
    return ", ".join(given), ", ".join(left)


def _dollars(usd: float) -> str:
    """``$0.01``, ``$50``: six decimals at most, no trailing zeros."""
    text = f"{usd:.6f}".rstrip("0").rstrip(".")
    return f"${text}"


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"
