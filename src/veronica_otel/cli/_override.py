"""``veronica-otel override``: lift a sticky trip in the shared ledger, logged."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from veronica_otel._config import ExecutionConfig
from veronica_otel._context import ExecutionContext

__all__ = ["apply_override"]


def apply_override(args: argparse.Namespace) -> int:
    """Apply the override described by ``args``; returns an exit status."""
    url = args.redis_url or os.environ.get("VERONICA_REDIS_URL", "").strip()
    if not url:
        print(
            "veronica-otel override: needs the shared ledger: set VERONICA_REDIS_URL "
            "or pass --redis-url (a chain in one process's memory can only be "
            "overridden by that process, with ExecutionContext.override)",
            file=sys.stderr,
        )
        return 2
    try:
        from veronica_otel.distributed import RedisLedger
    except ImportError as exc:
        print(f"veronica-otel override: install the redis extra ({exc})", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        prefix = os.environ.get("VERONICA_REDIS_PREFIX", "").strip() or "veronica:"
        ledger = RedisLedger.from_url(url, key_prefix=prefix, fail_open=False)
        ctx = ExecutionContext(ExecutionConfig(), chain_id=args.chain, ledger=ledger, detached=True)
        lifted = ctx.override(
            args.reason, args.duration, add_usd=args.add_usd, add_steps=args.add_steps
        )
    except (ValueError, TypeError) as exc:
        print(f"veronica-otel override: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"veronica-otel override: failed: {exc}", file=sys.stderr)
        return 1
    what = f"lifted a {lifted.reason} trip" if lifted else "no trip to lift; allowance added"
    print(
        f"chain {args.chain}: {what} for {args.duration:g}s "
        f"(add_usd={args.add_usd:g}, add_steps={args.add_steps}); reason: {args.reason}"
    )
    return 0
