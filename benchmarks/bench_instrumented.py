"""Per-call wall time of real SDK calls: bare, observed (one GenAI span) and contained.

Every call is a real ``openai`` (and, once its instrumentor exists,
``anthropic``) SDK call to the in-process :class:`~veronica_otel.testing.FakeLLMServer`
(``output_tokens=5``, ``max_tokens=5``), so the figures include the SDK, HTTP
over loopback and the fake server's work. Variants:

* ``openai_bare``: ``client.chat.completions.create(model="gpt-4o-mini",
  messages=[...], max_tokens=5)`` with nothing installed;
* ``openai_observe``: the same with a minimal observe-only ``wrapt`` wrapper on
  ``openai._base_client.SyncAPIClient.request`` (defined here) that opens a
  ``chat {model}`` CLIENT span with the GenAI attributes and, after the call,
  the usage read from the result. It enforces nothing: it is what observing
  costs;
* ``openai_enforce``: ``OpenAIInstrumentor().instrument()`` (this project),
  with an active ``ExecutionContext(ExecutionConfig(max_cost_usd=1e9,
  max_steps=10**9))``;
* ``anthropic_bare`` / ``anthropic_observe`` / ``anthropic_enforce``: if
  ``veronica_otel.instrumentors.anthropic`` can be imported,
  ``anthropic.Anthropic(...).messages.create(model="claude-3-5-haiku-latest",
  max_tokens=5, ...)`` with anthropic's own tracing off (``open_telemetry=False``),
  on (``open_telemetry={}``: its own CLIENT span is the observe baseline), and
  on with ``AnthropicInstrumentor().instrument()`` enforcing on top of it.
  Otherwise ``anthropic`` is ``null`` with the reason; the script picks the
  module up as soon as it exists.

Fairness and checks:

* One process, one SDK ``TracerProvider`` (a ``BatchSpanProcessor`` feeding an
  exporter that drops every span) for every variant, so span cost is equal.
* Interleaved: every round walks over the batches (``--batch`` calls), and each
  batch runs every variant once, in an order rotated per round. The figure
  per variant is the median over rounds of each round's mean ms/call (the min
  and every round are in the JSON). ``added_us`` (variant minus ``bare``, the
  basis of the ratios and targets) is the median over all batches of the
  paired difference to the ``bare`` batch of the same cycle, which cancels
  load drift best; the difference of the medians (``added_us_of_medians``) and
  of the mins are reported too.
* Besides wall time, the calling thread's CPU time (``time.thread_time_ns``)
  is reported (``cpu_*``): the fake server and the span processor's export
  thread run on other threads, so it is the SDK's and the instrumentation's
  own work, without waiting or preemption. It is far less noisy on a shared
  machine.
* Exactly one instrumentation is installed per batch: before each batch the
  script installs or removes wrappers (``instrument()`` / ``uninstrument()`` on
  the ``BaseInstrumentor`` singletons, ``wrapt`` wrap / unwrap for the observe
  wrapper) and then checks which wrapper sits on ``SyncAPIClient.request`` and
  which instrumentors report themselves instrumented.
* Every batch runs inside a fresh ``ExecutionContext`` entered and left outside
  the timed window (uninstrumented variants ignore it). After each batch the
  script checks that the chain counted one step per call for ``enforce`` and
  none otherwise, and that the server saw exactly one request per call.
* Before timing, one untimed batch per variant records its spans and checks
  them: no call span for ``bare``, exactly one per call carrying the GenAI
  usage for ``observe``, and ``veronica.*`` attributes on the call spans for
  ``enforce``.
* ``gc`` is frozen after set-up, collected before and disabled during each
  timed window; timing is ``time.perf_counter_ns``; one untimed call per batch
  warms the connection and the freshly installed wrappers.
* Unless ``--no-child``, the script then runs itself with ``--no-sdk`` in a
  subprocess (no ``TracerProvider`` configured: the kernel needs none; every
  span is a no-op) for the same variants with fewer rounds, and merges that
  JSON under ``no_sdk``. There ``observe`` costs next to nothing, so the
  figure that matters is ``enforce`` over ``bare``; for anthropic, compare
  ``enforce`` with ``observe`` too, which is the same client (its tracing on,
  here a no-op) without our instrumentation.

Prints one JSON object to stdout. Usage::

    .venv/bin/python benchmarks/bench_instrumented.py            # default, ~40-90 s
    .venv/bin/python benchmarks/bench_instrumented.py --quick    # CI smoke, ~10 s (mostly imports)
    .venv/bin/python benchmarks/bench_instrumented.py --rounds 20 --calls 300 --batch 50
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import importlib
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import openai
import openai._base_client as openai_base
from opentelemetry import trace
from opentelemetry.instrumentation.utils import unwrap
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind
from wrapt import wrap_function_wrapper

import veronica_otel
from veronica_otel import ExecutionConfig, ExecutionContext
from veronica_otel.instrumentors import openai as ours_openai
from veronica_otel.testing import FakeLLMServer

OPENAI_MODEL = "gpt-4o-mini"
ANTHROPIC_MODEL = "claude-3-5-haiku-latest"
OUTPUT_TOKENS = 5
MAX_TOKENS = 5
MESSAGES: list[dict[str, str]] = [{"role": "user", "content": "Say hello in five words."}]
LARGE_COST_USD = 1e9
LARGE_STEPS = 10**9
ANTHROPIC_MODULE = "veronica_otel.instrumentors.anthropic"

TARGET_OVER_OBSERVE = 1.3
TARGET_OVER_BARE = 0.05

DEFAULT_ROUNDS = 8
DEFAULT_CALLS = 250
DEFAULT_BATCH = 25
QUICK_ROUNDS = 2
QUICK_CALLS = 20
QUICK_BATCH = 10
CHILD_ROUND_SHARE = 0.5  # the --no-sdk child runs this share of the rounds
WARMUP_CALLS = 1  # untimed calls at the start of every batch
CHECK_CALLS = 20  # calls per variant in the untimed span check

PACKAGES = (
    "veronica-otel",
    "openai",
    "anthropic",
    "httpx2",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-instrumentation",
    "wrapt",
    "genai-prices",
)

KINDS = ("bare", "observe", "enforce")

# Patch states: exactly one of these is installed during a batch.
NONE, OPENAI_OBSERVE, OPENAI_OURS, ANTHROPIC_OURS = (
    "none",
    "openai_observe",
    "openai_ours",
    "anthropic_ours",
)


# -- the observe-only baseline ------------------------------------------------

_observe_tracer = trace.get_tracer("bench.observe_only", "0")


def observe_wrapper(extra: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """A minimal GenAI span around one openai API call; observes, enforces nothing.

    With ``extra``, those attributes are set too, with the usage, in one
    ``set_attributes`` call (``bench_instructions.py``'s telemetry floor).
    """

    def wrapper(
        wrapped: Callable[..., Any],
        instance: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        options = args[1] if len(args) > 1 else kwargs.get("options")
        if not str(getattr(options, "url", "")).endswith("/chat/completions"):
            return wrapped(*args, **kwargs)
        body = getattr(options, "json_data", None)
        model = str(body.get("model") or "unknown") if isinstance(body, Mapping) else "unknown"
        with _observe_tracer.start_as_current_span(
            f"chat {model}",
            kind=SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "openai",
                "gen_ai.request.model": model,
            },
        ) as span:
            result = wrapped(*args, **kwargs)
            usage = getattr(result, "usage", None)
            if usage is not None and span.is_recording():
                if extra is None:
                    span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
                    span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
                else:
                    span.set_attributes(
                        {
                            "gen_ai.usage.input_tokens": usage.prompt_tokens,
                            "gen_ai.usage.output_tokens": usage.completion_tokens,
                            **extra,
                        }
                    )
            return result

    return wrapper


_observe_request = observe_wrapper()


# -- the span sink ---------------------------------------------------------------


class DropExporter(SpanExporter):
    """Drops every span (returns SUCCESS); keeps them only while ``record`` is set."""

    def __init__(self) -> None:
        self.record = False
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.record:
            self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


# -- which instrumentation is installed ------------------------------------------


class Patches:
    """Installs exactly one instrumentation at a time and checks that it did."""

    def __init__(self, anthropic_instrumentor: Any | None) -> None:
        self.openai_ours = ours_openai.OpenAIInstrumentor()
        self.anthropic_ours = anthropic_instrumentor
        self.active = NONE
        self.switches = 0
        self.verify(NONE)

    def activate(self, state: str) -> None:
        if state != self.active:
            self._off(self.active)
            self.active = NONE
            self._on(state)
            self.active = state
            self.switches += 1
        self.verify(state)

    def _on(self, state: str) -> None:
        if state == OPENAI_OBSERVE:
            wrap_function_wrapper(openai_base, "SyncAPIClient.request", _observe_request)
        elif state == OPENAI_OURS:
            self.openai_ours.instrument()
        elif state == ANTHROPIC_OURS:
            if self.anthropic_ours is None:
                raise RuntimeError("no anthropic instrumentor to install")
            self.anthropic_ours.instrument()

    def _off(self, state: str) -> None:
        if state == OPENAI_OBSERVE:
            unwrap(openai_base.SyncAPIClient, "request")
        elif state == OPENAI_OURS:
            self.openai_ours.uninstrument()
        elif state == ANTHROPIC_OURS and self.anthropic_ours is not None:
            self.anthropic_ours.uninstrument()

    def verify(self, state: str) -> None:
        attr = openai_base.SyncAPIClient.__dict__["request"]
        # A wrapt wrapper names its wrapper; our plain hooks (instrumentors._hooks) too.
        wrapper = getattr(attr, "_self_wrapper", None) or getattr(attr, "veronica_hook", None)
        expected_wrapper = {OPENAI_OBSERVE: _observe_request, OPENAI_OURS: ours_openai._request}
        if wrapper is not expected_wrapper.get(state):
            raise RuntimeError(f"{state}: SyncAPIClient.request is wrapped by {wrapper!r}")
        if self.openai_ours.is_instrumented_by_opentelemetry != (state == OPENAI_OURS):
            raise RuntimeError(f"{state}: OpenAIInstrumentor state is wrong")
        if (
            self.anthropic_ours is not None
            and self.anthropic_ours.is_instrumented_by_opentelemetry != (state == ANTHROPIC_OURS)
        ):
            raise RuntimeError(f"{state}: AnthropicInstrumentor state is wrong")

    def close(self) -> None:
        self._off(self.active)
        self.active = NONE
        self.verify(NONE)


# -- variants ------------------------------------------------------------------------


@dataclass
class Variant:
    name: str
    library: str
    kind: str  # bare | observe | enforce
    patch: str
    call: Callable[[], Any]
    rounds_ms: list[float] = field(default_factory=list)  # per-round mean wall ms/call
    rounds_cpu_ms: list[float] = field(default_factory=list)  # same, client-thread CPU
    batch_ms: list[float] = field(default_factory=list)  # per-batch mean wall ms/call
    batch_cpu_ms: list[float] = field(default_factory=list)
    batches: int = 0
    spans: dict[str, Any] | None = None


def _make_context() -> ExecutionContext:
    return ExecutionContext(ExecutionConfig(max_cost_usd=LARGE_COST_USD, max_steps=LARGE_STEPS))


def _openai_variants(server: FakeLLMServer, kinds: Sequence[str]) -> list[Variant]:
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="test", max_retries=0)
    create = client.chat.completions.create

    def call() -> Any:
        return create(model=OPENAI_MODEL, messages=MESSAGES, max_tokens=MAX_TOKENS)  # type: ignore[arg-type]

    patches = {"bare": NONE, "observe": OPENAI_OBSERVE, "enforce": OPENAI_OURS}
    return [Variant(f"openai_{k}", "openai", k, patches[k], call) for k in kinds]


def _load_anthropic_instrumentor() -> tuple[Any | None, str | None]:
    """``AnthropicInstrumentor()``, or None and why it is not available."""
    try:
        import anthropic  # noqa: F401
    except Exception as exc:
        return None, f"anthropic not importable: {type(exc).__name__}: {exc}"
    try:
        module: ModuleType = importlib.import_module(ANTHROPIC_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name == ANTHROPIC_MODULE:
            return None, f"{ANTHROPIC_MODULE} does not exist yet"
        return None, f"{ANTHROPIC_MODULE} failed to import: {type(exc).__name__}: {exc}"
    except Exception as exc:
        return None, f"{ANTHROPIC_MODULE} failed to import: {type(exc).__name__}: {exc}"
    cls = getattr(module, "AnthropicInstrumentor", None)
    if cls is None:
        return None, f"{ANTHROPIC_MODULE} has no AnthropicInstrumentor"
    try:
        return cls(), None
    except Exception as exc:
        return None, f"AnthropicInstrumentor() failed: {type(exc).__name__}: {exc}"


def _anthropic_variants(server: FakeLLMServer, kinds: Sequence[str]) -> list[Variant]:
    import anthropic

    off = anthropic.Anthropic(
        base_url=server.anthropic_base_url, api_key="test", max_retries=0, open_telemetry=False
    )
    # Given explicitly (even empty), the option ignores ANTHROPIC_OPEN_TELEMETRY*:
    # traces on, metadata only, the global tracer provider.
    on = anthropic.Anthropic(
        base_url=server.anthropic_base_url, api_key="test", max_retries=0, open_telemetry={}
    )

    def caller(client: Any) -> Callable[[], Any]:
        create = client.messages.create

        def call() -> Any:
            return create(model=ANTHROPIC_MODEL, max_tokens=MAX_TOKENS, messages=MESSAGES)

        return call

    table = {
        "bare": (NONE, caller(off)),
        "observe": (NONE, caller(on)),
        "enforce": (ANTHROPIC_OURS, caller(on)),
    }
    return [Variant(f"anthropic_{k}", "anthropic", k, *table[k]) for k in kinds]


# -- running -------------------------------------------------------------------------


def _batch(variant: Variant, n: int, patches: Patches, server: FakeLLMServer) -> tuple[int, int]:
    """One batch of ``n`` timed calls (plus untimed warm-up).

    Returns (wall ns, CPU ns of this thread). The fake server and the span
    processor run on other threads, so the CPU figure is the calling thread's
    own work: the SDK and the instrumentation, without waiting or preemption.
    """
    patches.activate(variant.patch)
    ctx = _make_context()
    call = variant.call
    before = server.request_count
    with ctx:
        for _ in range(WARMUP_CALLS):
            call()
        it = range(n)
        gc.collect()
        gc.disable()
        try:
            c0 = time.thread_time_ns()
            t0 = time.perf_counter_ns()
            for _ in it:
                call()
            elapsed = time.perf_counter_ns() - t0
            cpu = time.thread_time_ns() - c0
        finally:
            gc.enable()
    total = n + WARMUP_CALLS
    steps = ctx.snapshot().steps
    expected = total if variant.kind == "enforce" else 0
    if steps != expected:
        raise RuntimeError(f"{variant.name}: chain counted {steps} steps, expected {expected}")
    sent = server.request_count - before
    if sent != total:
        raise RuntimeError(f"{variant.name}: server saw {sent} requests for {total} calls")
    variant.batches += 1
    return elapsed, cpu


def _check_spans(
    variant: Variant,
    patches: Patches,
    server: FakeLLMServer,
    provider: TracerProvider,
    exporter: DropExporter,
) -> None:
    """Untimed: run a batch while recording spans, and check what it emitted."""
    provider.force_flush()
    exporter.spans.clear()
    exporter.record = True
    try:
        _batch(variant, CHECK_CALLS, patches, server)
        provider.force_flush()
    finally:
        exporter.record = False
    spans = list(exporter.spans)
    exporter.spans.clear()
    total = CHECK_CALLS + WARMUP_CALLS
    client = [s for s in spans if s.kind == SpanKind.CLIENT]
    attrs = [dict(s.attributes or {}) for s in client]
    with_usage = sum(1 for a in attrs if a.get("gen_ai.usage.output_tokens") == OUTPUT_TOKENS)
    with_chain = sum(1 for a in attrs if "veronica.chain.id" in a)
    variant.spans = {
        "client_spans_per_call": round(len(client) / total, 3),
        "with_usage_per_call": round(with_usage / total, 3),
        "with_veronica_attributes_per_call": round(with_chain / total, 3),
        "client_span_names": sorted({s.name for s in client}),
    }
    if variant.kind == "bare" and client:
        raise RuntimeError(f"{variant.name}: emitted {len(client)} call spans, expected none")
    if variant.kind == "observe" and (len(client) != total or with_usage != total):
        raise RuntimeError(
            f"{variant.name}: spans {variant.spans}, expected one with usage per call"
        )
    if variant.kind == "observe" and with_chain:
        raise RuntimeError(f"{variant.name}: an observe-only span carries veronica.* attributes")
    if variant.kind == "enforce" and with_chain < total:
        raise RuntimeError(
            f"{variant.name}: spans {variant.spans}, expected veronica.* on each call"
        )


def _run(
    variants: list[Variant],
    patches: Patches,
    server: FakeLLMServer,
    rounds: int,
    calls: int,
    batch: int,
) -> None:
    sizes = [batch] * (calls // batch)
    if calls % batch:
        sizes.append(calls % batch)
    count = len(variants)
    for round_index in range(rounds):
        start = round_index % count
        order = variants[start:] + variants[:start]
        wall = dict.fromkeys((v.name for v in variants), 0)
        cpu = dict.fromkeys((v.name for v in variants), 0)
        for size in sizes:
            for variant in order:
                elapsed, used = _batch(variant, size, patches, server)
                wall[variant.name] += elapsed
                cpu[variant.name] += used
                variant.batch_ms.append(elapsed / size / 1e6)
                variant.batch_cpu_ms.append(used / size / 1e6)
        for variant in variants:
            variant.rounds_ms.append(wall[variant.name] / calls / 1e6)
            variant.rounds_cpu_ms.append(cpu[variant.name] / calls / 1e6)


# -- reporting -----------------------------------------------------------------------


def _paired_us(values: list[float], bare: list[float]) -> float:
    """Median over batches of (variant - bare) in the same cycle, in microseconds."""
    return statistics.median((v - b) * 1000 for v, b in zip(values, bare, strict=True))


def _summary(variant: Variant, bare: Variant | None) -> dict[str, Any]:
    median = statistics.median(variant.rounds_ms)
    out: dict[str, Any] = {
        "median_ms": round(median, 4),
        "min_ms": round(min(variant.rounds_ms), 4),
        "rounds_ms": [round(x, 4) for x in variant.rounds_ms],
        "cpu_median_ms": round(statistics.median(variant.rounds_cpu_ms), 4),
        "cpu_min_ms": round(min(variant.rounds_cpu_ms), 4),
    }
    if bare is not None and variant is not bare:
        out["added_us"] = round(_paired_us(variant.batch_ms, bare.batch_ms), 1)
        out["added_us_of_medians"] = round((median - statistics.median(bare.rounds_ms)) * 1000, 1)
        out["added_us_of_mins"] = round((min(variant.rounds_ms) - min(bare.rounds_ms)) * 1000, 1)
        out["cpu_added_us"] = round(_paired_us(variant.batch_cpu_ms, bare.batch_cpu_ms), 1)
    if variant.spans is not None:
        out["spans"] = variant.spans
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return round(a / b, 4)


def _ratios(
    enforce: float | None, observe: float | None, bare: float, prefix: str = ""
) -> dict[str, Any]:
    return {
        f"{prefix}enforce_added_over_observe_added": _ratio(enforce, observe),
        f"{prefix}enforce_added_over_bare": _ratio(enforce, bare),
        f"{prefix}enforce_minus_observe_us": None
        if enforce is None or observe is None
        else round(enforce - observe, 1),
    }


def _library_report(variants: list[Variant]) -> dict[str, Any]:
    by_kind = {v.kind: v for v in variants}
    bare = by_kind.get("bare")
    results = {v.kind: _summary(v, bare) for v in variants}
    report: dict[str, Any] = {"results": results}
    if bare is None:
        return report
    enforce = results.get("enforce")
    observe = results.get("observe")

    def added(result: dict[str, Any] | None, key: str) -> float | None:
        return None if result is None else result[key]

    bare_us = statistics.median(bare.rounds_ms) * 1000
    bare_cpu_us = statistics.median(bare.rounds_cpu_ms) * 1000
    ratios = _ratios(added(enforce, "added_us"), added(observe, "added_us"), bare_us)
    ratios.update(
        _ratios(
            added(enforce, "added_us_of_medians"),
            added(observe, "added_us_of_medians"),
            bare_us,
            "of_medians_",
        )
    )
    ratios.update(
        _ratios(added(enforce, "cpu_added_us"), added(observe, "cpu_added_us"), bare_cpu_us, "cpu_")
    )
    report["ratios"] = ratios
    observe_added = added(observe, "added_us")
    if observe_added is not None and observe_added <= 0:
        report["note"] = "observe added no measurable time in this run: the ratio is undefined"

    def met(value: float | None, ok: Callable[[float], bool]) -> bool | None:
        return None if value is None else ok(value)

    def within_observe(x: float) -> bool:
        return x <= TARGET_OVER_OBSERVE

    def within_bare(x: float) -> bool:
        return x < TARGET_OVER_BARE

    report["targets"] = {
        "enforce_added_over_observe_added_max": TARGET_OVER_OBSERVE,
        "enforce_added_over_bare_below": TARGET_OVER_BARE,
        "measure": "wall: added_us (median of per-batch paired differences to bare); "
        "cpu: cpu_added_us (the same on the calling thread's CPU time)",
        "met_over_observe": met(ratios["enforce_added_over_observe_added"], within_observe),
        "met_over_bare": met(ratios["enforce_added_over_bare"], within_bare),
        "cpu_met_over_observe": met(ratios["cpu_enforce_added_over_observe_added"], within_observe),
        "cpu_met_over_bare": met(ratios["cpu_enforce_added_over_bare"], within_bare),
    }
    return report


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _run_child(rounds: int, calls: int, batch: int) -> tuple[dict[str, Any] | None, str | None]:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--no-sdk",
        "--rounds",
        str(rounds),
        "--calls",
        str(calls),
        "--batch",
        str(batch),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"--no-sdk child failed: {type(exc).__name__}: {exc}"
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-3:]
        return None, f"--no-sdk child exited {proc.returncode}: {' | '.join(tail)}"
    try:
        return json.loads(proc.stdout), None
    except ValueError as exc:
        return None, f"--no-sdk child printed no JSON: {exc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=None, help=f"default {DEFAULT_ROUNDS}")
    parser.add_argument(
        "--calls", type=int, default=None, help=f"calls per variant per round ({DEFAULT_CALLS})"
    )
    parser.add_argument(
        "--batch", type=int, default=None, help=f"calls per batch and context ({DEFAULT_BATCH})"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"CI smoke: {QUICK_ROUNDS} rounds of {QUICK_CALLS} calls in batches of {QUICK_BATCH}",
    )
    parser.add_argument(
        "--no-sdk",
        action="store_true",
        help="no TracerProvider: every span is a no-op (run as a child)",
    )
    parser.add_argument("--no-child", action="store_true", help="skip the --no-sdk child run")
    args = parser.parse_args(argv)
    rounds = (
        args.rounds if args.rounds is not None else (QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS)
    )
    calls = args.calls if args.calls is not None else (QUICK_CALLS if args.quick else DEFAULT_CALLS)
    batch = args.batch if args.batch is not None else (QUICK_BATCH if args.quick else DEFAULT_BATCH)
    batch = min(batch, calls)
    if rounds < 1 or calls < 1 or batch < 1:
        parser.error("--rounds, --calls and --batch must be positive")

    began = time.perf_counter()
    provider: TracerProvider | None = None
    exporter: DropExporter | None = None
    if not args.no_sdk:
        exporter = DropExporter()
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    elif isinstance(trace.get_tracer_provider(), TracerProvider):
        raise RuntimeError("--no-sdk: an SDK TracerProvider is configured (OTEL auto-config?)")

    anthropic_instrumentor, anthropic_missing = _load_anthropic_instrumentor()
    patches = Patches(anthropic_instrumentor)
    with FakeLLMServer(output_tokens=OUTPUT_TOKENS, max_recorded=100) as server:
        openai_variants = _openai_variants(server, KINDS)
        anthropic_variants = (
            _anthropic_variants(server, KINDS) if anthropic_instrumentor is not None else []
        )

        def check(variant: Variant) -> None:  # warm-up and sanity check, untimed
            if provider is not None and exporter is not None:
                _check_spans(variant, patches, server, provider, exporter)
            else:
                _batch(variant, CHECK_CALLS, patches, server)
            variant.batches = 0

        for variant in openai_variants:
            check(variant)
        try:
            for variant in anthropic_variants:
                check(variant)
        except Exception as exc:  # a half-written instrumentor must not sink openai's figures
            anthropic_missing = (
                f"anthropic variants failed their check: {type(exc).__name__}: {exc}"
            )
            anthropic_variants = []
            patches.activate(NONE)

        variants = [*openai_variants, *anthropic_variants]
        # Everything alive now (modules, clients, caches) moves to the permanent
        # generation, so the gc.collect() before each timed window stays cheap.
        gc.collect()
        gc.freeze()
        _run(variants, patches, server, rounds, calls, batch)
        switches = patches.switches
        patches.close()
    if provider is not None:
        provider.shutdown()
    measured_s = time.perf_counter() - began

    no_sdk: dict[str, Any] | None = None
    no_sdk_missing: str | None = None
    if not args.no_sdk and not args.no_child:
        child_rounds = max(1, round(rounds * CHILD_ROUND_SHARE))
        no_sdk, no_sdk_missing = _run_child(child_rounds, calls, batch)
        if no_sdk is not None:
            no_sdk = {
                k: no_sdk.get(k)
                for k in (
                    "parameters",
                    "openai",
                    "anthropic",
                    "anthropic_unavailable_reason",
                    "elapsed_s",
                )
            }

    report: dict[str, Any] = {
        "benchmark": "instrumented_sdk_call",
        "unit": "ms per call (added_us: microseconds per call over the bare variant)",
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "packages": {"veronica_otel": veronica_otel.__version__, **_versions()},
        "parameters": {
            "rounds": rounds,
            "calls_per_variant_per_round": calls,
            "batch_size": batch,
            "warmup_calls_per_batch": WARMUP_CALLS,
            "quick": args.quick,
            "sdk": "none (no TracerProvider)"
            if args.no_sdk
            else "TracerProvider + BatchSpanProcessor + exporter that drops spans",
            "fake_server": {"output_tokens": OUTPUT_TOKENS},
            "openai_call": f"client.chat.completions.create(model={OPENAI_MODEL!r}, "
            f"messages=[1 user message], max_tokens={MAX_TOKENS})",
            "anthropic_call": f"client.messages.create(model={ANTHROPIC_MODEL!r}, "
            f"max_tokens={MAX_TOKENS}, messages=[1 user message])",
            "config": {"max_cost_usd": LARGE_COST_USD, "max_steps": LARGE_STEPS},
            "instrumentation_switches": switches,
            "method": "interleaved round-robin per batch (order rotated per round), exactly "
            "one instrumentation installed per batch and verified, fresh ExecutionContext "
            "per batch entered outside the timed window, gc disabled while timing; "
            "median_ms: median of per-round mean ms/call; added_us: median of per-batch "
            "paired differences to bare; cpu_*: the calling thread's CPU time",
        },
        "openai": _library_report(openai_variants),
        "anthropic": _library_report(anthropic_variants) if anthropic_variants else None,
        "anthropic_unavailable_reason": anthropic_missing if not anthropic_variants else None,
        "measured_s": round(measured_s, 1),
    }
    if not args.no_sdk:
        report["no_sdk"] = no_sdk
        report["no_sdk_unavailable_reason"] = (
            "skipped (--no-child)" if args.no_child else no_sdk_missing
        )
    report["elapsed_s"] = round(time.perf_counter() - began, 1)
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
