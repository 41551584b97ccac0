"""``veronica-otel status --chain ID``: what a chain in the shared ledger has spent,
and whether (and why) it is stopped, before anyone overrides it."""

from __future__ import annotations

import argparse
import os
import sys
import time

from veronica_otel._ledger import LedgerState
from veronica_otel._units import nano_to_usd

from ._store import StoreDown, quiet_store_log, store_down

__all__ = ["show_status"]


def show_status(args: argparse.Namespace) -> int:
    """Print the chain's counters and trip; exit 1 when the ledger has no such chain."""
    url = args.redis or os.environ.get("VERONICA_REDIS_URL", "").strip()
    if not url:
        print(
            "veronica-otel status: needs the shared ledger: set VERONICA_REDIS_URL or pass "
            "--redis (a chain in one process's memory is shown by ctx.snapshot())",
            file=sys.stderr,
        )
        return 2
    try:
        from veronica_otel.distributed import RedisLedger
    except ImportError as exc:
        print(f"veronica-otel status: install the redis extra ({exc})", file=sys.stderr)
        return 1
    quiet_store_log()
    prefix = os.environ.get("VERONICA_REDIS_PREFIX", "").strip() or "veronica:"
    try:
        ledger = RedisLedger.from_url(url, key_prefix=prefix, fail_open=False)
        try:
            state: LedgerState | None = ledger.snapshot(args.chain)  # the store answers
            if not ledger.client.exists(ledger.key(args.chain)):
                state = None  # zeros for a chain it never held
        finally:
            ledger.client.close()
    except ValueError as exc:
        print(f"veronica-otel status: {exc}", file=sys.stderr)
        return 2
    except StoreDown as exc:
        print(f"veronica-otel status: {store_down(exc)}", file=sys.stderr)
        return 1
    except Exception as exc:
        print(f"veronica-otel status: failed: {exc}", file=sys.stderr)
        return 1
    if state is None:
        print(
            f"veronica-otel status: chain {args.chain!r} is not in the ledger store "
            f"{ledger.store} (key prefix {prefix!r}); check the chain id and the prefix",
            file=sys.stderr,
        )
        return 1
    print(status_text(args.chain, state, ledger.store))
    return 0


def status_text(chain_id: str, state: LedgerState, store: str) -> str:
    """The chain's counters and trip as aligned lines."""
    lines = [
        f"chain {chain_id} in {store}",
        f"  spent     ${nano_to_usd(state.cost_nano):.6f} "
        f"(+${nano_to_usd(state.reserved_nano):.6f} held by calls in flight)",
        f"  steps     {state.steps}",
        f"  retries   {state.retries}",
        f"  tokens    {state.tokens} (+{state.reserved_tokens} held)",
    ]
    trip = state.trip
    if trip is None:
        lines.append("  trip      none: calls run while their own limits allow")
    else:
        money = "$" if trip.reason == "cost" else ""
        whose = (
            f"pool {trip.pool}: " if trip.pool else f"agent {trip.agent}: " if trip.agent else ""
        )
        at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(trip.time))
        lines += [
            f"  trip      {trip.reason} ({whose}limit {money}{trip.limit:g}, observed "
            f"{money}{trip.observed:g}) at {at}",
            f"            {trip.message}",
            f"  to lift   veronica-otel override --chain {chain_id} --reason WHY --duration 15m",
        ]
    lines.append(
        "  limits    set by each process that runs the chain (its config); the ledger "
        "holds the counters above"
    )
    return "\n".join(lines)
