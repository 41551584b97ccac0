"""``veronica-otel pools``: every budget pool in the shared ledger, as a table."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from veronica_otel._ledger import Limits, PoolLevel, PoolSnapshot

from ._store import StoreDown, quiet_store_log, store_down

__all__ = ["show_pools", "pool_table"]

_HEADERS = ("POOL", "WINDOW", "SPENT USD", "STEPS", "TOKENS", "RESERVED USD", "FREES IN")


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
            snapshots = [
                ledger.pool_snapshot(PoolLevel(name, Limits())) for name in ledger.pool_names()
            ]
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
    print(pool_table(snapshots))
    return 0


def pool_table(snapshots: Sequence[PoolSnapshot]) -> str:
    """The snapshots as an aligned text table, one pool per row."""
    rows = [_HEADERS] + [
        (
            snap.name,
            "lifetime" if snap.window_s is None else _duration(snap.window_s),
            f"{snap.cost_usd:.6f}",
            str(snap.steps),
            str(snap.tokens),
            f"{snap.reserved_cost_usd:.6f}",
            "-" if snap.free_in_s is None else _duration(snap.free_in_s),
        )
        for snap in snapshots
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADERS))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        cells += [cell.rjust(width) for cell, width in zip(row[2:], widths[2:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"
