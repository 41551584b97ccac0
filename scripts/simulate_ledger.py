#!/usr/bin/env python3
"""Deterministic fault simulation of the shared ledger: many seeds, JSON out.

    python scripts/simulate_ledger.py                    # 100,000 seeds, every fault class
    python scripts/simulate_ledger.py --seed 4242 --trace  # replay one seed exactly
    python scripts/simulate_ledger.py --runs 5000 --faults crash,lost_reply
    python scripts/simulate_ledger.py --matrix --runs 2000 # each fault class alone

Exit status 1 when any run broke an invariant (the JSON names the invariants,
example seeds, and which fault classes were active). See
tests/simulation/_sim_ledger.py for the model and the invariants.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# The package, and the repository root for tests/ (where the simulator lives).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from tests.simulation._sim_ledger import FAULTS, run, run_many


def _faults(text: str) -> tuple[str, ...]:
    if text in ("all", ""):
        return FAULTS if text == "all" else ()
    if text == "none":
        return ()
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = sorted(set(names) - set(FAULTS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown fault classes {unknown}; known: {FAULTS}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000, help="seeds to run (default 100000)")
    parser.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--seed", type=int, help="run this one seed and print its result")
    parser.add_argument(
        "--faults",
        type=_faults,
        default=FAULTS,
        help=f"comma-separated fault classes, 'all' or 'none' (known: {','.join(FAULTS)})",
    )
    parser.add_argument(
        "--no-swarm", action="store_true", help="every listed fault class active in every run"
    )
    parser.add_argument("--trace", action="store_true", help="with --seed: print the trace")
    parser.add_argument(
        "--matrix", action="store_true", help="run --runs seeds for each fault class alone"
    )
    args = parser.parse_args(argv)
    swarm = not args.no_swarm
    started = time.perf_counter()
    if args.seed is not None:
        result = run(args.seed, args.faults, swarm=swarm)
        out: dict[str, object] = {
            "seed": result.seed,
            "ok": result.ok,
            "faults": list(result.faults),
            "violations": result.violations,
            "stats": result.stats,
            "digest": result.digest,
        }
        if args.trace:
            out["trace"] = result.trace
        print(json.dumps(out, indent=2))
        return 0 if result.ok else 1
    seeds = range(args.start, args.start + args.runs)
    if args.matrix:
        report: dict[str, object] = {}
        failed = 0
        for fault in ("none", *args.faults):
            faults = () if fault == "none" else (fault,)
            summary = run_many(seeds, faults, swarm=False)
            failed += summary["failed"]
            report[fault] = {
                "runs": summary["runs"],
                "failed": summary["failed"],
                "invariants": {
                    name: {"count": e["count"], "seeds": e["seeds"], "detail": e["detail"]}
                    for name, e in summary["invariants"].items()
                },
            }
        report["seconds"] = round(time.perf_counter() - started, 1)
        print(json.dumps(report, indent=2))
        return 1 if failed else 0
    summary = run_many(seeds, args.faults, swarm=swarm)
    summary["faults_enabled"] = list(args.faults)
    summary["swarm"] = swarm
    summary["first_seed"] = args.start
    summary["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(summary, indent=2))
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
