"""``veronica-otel override``: lift a sticky trip in the shared ledger, logged."""

from __future__ import annotations

import argparse
import os
import sys

from veronica_otel._config import ExecutionConfig
from veronica_otel._context import ExecutionContext

from ._store import StoreDown, quiet_store_log, store_down

__all__ = ["apply_override"]


def apply_override(args: argparse.Namespace) -> int:
    """Apply the override described by ``args``; returns an exit status."""
    url = args.redis or os.environ.get("VERONICA_REDIS_URL", "").strip()
    if not url:
        print(
            "veronica-otel override: needs the shared ledger: set VERONICA_REDIS_URL "
            "or pass --redis (a chain in one process's memory can only be "
            "overridden by that process, with ExecutionContext.override)",
            file=sys.stderr,
        )
        return 2
    try:
        from veronica_otel.distributed import RedisLedger
    except ImportError as exc:
        print(f"veronica-otel override: install the redis extra ({exc})", file=sys.stderr)
        return 1
    quiet_store_log()
    try:
        prefix = os.environ.get("VERONICA_REDIS_PREFIX", "").strip() or "veronica:"
        ledger = RedisLedger.from_url(url, key_prefix=prefix, fail_open=False)
        ctx = ExecutionContext(ExecutionConfig(), chain_id=args.chain, ledger=ledger)
        lifted = ctx.override(
            args.reason, args.duration, add_usd=args.add_usd, add_steps=args.add_steps
        )
    except (ValueError, TypeError) as exc:
        print(f"veronica-otel override: {exc}", file=sys.stderr)
        return 2
    except StoreDown as exc:
        print(f"veronica-otel override: {store_down(exc)}; nothing was changed", file=sys.stderr)
        return 1
    except Exception as exc:
        print(f"veronica-otel override: failed: {exc}", file=sys.stderr)
        return 1
    what = f"lifted a {lifted.reason} trip" if lifted else "no trip to lift; allowance added"
    print(
        f"chain {args.chain}: {what} for {args.duration:g}s "
        f"(add ${args.add_usd:.2f}, {args.add_steps} steps); reason: {args.reason}"
    )
    return 0
