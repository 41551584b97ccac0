"""Cost of a contained call with 0, 1 and 3 budget pools (issue 15).

Measures nanoseconds per ``ExecutionContext.wrap_llm_call`` of a stub with a
cost hint, in a chain that lists 0, 1 or 3 :class:`BudgetPool` (windowed,
"1h", with cost and step limits far above what the run spends), on:

* the in-process ledger (always);
* a Redis/Valkey ledger with ``--redis URL`` (once ``RedisLedger`` supports
  pools), where it also reports the store's commands per call
  (``total_commands_processed`` from ``INFO stats``, before and after).

Variants are interleaved per round (rotated order) and the median over rounds
is reported, as in ``bench_overhead.py``. Prints one JSON object. Usage::

    .venv/bin/python benchmarks/bench_pools.py               # < ~30 s
    .venv/bin/python benchmarks/bench_pools.py --quick
    .venv/bin/python benchmarks/bench_pools.py --redis redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import uuid
from typing import Any

from veronica_otel import BudgetPool, ExecutionConfig, ExecutionContext, WrapOptions
from veronica_otel._ledger import Ledger, LocalLedger

HINT = WrapOptions(cost_estimate_hint=1e-6)
POOL_COUNTS = (0, 1, 3)


def _stub() -> None:
    return None


def _pools(ledger: Ledger, count: int, tag: str) -> list[BudgetPool]:
    return [
        BudgetPool(
            f"bench:{tag}:{i}", max_cost_usd=1e6, max_steps=10**12, window="1h", ledger=ledger
        )
        for i in range(count)
    ]


def _batch(ledger: Ledger, pools: list[BudgetPool], calls: int) -> int:
    """ns for ``calls`` wrapped calls in a fresh chain (built outside the timing)."""
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1e6), ledger=ledger, pools=pools)
    wrap = ctx.wrap_llm_call
    gc.disable()
    try:
        start = time.perf_counter_ns()
        for _ in range(calls):
            wrap(_stub, HINT)
        return time.perf_counter_ns() - start
    finally:
        gc.enable()


def _measure(ledger: Ledger, rounds: int, calls: int, tag: str) -> dict[str, Any]:
    pools = {n: _pools(ledger, n, tag) for n in POOL_COUNTS}
    for n in POOL_COUNTS:  # warm up
        _batch(ledger, pools[n], max(1, calls // 10))
    per_call: dict[int, list[float]] = {n: [] for n in POOL_COUNTS}
    for r in range(rounds):
        order = POOL_COUNTS[r % 3 :] + POOL_COUNTS[: r % 3]
        for n in order:
            per_call[n].append(_batch(ledger, pools[n], calls) / calls)
    return {
        f"pools_{n}": {
            "ns_per_call_median": round(statistics.median(per_call[n]), 1),
            "ns_per_call_min": round(min(per_call[n]), 1),
        }
        for n in POOL_COUNTS
    }


def _redis(url: str, rounds: int, calls: int) -> dict[str, Any]:
    from veronica_otel.distributed import RedisLedger

    ledger = RedisLedger.from_url(url, key_prefix=f"bench-pools-{uuid.uuid4().hex[:8]}:")
    if not callable(getattr(ledger, "pool_snapshot", None)):
        return {"skipped": "this RedisLedger does not support pools yet"}
    result = _measure(ledger, rounds, calls, "redis")
    client = ledger.client
    for n in POOL_COUNTS:
        pools = _pools(ledger, n, "rt")
        before = int(client.info("stats")["total_commands_processed"])
        _batch(ledger, pools, calls)
        after = int(client.info("stats")["total_commands_processed"])
        # Minus the INFO command itself.
        result[f"pools_{n}"]["store_commands_per_call"] = round((after - before - 1) / calls, 2)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5_000)
    parser.add_argument("--quick", action="store_true", help="a few seconds (CI smoke)")
    parser.add_argument("--redis", metavar="URL", help="also measure a RedisLedger at URL")
    args = parser.parse_args(argv)
    rounds, calls = (3, 500) if args.quick else (args.rounds, args.calls)
    report: dict[str, Any] = {
        "benchmark": "bench_pools",
        "python": sys.version.split()[0],
        "rounds": rounds,
        "calls_per_batch": calls,
        "local": _measure(LocalLedger(), rounds, calls, "local"),
    }
    if args.redis:
        report["redis"] = _redis(args.redis, rounds, max(1, calls // 10))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
