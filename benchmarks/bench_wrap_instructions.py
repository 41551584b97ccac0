"""Instructions per ``wrap_llm_call``, veronica-otel vs veronica-core, counted by cachegrind.

The DESIGN target is ``wrap_llm_call`` <= 0.1x veronica-core's. Timing a
call of a few microseconds on a shared machine swings by more than the gap,
so this counts instructions (``bench_instructions.py`` explains why that is
stable): each variant runs in a child under ``valgrind --tool=cachegrind
--cache-sim=no`` making N and then 2N calls of a stub (``lambda: None``) on
one context with ``bench_overhead.py``'s limits, after a warm-up, with hash
randomisation fixed and garbage collection frozen; instructions per call is
(I(2N) - I(N)) / N, which cancels start-up and exit.

Variants: ``plain`` (no options) and ``hint`` (``WrapOptions(operation_name=
"bench", cost_estimate_hint=1e-6)``), for ``ours`` and ``core``.

Prints one JSON object; ``{"skipped": ...}`` without valgrind, and
``core`` results ``null`` (with the reason) when veronica-core is not
importable. Usage::

    .venv/bin/python benchmarks/bench_wrap_instructions.py           # ~1 min here
    .venv/bin/python benchmarks/bench_wrap_instructions.py --quick   # fewer calls
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

TARGET_RATIO = 0.1
LIMITS: dict[str, Any] = {"max_cost_usd": 1e9, "max_steps": 10**9, "max_retries_total": 10}
HINT_USD = 1e-6
WARM_UP = 200


def _child(project: str, variant: str, calls: int) -> None:
    import logging

    logging.disable(logging.CRITICAL)  # veronica-core logs per call past its node cap
    if project == "ours":
        import veronica_otel as lib

        options_type: Any = lib.WrapOptions
    else:
        import veronica_core as lib  # type: ignore[import-not-found,no-redef]
        from veronica_core.containment import WrapOptions  # type: ignore[import-not-found]

        options_type = WrapOptions
    ctx = lib.ExecutionContext(lib.ExecutionConfig(**LIMITS))
    options = (
        options_type(operation_name="bench", cost_estimate_hint=HINT_USD)
        if variant == "hint"
        else None
    )
    wrap = ctx.wrap_llm_call

    def stub() -> None:
        return None

    for _ in range(WARM_UP):
        wrap(stub, options)
    gc.collect()
    gc.freeze()
    gc.disable()
    for _ in range(calls):
        wrap(stub, options)


def _count(project: str, variant: str, calls: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cachegrind.out")
        subprocess.run(
            [
                "valgrind",
                "--tool=cachegrind",
                "--cache-sim=no",
                f"--cachegrind-out-file={out}",
                sys.executable,
                __file__,
                "--child",
                project,
                variant,
                str(calls),
            ],
            check=True,
            env=dict(os.environ, PYTHONHASHSEED="0"),
            capture_output=True,
            timeout=600,
        )
        with open(out) as handle:
            found = re.search(r"^summary: (\d+)", handle.read(), re.MULTILINE)
    if found is None:
        raise RuntimeError("cachegrind wrote no summary")
    return int(found.group(1))


def _per_call(project: str, variant: str, calls: int) -> float:
    return (_count(project, variant, 2 * calls) - _count(project, variant, calls)) / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    parser.add_argument("--calls", type=int, help="N (2,000 by default, 200 with --quick)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        project, variant, calls = args.child
        _child(project, variant, int(calls))
        return 0
    if shutil.which("valgrind") is None:
        print(json.dumps({"skipped": "valgrind is not installed"}))
        return 0
    calls = args.calls or (200 if args.quick else 2000)
    result: dict[str, Any] = {"calls": calls, "target_ratio": TARGET_RATIO, "results": {}}
    try:
        import veronica_core  # type: ignore[import-not-found]  # noqa: F401

        projects = ("ours", "core")
    except ImportError as exc:
        projects = ("ours",)
        result["veronica_core_unavailable_reason"] = str(exc)
    for project in ("ours", "core"):
        for variant in ("plain", "hint"):
            key = f"{project}_{variant}"
            result["results"][key] = (
                round(_per_call(project, variant, calls)) if project in projects else None
            )
    results = result["results"]
    result["ratios"] = {
        variant: (
            round(results[f"ours_{variant}"] / results[f"core_{variant}"], 4)
            if results[f"core_{variant}"]
            else None
        )
        for variant in ("plain", "hint")
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
