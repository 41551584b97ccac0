"""Scale: many chains, many threads on one chain, many processes on one Redis chain, long chains.

Every check is ``ExecutionContext.wrap_llm_call(stub, WrapOptions(operation_name=
"bench", cost_estimate_hint=1e-6))`` with ``stub = lambda: None``; every figure
stands next to a baseline measured in the same run, and every section checks
that the chain counted exactly what was allowed (``exact``):

* ``chains``: ``--chains`` (10,000) chains alive in one process, each having
  made ``--calls-per-chain`` checks: memory per chain (``tracemalloc``, and the
  RSS growth), checks per second round-robin over all of them against the
  same number of checks on one chain (interleaved rounds), and the same
  memory figure for veronica-core 3.10.0's ``ExecutionContext``;
* ``threads``: 16 threads released together on one chain: checks per second
  against one thread making the same number, final steps and cost exact;
  then a step limit smaller than the demand: exactly ``limit`` checks allowed;
* ``processes``: 8 spawned processes on one chain in a Valkey / Redis server
  (``RedisLedger``; the server is started here with ``RedisServerProcess``,
  not persisted, unless ``--url``): checks per second against one process,
  steps and nano-USD in the server exact; then a step limit: exactly
  ``limit`` allowed across all processes;
* ``growth``: ns per check when each chain makes 10, 1,000 or 100,000 calls
  (the same total number of checks per size, fresh chains), interleaved;
  ``last_over_first`` must stay about 1. Also the memory one chain holds after
  that many calls, and the same figures for veronica-core.

Prints one JSON object to stdout. Usage::

    .venv/bin/python benchmarks/bench_scale.py            # ~1-2 min
    .venv/bin/python benchmarks/bench_scale.py --quick    # a few s
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import logging
import multiprocessing
import statistics
import threading
import time
import tracemalloc
import uuid
from collections.abc import Callable
from typing import Any

from _report import emit, environment

import veronica_otel
from veronica_otel import Decision, ExecutionConfig, ExecutionContext, WrapOptions
from veronica_otel.distributed import RedisLedger
from veronica_otel.testing import RedisServerProcess

HINT_USD = 1e-6
HINT_NANO = 1_000
LARGE_COST_USD = 1e9
LARGE_STEPS = 10**12
THREADS = 16
PROCESSES = 8
PREFIX = "bench-scale:"
PHASES = ("one", "many", "limit")

DEFAULT = {
    "chains": 10_000,
    "calls_per_chain": 3,
    "passes": 3,
    "thread_calls": 5_000,
    "duration": 3.0,
    "process_limit": 1_000,
    "sizes": (10, 1_000, 100_000),
    "rounds": 3,
}
QUICK = {
    "chains": 1_000,
    "calls_per_chain": 2,
    "passes": 1,
    "thread_calls": 300,
    "duration": 0.5,
    "process_limit": 100,
    "sizes": (10, 100, 1_000),
    "rounds": 1,
}


def _stub() -> None:
    return None


OPTIONS = WrapOptions(operation_name="bench", cost_estimate_hint=HINT_USD)


def _config(max_steps: int = LARGE_STEPS) -> ExecutionConfig:
    return ExecutionConfig(max_cost_usd=LARGE_COST_USD, max_steps=max_steps)


def _cost_nano(ctx: ExecutionContext) -> int:
    return round(ctx.snapshot().cost_usd * 1e9)


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as statm:
            import os

            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def _timed(fn: Callable[[], int]) -> float:
    """Checks per second of ``fn()`` (which returns how many checks it made)."""
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        n = fn()
        return n / (time.perf_counter() - t0)
    finally:
        gc.enable()


# -- many chains ----------------------------------------------------------------------


def _ours_chain() -> Any:
    return ExecutionContext(_config())


def _core_chain() -> Any:
    from veronica_core.containment import ExecutionConfig as CoreConfig
    from veronica_core.containment import ExecutionContext as CoreContext

    return CoreContext(
        CoreConfig(max_cost_usd=LARGE_COST_USD, max_steps=10**9, max_retries_total=10)
    )


def _core_options() -> Any:
    from veronica_core.containment import WrapOptions as CoreOptions

    return CoreOptions(operation_name="bench", cost_estimate_hint=HINT_USD)


def _memory_per_chain(
    make: Callable[[], Any], options: Any, count: int, calls: int
) -> dict[str, Any]:
    gc.collect()
    rss0 = _rss_bytes()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    chains = [make() for _ in range(count)]
    for ctx in chains:
        for _ in range(calls):
            ctx.wrap_llm_call(_stub, options)
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    rss1 = _rss_bytes()
    result = {
        "chains": count,
        "calls_per_chain": calls,
        "tracemalloc_bytes_per_chain": round(used / count),
        "rss_bytes_per_chain": None
        if rss0 is None or rss1 is None
        else round((rss1 - rss0) / count),
    }
    for ctx in chains:
        closer = getattr(ctx, "close", None)
        if callable(closer) and not isinstance(ctx, ExecutionContext):
            closer()
    return result


def _many_chains(count: int, calls: int, passes: int, rounds: int) -> dict[str, Any]:
    memory = _memory_per_chain(_ours_chain, OPTIONS, count, calls)
    chains = [_ours_chain() for _ in range(count)]
    for ctx in chains:
        for _ in range(calls):
            ctx.wrap_llm_call(_stub, OPTIONS)
    one = _ours_chain()
    total = count * passes

    def round_robin() -> int:
        wrap = [ctx.wrap_llm_call for ctx in chains]
        for _ in range(passes):
            for w in wrap:
                w(_stub, OPTIONS)
        return total

    def single() -> int:
        wrap = one.wrap_llm_call
        for _ in range(total):
            wrap(_stub, OPTIONS)
        return total

    many_rates, one_rates = [], []
    for index in range(rounds):
        pair = [(many_rates, round_robin), (one_rates, single)]
        for rates, fn in pair if index % 2 == 0 else pair[::-1]:
            rates.append(_timed(fn))
    expected = calls + passes * rounds
    exact = (
        all(
            ctx.snapshot().steps == expected and _cost_nano(ctx) == expected * HINT_NANO
            for ctx in chains
        )
        and one.snapshot().steps == total * rounds
    )
    many, single_rate = statistics.median(many_rates), statistics.median(one_rates)
    result: dict[str, Any] = {
        "memory": memory,
        "checks_per_s": round(many),
        "one_chain_checks_per_s": round(single_rate),
        "many_over_one": round(many / single_rate, 3),
        "rounds_checks_per_s": [round(r) for r in many_rates],
        "exact": exact,
    }
    try:
        result["veronica_core_memory"] = _memory_per_chain(
            _core_chain, _core_options(), count, calls
        )
    except ImportError as exc:
        result["veronica_core_memory"] = None
        result["veronica_core_unavailable_reason"] = str(exc)
    return result


# -- many threads on one chain --------------------------------------------------------


def _hammer_threads(ctx: ExecutionContext, threads: int, calls: int) -> tuple[float, int]:
    """``threads`` threads, each making ``calls`` checks; (elapsed s, calls allowed)."""
    start = threading.Barrier(threads + 1)
    allowed = [0] * threads

    def worker(index: int) -> None:
        wrap, ok = ctx.wrap_llm_call, 0
        start.wait()
        for _ in range(calls):
            if wrap(_stub, OPTIONS) is Decision.ALLOW:
                ok += 1
        allowed[index] = ok

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    start.wait()
    t0 = time.perf_counter()
    for thread in pool:
        thread.join()
    return time.perf_counter() - t0, sum(allowed)


def _threads(calls: int, rounds: int) -> dict[str, Any]:
    total = THREADS * calls
    multi_rates, single_rates, exact = [], [], True
    for index in range(rounds):
        order = ("multi", "single") if index % 2 == 0 else ("single", "multi")
        for kind in order:
            ctx = ExecutionContext(_config())
            elapsed, allowed = _hammer_threads(
                ctx, THREADS if kind == "multi" else 1, calls if kind == "multi" else total
            )
            (multi_rates if kind == "multi" else single_rates).append(total / elapsed)
            snap = ctx.snapshot()
            exact = exact and allowed == total and snap.steps == total
            exact = exact and _cost_nano(ctx) == total * HINT_NANO
    limit = total // 2
    limited = ExecutionContext(_config(max_steps=limit))
    _, allowed = _hammer_threads(limited, THREADS, calls)
    limit_exact = allowed == limit and limited.snapshot().steps == limit
    multi, single = statistics.median(multi_rates), statistics.median(single_rates)
    return {
        "threads": THREADS,
        "checks_per_thread": calls,
        "checks_per_s": round(multi),
        "one_thread_checks_per_s": round(single),
        "threads_over_one": round(multi / single, 3),
        "exact": exact,
        "limit": {"max_steps": limit, "demand": total, "allowed": allowed, "exact": limit_exact},
    }


# -- many processes on one Redis chain ------------------------------------------------


def _process_worker(
    index: int, url: str, phases: list[tuple[str, int, float]], gate: Any, out: Any
) -> None:
    """One process: for each phase ``(chain_id, max_steps, duration)``, checks on the
    shared chain until ``duration`` is up or the chain trips. Phase ``"one"`` is
    worker 0's alone; every phase starts on ``gate``, all workers together."""
    logging.disable(logging.CRITICAL)
    ledger = RedisLedger.from_url(url, key_prefix=PREFIX)
    for name, (chain_id, max_steps, duration) in zip(PHASES, phases, strict=True):
        ctx = ExecutionContext(_config(max_steps), chain_id=chain_id, ledger=ledger)
        ctx.snapshot()  # connected and warm before the start
        gate.wait(timeout=180)
        if name == "one" and index != 0:
            continue
        allowed = 0
        t0 = time.monotonic()
        deadline = t0 + duration
        while time.monotonic() < deadline:
            if ctx.wrap_llm_call(_stub, OPTIONS) is not Decision.ALLOW:
                break
            allowed += 1
        out.put((name, allowed, time.monotonic() - t0))


def _processes(url: str, duration: float, limit: int) -> dict[str, Any]:
    """One spawned pool of workers: one process alone, then all, then all under a limit."""
    mp = multiprocessing.get_context("spawn")
    run = uuid.uuid4().hex[:8]
    phases = [
        (f"scale-one-{run}", LARGE_STEPS, duration),
        (f"scale-many-{run}", LARGE_STEPS, duration),
        (f"scale-limit-{run}", limit, 120.0),
    ]
    gate = mp.Barrier(PROCESSES)
    out: Any = mp.Queue()
    workers = [
        mp.Process(target=_process_worker, args=(i, url, phases, gate, out))
        for i in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    reports = [out.get(timeout=300 + 3 * duration) for _ in range(1 + 2 * PROCESSES)]
    for worker in workers:
        worker.join(timeout=30)
    ledger = RedisLedger.from_url(url, key_prefix=PREFIX)
    runs: dict[str, Any] = {}
    for name, (chain_id, _steps, _duration) in zip(PHASES, phases, strict=True):
        mine = [r for r in reports if r[0] == name]
        allowed = sum(r[1] for r in mine)
        snap = ledger.snapshot(chain_id)
        runs[name] = {
            "processes": len(mine),
            "allowed": allowed,
            "checks_per_s": round(allowed / max(r[2] for r in mine)),
            "ledger_steps": snap.steps,
            "ledger_cost_nano": snap.cost_nano,
            "exact": snap.steps == allowed
            and snap.cost_nano == allowed * HINT_NANO
            and snap.reserved_nano == 0,
        }
    one, many, limited = runs["one"], runs["many"], runs["limit"]
    return {
        "processes": PROCESSES,
        "checks_per_s": many["checks_per_s"],
        "ledger_ops_per_s": 2 * many["checks_per_s"],  # a reserve and a commit per check
        "one_process_checks_per_s": one["checks_per_s"],
        "processes_over_one": round(many["checks_per_s"] / one["checks_per_s"], 3),
        "exact": many["exact"] and one["exact"],
        "runs": {"one": one, "many": many},
        "limit": {
            "max_steps": limit,
            "allowed": limited["allowed"],
            "ledger_steps": limited["ledger_steps"],
            "exact": limited["allowed"] == limit and limited["ledger_steps"] == limit,
        },
    }


# -- cost per call as chains grow -----------------------------------------------------


def _growth_one(make: Callable[[], Any], options: Any, size: int, total: int) -> float:
    """ns per check over ``total`` checks made by ``total // size`` fresh chains
    (each built and closed outside the timed window)."""
    elapsed = 0
    gc.collect()
    gc.disable()
    try:
        for _ in range(total // size):
            ctx = make()
            wrap = ctx.wrap_llm_call
            t0 = time.perf_counter_ns()
            for _ in range(size):
                wrap(_stub, options)
            elapsed += time.perf_counter_ns() - t0
            closer = getattr(ctx, "close", None)
            if callable(closer) and not isinstance(ctx, ExecutionContext):
                closer()
    finally:
        gc.enable()
    return elapsed / total


def _chain_memory(make: Callable[[], Any], options: Any, size: int) -> int:
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    ctx = make()
    for _ in range(size):
        ctx.wrap_llm_call(_stub, options)
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    del ctx
    return int(used)


def _growth(sizes: tuple[int, ...], rounds: int) -> dict[str, Any]:
    total = max(sizes)
    systems: dict[str, tuple[Callable[[], Any], Any]] = {"veronica_otel": (_ours_chain, OPTIONS)}
    with contextlib.suppress(ImportError):
        systems["veronica_core"] = (_core_chain, _core_options())
    per_round: dict[str, dict[int, list[float]]] = {s: {n: [] for n in sizes} for s in systems}
    for index in range(rounds):
        order = list(sizes) if index % 2 == 0 else list(sizes)[::-1]
        for size in order:
            for name, (make, options) in systems.items():
                per_round[name][size].append(_growth_one(make, options, size, total))
    out: dict[str, Any] = {"sizes": list(sizes), "checks_per_size": total}
    for name, (make, options) in systems.items():
        ns = {n: statistics.median(v) for n, v in per_round[name].items()}
        out[name] = {
            "ns_per_check": {str(n): round(v, 1) for n, v in ns.items()},
            "last_over_first": round(ns[sizes[-1]] / ns[sizes[0]], 3),
            "chain_bytes_after": {str(n): _chain_memory(make, options, n) for n in sizes},
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke: a few seconds")
    parser.add_argument("--chains", type=int, help=f"live chains ({DEFAULT['chains']})")
    parser.add_argument("--url", help="an existing Redis / Valkey server instead of starting one")
    parser.add_argument("--no-redis", action="store_true", help="skip the processes section")
    args = parser.parse_args(argv)
    preset = dict(QUICK if args.quick else DEFAULT)
    if args.chains is not None:
        if args.chains < 1:
            parser.error("--chains must be positive")
        preset["chains"] = args.chains
    logging.disable(logging.CRITICAL)  # veronica-core logs past its node cap

    began = time.perf_counter()
    results: dict[str, Any] = {
        "chains": _many_chains(
            int(preset["chains"]),
            int(preset["calls_per_chain"]),
            int(preset["passes"]),
            int(preset["rounds"]) * 2 - 1,
        ),
        "threads": _threads(int(preset["thread_calls"]), int(preset["rounds"]) * 2 - 1),
    }
    server_version = None
    if args.no_redis:
        results["processes"] = None
    else:
        server = None
        url = args.url
        if url is None:
            server = RedisServerProcess(durable=False).start()
            url = server.url
        try:
            results["processes"] = _processes(
                url, float(preset["duration"]), int(preset["process_limit"])
            )
            import redis

            info: dict[str, Any] = redis.Redis.from_url(url).info("server")
            server_version = info.get("valkey_version") or info.get("redis_version")
        finally:
            if server is not None:
                server.stop()
    results["growth"] = _growth(tuple(preset["sizes"]), int(preset["rounds"]))  # type: ignore[arg-type]

    sections = [r for r in results.values() if r is not None]
    exact = all(s.get("exact", True) for s in sections if isinstance(s, dict))
    exact = exact and all(
        s["limit"]["exact"] for s in sections if isinstance(s, dict) and "limit" in s
    )
    try:
        core_version: str | None = importlib.metadata.version("veronica-core")
    except importlib.metadata.PackageNotFoundError:
        core_version = None
    report: dict[str, Any] = {
        **environment("scale"),
        "packages": {
            "veronica_otel": veronica_otel.__version__,
            "veronica_core": core_version,
            "server": server_version,
        },
        "parameters": {
            **preset,
            "quick": args.quick,
            "threads": THREADS,
            "processes": PROCESSES,
            "check": "wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=1e-6))",
        },
        "results": results,
        "exact": exact,
        "elapsed_s": round(time.perf_counter() - began, 1),
    }
    return emit(report)


if __name__ == "__main__":
    raise SystemExit(main())
