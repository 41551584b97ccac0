"""Per-call overhead of ``ExecutionContext.wrap_llm_call``: veronica-otel vs veronica-core.

Measures nanoseconds per call of a stub callable (``lambda: None``):

* ``bare``: the stub called directly (the loop and call floor);
* ``ours_plain`` / ``ours_hint``: ``veronica_otel.ExecutionContext.wrap_llm_call``
  without options, and with ``WrapOptions(operation_name="bench",
  cost_estimate_hint=1e-6)``;
* ``veronica_core_plain`` / ``veronica_core_hint``: the same on
  ``veronica-core`` 3.10.0 (``veronica_core``), if it is importable.

Fairness:

* Variants are interleaved: every round walks over the batches, and each batch
  runs every variant once (in an order rotated per round), so drifting machine
  load hits all variants alike. The reported figure is the median over rounds
  of each round's ns/call (the min is reported too).
* Every batch (``--batch`` calls, 2,000 by default) gets a fresh context for
  *both* projects, built and torn down outside the timed region. veronica-core
  keeps one node per call and logs a warning per call past 10,000 nodes; fresh
  contexts keep it below that cap, and neither side pays context creation.
* Logging is disabled (``logging.disable``) so veronica-core's warnings cannot
  print; garbage collection is disabled inside each timed window.
* Before timing, one warm-up batch per variant checks that every call returned
  ``ALLOW`` (a benchmark of the HALT fast path would be meaningless).

Prints one JSON object to stdout. Usage::

    .venv/bin/python benchmarks/bench_overhead.py            # default, < ~60 s
    .venv/bin/python benchmarks/bench_overhead.py --quick    # CI smoke, a few s
    .venv/bin/python benchmarks/bench_overhead.py --rounds 9 --calls 40000
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import importlib.metadata
import json
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import veronica_otel

TARGET_RATIO = 0.1
LARGE_COST_USD = 1e9
LARGE_STEPS = 10**9
MAX_RETRIES_TOTAL = 10
HINT_USD = 1e-6
OPERATION_NAME = "bench"

DEFAULT_ROUNDS = 7
DEFAULT_CALLS = 20_000
DEFAULT_BATCH = 2_000
QUICK_ROUNDS = 3
QUICK_CALLS = 2_000


def _stub() -> None:
    return None


# The brief's stub is ``lambda: None``; a named function with the same body
# behaves identically but keeps ruff (E731) quiet.
STUB: Callable[[], None] = _stub

# A timed batch: (n) -> elapsed ns. A setup builds one from a fresh context and
# returns it with a teardown to run after the timed window.
Batch = Callable[[int], int]
Setup = Callable[[], tuple[Batch, Callable[[], None]]]


def _noop() -> None:
    return None


def _bare_batch(n: int) -> int:
    stub = STUB
    it = range(n)
    t0 = time.perf_counter_ns()
    for _ in it:
        stub()
    return time.perf_counter_ns() - t0


def _wrap_batch(wrap: Callable[..., Any], options: object | None) -> Batch:
    """A timed loop of ``wrap(stub)`` (no options) or ``wrap(stub, options)``."""
    if options is None:

        def run_plain(n: int) -> int:
            stub = STUB
            it = range(n)
            t0 = time.perf_counter_ns()
            for _ in it:
                wrap(stub)
            return time.perf_counter_ns() - t0

        return run_plain

    def run_options(n: int) -> int:
        stub = STUB
        opts = options
        it = range(n)
        t0 = time.perf_counter_ns()
        for _ in it:
            wrap(stub, opts)
        return time.perf_counter_ns() - t0

    return run_options


@dataclass
class Variant:
    name: str
    setup: Setup
    check: Callable[[int], None]
    rounds_ns: list[float] = field(default_factory=list)


def _ours_variants() -> list[Variant]:
    from veronica_otel import Decision, ExecutionConfig, ExecutionContext, WrapOptions

    def make() -> Any:
        return ExecutionContext(
            ExecutionConfig(
                max_cost_usd=LARGE_COST_USD,
                max_steps=LARGE_STEPS,
                max_retries_total=MAX_RETRIES_TOTAL,
            )
        )

    hint = WrapOptions(operation_name=OPERATION_NAME, cost_estimate_hint=HINT_USD)

    def setup_for(options: object | None) -> Setup:
        def setup() -> tuple[Batch, Callable[[], None]]:
            ctx = make()
            return _wrap_batch(ctx.wrap_llm_call, options), _noop

        return setup

    def check_for(options: Any) -> Callable[[int], None]:
        def check(n: int) -> None:
            ctx = make()
            results = [ctx.wrap_llm_call(STUB, options) for _ in range(n)]
            bad = [r for r in results if r != Decision.ALLOW]
            if bad:
                raise RuntimeError(f"veronica_otel returned {bad[0]!r}, expected ALLOW")
            steps = ctx.snapshot().steps
            if steps != n:
                raise RuntimeError(f"veronica_otel counted {steps} steps for {n} calls")

        return check

    return [
        Variant("ours_plain", setup_for(None), check_for(None)),
        Variant("ours_hint", setup_for(hint), check_for(hint)),
    ]


def _veronica_core_variants() -> tuple[list[Variant], str | None, str | None]:
    """The veronica-core variants, its version, and why it is missing (if it is)."""
    try:
        from veronica_core import ExecutionConfig, ExecutionContext
        from veronica_core.containment import WrapOptions
    except Exception as exc:  # ImportError, or a broken install
        return [], None, f"veronica_core not importable: {type(exc).__name__}: {exc}"
    try:
        version: str | None = importlib.metadata.version("veronica-core")
    except importlib.metadata.PackageNotFoundError:
        version = getattr(sys.modules.get("veronica_core"), "__version__", None)

    def make() -> Any:
        return ExecutionContext(
            ExecutionConfig(
                max_cost_usd=LARGE_COST_USD,
                max_steps=LARGE_STEPS,
                max_retries_total=MAX_RETRIES_TOTAL,
            )
        )

    hint = WrapOptions(operation_name=OPERATION_NAME, cost_estimate_hint=HINT_USD)

    def close(ctx: Any) -> Callable[[], None]:
        closer = getattr(ctx, "close", None)
        return closer if callable(closer) else _noop

    def setup_for(options: object | None) -> Setup:
        def setup() -> tuple[Batch, Callable[[], None]]:
            ctx = make()
            return _wrap_batch(ctx.wrap_llm_call, options), close(ctx)

        return setup

    def check_for(options: Any) -> Callable[[int], None]:
        def check(n: int) -> None:
            ctx = make()
            results = [ctx.wrap_llm_call(STUB, options) for _ in range(n)]
            close(ctx)()
            bad = [r for r in results if str(getattr(r, "name", r)) != "ALLOW"]
            if bad:
                raise RuntimeError(f"veronica_core returned {bad[0]!r}, expected ALLOW")

        return check

    variants = [
        Variant("veronica_core_plain", setup_for(None), check_for(None)),
        Variant("veronica_core_hint", setup_for(hint), check_for(hint)),
    ]
    return variants, version, None


def _timed(setup: Setup, n: int) -> int:
    batch, teardown = setup()
    gc.collect()
    gc.disable()
    try:
        elapsed = batch(n)
    finally:
        gc.enable()
    teardown()
    return elapsed


def _run(variants: list[Variant], rounds: int, calls: int, batch: int) -> None:
    sizes = [batch] * (calls // batch)
    if calls % batch:
        sizes.append(calls % batch)
    count = len(variants)
    for round_index in range(rounds):
        start = round_index % count
        order = variants[start:] + variants[:start]
        totals = dict.fromkeys((v.name for v in variants), 0)
        for size in sizes:
            for variant in order:
                totals[variant.name] += _timed(variant.setup, size)
        for variant in variants:
            variant.rounds_ns.append(totals[variant.name] / calls)


def _summary(variant: Variant | None) -> dict[str, Any] | None:
    if variant is None:
        return None
    return {
        "median_ns": round(statistics.median(variant.rounds_ns), 1),
        "min_ns": round(min(variant.rounds_ns), 1),
        "rounds_ns": [round(x, 1) for x in variant.rounds_ns],
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 4)


def _diff(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    return round(a - b, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=None, help=f"default {DEFAULT_ROUNDS}")
    parser.add_argument(
        "--calls", type=int, default=None, help=f"calls per variant per round ({DEFAULT_CALLS})"
    )
    parser.add_argument(
        "--batch", type=int, default=DEFAULT_BATCH, help="calls per fresh context (2000)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"CI smoke: {QUICK_ROUNDS} rounds of {QUICK_CALLS} calls unless overridden",
    )
    args = parser.parse_args(argv)
    rounds = (
        args.rounds if args.rounds is not None else (QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS)
    )
    calls = args.calls if args.calls is not None else (QUICK_CALLS if args.quick else DEFAULT_CALLS)
    batch = min(args.batch, calls)
    if rounds < 1 or calls < 1 or batch < 1:
        parser.error("--rounds, --calls and --batch must be positive")

    # veronica-core logs per call past its node cap; nothing may print but the JSON.
    logging.disable(logging.CRITICAL)

    began = time.perf_counter()
    bare = Variant("bare", lambda: (_bare_batch, _noop), lambda n: None)
    ours = _ours_variants()
    core, core_version, core_missing = _veronica_core_variants()
    variants = [bare, *ours, *core]

    for variant in variants:  # warm-up and sanity check, untimed
        variant.check(batch)
        _timed(variant.setup, batch)

    _run(variants, rounds, calls, batch)

    by_name = {v.name: v for v in variants}

    def median(name: str) -> float | None:
        v = by_name.get(name)
        return statistics.median(v.rounds_ns) if v is not None else None

    ours_plain, ours_hint = median("ours_plain"), median("ours_hint")
    core_plain, core_hint = median("veronica_core_plain"), median("veronica_core_hint")
    bare_ns = median("bare")
    ratio_plain = _ratio(ours_plain, core_plain)
    ratio_hint = _ratio(ours_hint, core_hint)

    report: dict[str, Any] = {
        "benchmark": "wrap_llm_call_overhead",
        "unit": "ns per call",
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "packages": {
            "veronica_otel": veronica_otel.__version__,
            "veronica_core": core_version,
        },
        "veronica_core_unavailable_reason": core_missing,
        "parameters": {
            "rounds": rounds,
            "calls_per_variant_per_round": calls,
            "batch_size": batch,
            "quick": args.quick,
            "stub": "lambda: None",
            "config": {
                "max_cost_usd": LARGE_COST_USD,
                "max_steps": LARGE_STEPS,
                "max_retries_total": MAX_RETRIES_TOTAL,
            },
            "hint_options": {"operation_name": OPERATION_NAME, "cost_estimate_hint": HINT_USD},
            "method": "interleaved round-robin per batch, fresh context per batch built "
            "outside the timed window, gc disabled while timing, median of per-round ns/call",
        },
        "results": {
            "bare": _summary(bare),
            "ours_plain": _summary(by_name["ours_plain"]),
            "ours_hint": _summary(by_name["ours_hint"]),
            "veronica_core_plain": _summary(by_name.get("veronica_core_plain")),
            "veronica_core_hint": _summary(by_name.get("veronica_core_hint")),
        },
        "ratios": {
            "ours_plain_over_veronica_core_plain": ratio_plain,
            "ours_hint_over_veronica_core_hint": ratio_hint,
            "ours_plain_minus_bare_ns": _diff(ours_plain, bare_ns),
            "ours_hint_minus_bare_ns": _diff(ours_hint, bare_ns),
            "veronica_core_plain_minus_bare_ns": _diff(core_plain, bare_ns),
            "veronica_core_hint_minus_bare_ns": _diff(core_hint, bare_ns),
        },
        "target": {
            "goal": "veronica_otel wrap_llm_call <= 0.1 x veronica-core wrap_llm_call "
            "(median ns/call, plain and with cost_estimate_hint)",
            "max_ratio": TARGET_RATIO,
            "met_plain": None if ratio_plain is None else ratio_plain <= TARGET_RATIO,
            "met_hint": None if ratio_hint is None else ratio_hint <= TARGET_RATIO,
        },
        "elapsed_s": round(time.perf_counter() - began, 1),
    }
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
