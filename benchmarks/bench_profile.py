"""Profile of the hot path with pyinstrument: where a contained call spends its time.

Two targets, each profiled on the main thread only (the fake server's and the
span exporter's threads are not sampled):

* ``wrap_llm_call``: ``ExecutionContext(ExecutionConfig(max_cost_usd=1e9,
  max_steps=10**12)).wrap_llm_call(lambda: None)``, ``--calls`` times;
* ``openai_instrumented``: ``OpenAIInstrumentor().instrument()`` and an active
  ``ExecutionContext``; ``client.chat.completions.create(model="gpt-4o-mini",
  max_tokens=5, ...)`` against the in-process ``FakeLLMServer``, with an SDK
  ``TracerProvider`` (a batch processor and an exporter that drops spans),
  ``--sdk-calls`` times.

For each target the JSON lists the top ``--top`` frames by self time
(function, ``file:line``, share of all samples) over everything, and again
over veronica-otel's own code only, with the share of time spent in our
code. ``--html PATH`` also writes pyinstrument's interactive HTML view of
each target (``PATH`` with ``-<target>`` before its suffix).

Prints one JSON object to stdout. Usage::

    .venv/bin/python benchmarks/bench_profile.py                        # ~15-30 s
    .venv/bin/python benchmarks/bench_profile.py --quick                # a few s
    .venv/bin/python benchmarks/bench_profile.py --html /tmp/profile.html
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _report import emit, environment
from pyinstrument import Profiler
from pyinstrument.frame import Frame
from pyinstrument.session import Session

import veronica_otel
from veronica_otel import Decision, ExecutionConfig, ExecutionContext

INTERVAL_S = 0.0001
OURS = ("veronica_otel", "/instrumentors/", "/exporters/")
DEFAULT = {"calls": 200_000, "sdk_calls": 1_500}
QUICK = {"calls": 20_000, "sdk_calls": 100}


def _stub() -> None:
    return None


def _is_ours(path: str) -> bool:
    return any(part in path for part in OURS) and "site-packages" not in path


def _self_times(root: Frame) -> dict[tuple[str, str, int], float]:
    """Self time per (function, file, line), summed over every place it occurs."""
    totals: dict[tuple[str, str, int], float] = {}
    stack = [root]
    while stack:
        frame = stack.pop()
        stack.extend(c for c in frame.children if not c.is_synthetic)
        key = (frame.function, frame.file_path or "?", frame.line_no or 0)
        totals[key] = totals.get(key, 0.0) + frame.total_self_time
    return totals


def _short(path: str) -> str:
    for marker in ("site-packages/", "/src/", "/work/wt/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def _summary(session: Session, top: int) -> dict[str, Any]:
    root = session.root_frame()
    if root is None:
        return {"samples_s": 0.0, "top": [], "top_ours": [], "ours_share_pct": 0.0}
    totals = _self_times(root)
    whole = sum(totals.values()) or 1.0

    def rows(items: list[tuple[tuple[str, str, int], float]]) -> list[dict[str, Any]]:
        return [
            {
                "function": function,
                "where": f"{_short(path)}:{line}",
                "self_s": round(seconds, 4),
                "share_pct": round(100 * seconds / whole, 2),
            }
            for (function, path, line), seconds in items[:top]
        ]

    ranked = sorted(totals.items(), key=lambda item: item[1], reverse=True)
    ours = [item for item in ranked if _is_ours(item[0][1])]
    return {
        "samples_s": round(whole, 3),
        "top": rows(ranked),
        "top_ours": rows(ours),
        "ours_share_pct": round(100 * sum(s for _, s in ours) / whole, 2),
    }


def _profile(run: Callable[[], None]) -> Session:
    profiler = Profiler(interval=INTERVAL_S, async_mode="disabled")
    profiler.start()
    try:
        run()
    finally:
        session = profiler.stop()
    return session


def _wrap_target(calls: int) -> Callable[[], None]:
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1e9, max_steps=10**12))
    if ctx.wrap_llm_call(_stub) is not Decision.ALLOW:
        raise RuntimeError("the warm-up call was not allowed")

    def run() -> None:
        wrap = ctx.wrap_llm_call
        for _ in range(calls):
            wrap(_stub)

    return run


def _openai_target(calls: int) -> tuple[Callable[[], None], Callable[[], None]]:
    import openai
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from veronica_otel.instrumentors.openai import OpenAIInstrumentor
    from veronica_otel.testing import FakeLLMServer

    class _Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Drop()))
    trace.set_tracer_provider(provider)
    server = FakeLLMServer(output_tokens=5).start()
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="bench", max_retries=0)
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1e9, max_steps=10**12))
    messages = [{"role": "user", "content": "Say hello in five words."}]

    def call() -> None:
        client.chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=5)

    with ctx:
        call()  # warm: connection open, prices resolved

    def run() -> None:
        with ctx:
            for _ in range(calls):
                call()
        if ctx.snapshot().steps != calls + 1:
            raise RuntimeError("the chain did not count one step per call")

    def close() -> None:
        instrumentor.uninstrument()
        client.close()
        server.stop()
        provider.shutdown()

    return run, close


def _html_path(base: str, target: str) -> Path:
    path = Path(base)
    return path.with_name(f"{path.stem}-{target}{path.suffix or '.html'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke: a few seconds")
    parser.add_argument("--calls", type=int, help=f"wrap_llm_call calls ({DEFAULT['calls']})")
    parser.add_argument("--sdk-calls", type=int, help=f"openai calls ({DEFAULT['sdk_calls']})")
    parser.add_argument("--top", type=int, default=12, help="frames listed per target (12)")
    parser.add_argument("--html", help="also write pyinstrument's HTML view per target here")
    args = parser.parse_args(argv)
    preset = QUICK if args.quick else DEFAULT
    calls = args.calls or preset["calls"]
    sdk_calls = args.sdk_calls or preset["sdk_calls"]
    if calls < 1 or sdk_calls < 1 or args.top < 1:
        parser.error("--calls, --sdk-calls and --top must be positive")
    logging.disable(logging.CRITICAL)

    began = time.perf_counter()
    targets: dict[str, Any] = {}
    html: dict[str, str] = {}
    sessions: dict[str, Session] = {"wrap_llm_call": _profile(_wrap_target(calls))}
    run, close = _openai_target(sdk_calls)
    try:
        sessions["openai_instrumented"] = _profile(run)
    finally:
        close()
    for name, session in sessions.items():
        n = calls if name == "wrap_llm_call" else sdk_calls
        targets[name] = {"calls": n, **_summary(session, args.top)}
        targets[name]["us_per_call_profiled"] = round(1e6 * session.duration / n, 2)
        if args.html:
            from pyinstrument.renderers import HTMLRenderer

            path = _html_path(args.html, name)
            path.write_text(HTMLRenderer().render(session), encoding="utf-8")
            html[name] = str(path)

    report: dict[str, Any] = {
        **environment("hot_path_profile"),
        "packages": {
            "veronica_otel": veronica_otel.__version__,
            "pyinstrument": importlib.metadata.version("pyinstrument"),
            "openai": importlib.metadata.version("openai"),
        },
        "parameters": {
            "quick": args.quick,
            "interval_s": INTERVAL_S,
            "top": args.top,
            "ours": "frames whose file is in veronica_otel (src, instrumentors, exporters)",
        },
        "targets": targets,
        "html": html or None,
        "elapsed_s": round(time.perf_counter() - began, 1),
    }
    return emit(report)


if __name__ == "__main__":
    raise SystemExit(main())
