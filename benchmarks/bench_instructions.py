"""Machine instructions per real SDK call, counted by cachegrind: a ratio free of timing noise.

``bench_instrumented.py`` times calls, and on a shared machine what a few
microseconds of instrumentation add moves from run to run by as much as the
figure itself. Instruction counts do not: under ``valgrind --tool=cachegrind``
the same program on the same input executes the same instructions whatever
else the machine is doing. This script counts them for the same variants as
``bench_instrumented.py`` (its observe-only wrapper, clients and patch states
are imported from it, so both measure the same thing):

* ``openai_bare`` / ``openai_observe`` / ``openai_enforce``;
* ``anthropic_bare`` (its tracing off) / ``anthropic_observe`` (its own
  CLIENT span) / ``anthropic_enforce`` (our instrumentor on top of it) /
  ``anthropic_enforce_off`` (our instrumentor on the client with its tracing
  off: we open our own GenAI span, as ``genai-anthropic`` does; the one the
  anthropic targets read, apples to apples);
* peers, each alone on a bare client (observe only, unless noted): the
  official instrumentors, the reference of the targets: ``openai_contrib``
  (``opentelemetry-instrumentation-openai-v2`` 2.4b0, the one ours replaces),
  ``openai_genai`` and ``anthropic_genai`` (their successors,
  ``opentelemetry-instrumentation-genai-openai`` and ``-genai-anthropic``
  1.3b0; anthropic's on the client with the SDK's own tracing off, one span
  a call); and ``openai_openllmetry`` (OpenLLMetry's
  ``opentelemetry-instrumentation-openai``), ``openai_openlit``
  (``openlit.init``) and ``openai_litellm`` (``litellm.completion`` to the
  same server, with its in-process ``max_budget``). They run from fresh venvs
  this script builds with :mod:`tests._venvs` (cached between runs: the e2e
  tests' ``PEERS`` set, the same plus ``litellm``, and ``GENAI_PEERS``: the
  successors need a newer ``opentelemetry-util-genai`` than openai-v2
  allows); every other openai variant runs in the classic peers' venv when
  there is one, so they share one set of package versions (the genai venv
  has the same openai, anthropic and OpenTelemetry releases). A peer that
  could not be installed or loaded is listed under ``missing`` with the
  reason. Peers run in full runs, and with ``--quick`` only when ``--peers``
  is given; ``--peers LIST`` picks some;
* ``openai_span``: a bare SDK span around the call with the same sixteen
  attributes as our openai call span (constant values), made the cheapest
  public way (its first attributes given to ``start_span``, made current, the
  rest set in one ``set_attributes``, ended by hand): what any instrumentor
  making that span pays the SDK, the span floor of the targets;
  ``anthropic_span`` is the same for our anthropic span (fourteen
  attributes) on the client with its tracing off, the floor of
  ``anthropic_enforce_off``. ``anthropic_enforce`` is read over
  ``anthropic_observe`` (the SDK's own span, which ours reuses), reported
  for information (``genai_sdk_span``);
* ``openai_floor``: the observe-only wrapper that also sets, with constant
  values and in one call, the ``veronica.*`` attributes DESIGN.md requires
  on every call span (chain id, decision, cost).
  It checks nothing: it is what the required telemetry alone costs, so
  ``floor`` minus ``observe`` is the part of enforcing's cost that no check,
  however fast, can remove.

Each variant runs in a child process under cachegrind (``--cache-sim=no``),
making real SDK calls over loopback to the in-process
:class:`~veronica_otel.testing.FakeLLMServer` of this (parent) process, so
the server's work is not counted. Where the interpreter's heap and stack land
moves a call's count by up to ~10k instructions over the same code, so each
variant runs in ``--layouts`` layouts (three by default: its environment
padded by 0, 700 and 2,900 bytes) and each count is the median of them, the
per-layout counts reported beside it (``per_layout``). The child has an SDK
``TracerProvider`` whose batch processor never exports during the run (a long
delay and a queue larger than the run), so every span costs the same and no
background thread runs. Each variant runs twice, with ``--low`` and ``--high`` timed calls after
the same warm-up; instructions per call is the difference of the two totals
over the difference of the call counts, which cancels start-up and
interpreter exit. Hash randomisation is fixed (``PYTHONHASHSEED=0``) and
garbage collection is frozen and disabled for the calls.

Every other adapter (``instrumentors/_adapter.py``) has a ``<name>_bare`` and
a ``<name>_enforce`` variant, one row of :data:`ADAPTERS` each: the SDK's
plain chat call to the fake server, without and with its instrumentor
(``genai``: ``models.generate_content``; ``bedrock``: boto3
``bedrock-runtime`` ``converse``; ``mistralai``: ``chat.complete``;
``cohere``: ``ClientV2.chat``; ``ollama``: ``Client.chat``; ``litellm``:
``completion("openai/gpt-4o-mini", api_base=...)``), each asking for 5
output tokens. They run with no ``TracerProvider`` only (their target is a
share of the bare call), under ``no_sdk``; ``--adapters`` runs them alone
(all, or a comma-separated subset).

Unless ``--quick``, every variant but ``floor`` and ``span`` runs again with no
``TracerProvider`` at all (every span a no-op, as in a process with no
OpenTelemetry SDK configured), reported under ``no_sdk``: there ``observe``
costs next to nothing, so read ``enforce`` over ``bare``, which is what
containment itself costs.

Reported per variant: instructions per call; ``added`` over ``bare``; and
each variant's added instructions over the contrib instrumentor's added
(``added_over_contrib_added``) and its instructions over a bare call's
(``over_bare``). The targets (issue 26), with an SDK, against each official
instrumentor (``ratios.over_official``, also a table on stderr): ours
(observe + enforce: ``enforce`` over ``bare``; anthropic: ``enforce_off``) adds
at most 0.8x what the official adds, and enforcement over the span floor
(ours minus its ``span``) at most 0.2x (:data:`OURS`: each row says which of
ours over which floor, and whether the targets read it); with no SDK,
enforcing adds at most 1.0 % of a bare openai call and 2 % of every other
library's and adapter's:
``no_sdk_shares`` has each share, its target and whether it is met (for
anthropic ``enforce_off`` over ``bare``, both with the SDK's own tracing off,
and ``default_client``: ``enforce`` over ``observe``, both on the SDK's
default client, its own tracing on), and
the same table is printed on stderr.
``--skip`` leaves variants out (``openai_observe,openai_floor``: the targets
do not read them).
Instructions are a proxy for CPU time, not a measurement of it: an
instruction that misses the cache costs more than one that hits.

Every child must read the same bytecode: when a module is compiled in one
child and read from its ``.pyc`` in the next, that child's count moves by up to
a million instructions a call. Write the ``.pyc`` files first (``unset
PYTHONDONTWRITEBYTECODE``, ``python -m compileall`` over ``src``,
``benchmarks`` and the venvs, then one ``--dry-run``); a run where an
instrumented variant counts clearly below the bare call is refused.

Prints one JSON object to stdout; ``{"skipped": ...}`` when valgrind is not
installed. Usage::

    .venv/bin/python benchmarks/bench_instructions.py            # ~8 min here
    .venv/bin/python benchmarks/bench_instructions.py --quick    # openai only, few calls
    .venv/bin/python benchmarks/bench_instructions.py --adapters # the other adapters, no SDK
    .venv/bin/python benchmarks/bench_instructions.py --adapters bedrock,ollama --quick
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import os
import re
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

from _report import emit, environment
from wrapt import wrap_function_wrapper

from veronica_otel.testing import FakeLLMServer

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
WARMUP_CALLS = 20
DEFAULT_LOW, DEFAULT_HIGH = 20, 220
QUICK_LOW, QUICK_HIGH = 1, 6
# With an SDK (issue 26), against each official instrumentor's added instructions:
# ours (observe + enforce) at most 0.8x; enforcement over the span floor at most 0.2x.
TARGET_OURS_OVER_OFFICIAL = 0.8
TARGET_ENFORCEMENT_OVER_OFFICIAL = 0.2
TARGET_OVER_BARE = 0.02
# Between two runs of one variant at 20/220 calls the count moves by up to
# about 40k a call; further below the bare call than this is a broken run.
_NOISE_PER_CALL = 100_000
# No TracerProvider: what enforcing may add, as a share of the bare call (issue 26):
# openai 1.0 %, every other library and adapter TARGET_OVER_BARE.
TARGETS_OVER_BARE = {"openai": 0.01}
OUTPUT_TOKENS = 5
# Where the interpreter's heap and stack land moves a call's count by up to
# ~10k (openai, no SDK: 69-80k added over the same code, measured with three
# paddings): each count is the median over these paddings of the child's
# environment, each a layout of its own.
LAYOUT_PADS = (0, 700, 2900)
DEFAULT_LAYOUTS = len(LAYOUT_PADS)
_PAD_VARIABLE = "VERONICA_BENCH_LAYOUT_PAD"
VARIANTS = {
    "openai": ("openai_bare", "openai_observe", "openai_floor", "openai_span", "openai_enforce"),
    "anthropic": (
        "anthropic_bare",
        "anthropic_observe",
        "anthropic_enforce",
        "anthropic_span",
        "anthropic_enforce_off",
    ),
}
SDK_LIBRARIES = ("openai", "anthropic")
PEERS = (
    "openai_contrib",
    "openai_genai",
    "openai_openllmetry",
    "openai_openlit",
    "openai_litellm",
    "anthropic_genai",
)
# The official instrumentors of each library (their kinds): the targets' reference.
OFFICIAL = {"openai": ("contrib", "genai"), "anthropic": ("genai",)}
# Per library, ours against each official instrumentor: (row, our variant, its span
# floor, whether the targets read it). openai: ours and the cheapest SDK span like
# ours. anthropic: ours on a client with the SDK's tracing off (we open our own span,
# as genai-anthropic does) over the cheapest SDK span like it, the one the targets
# read; and, for information, ours on the SDK's default client (its own span on,
# which ours reuses) over that client.
OURS = {
    "openai": (("", "enforce", "span", True),),
    "anthropic": (
        ("", "enforce_off", "span", True),
        ("sdk_span", "enforce", "observe", False),
    ),
}
PROMPT = "Say hello in five words."
_I_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


# -- the child: one variant, N calls, under cachegrind ------------------------------


# What DESIGN.md requires on every call span, with constant values: the floor.
_REQUIRED_ATTRIBUTES = {
    "veronica.chain.id": "0" * 32,
    "veronica.decision": "ALLOW",
    "veronica.cost_usd": 1e-05,
}
# Every attribute our openai call span carries for this call but the three it
# starts with (contrib's, server.*, ours), with constant values: ``openai_span``.
_SPAN_ATTRIBUTES = {
    **_REQUIRED_ATTRIBUTES,
    "gen_ai.request.max_tokens": 5,
    "server.address": "127.0.0.1",
    "server.port": 8000,
    "gen_ai.response.id": "chatcmpl-fake1",
    "gen_ai.response.model": "gpt-4o-mini",
    "openai.response.service_tier": "default",
    "openai.response.system_fingerprint": "fp_fake",
    "gen_ai.response.finish_reasons": ["stop"],
    "gen_ai.usage.input_tokens": 26,
    "gen_ai.usage.output_tokens": 5,
}
# The same for our anthropic call span on a client with the SDK's tracing off
# (eleven after the three it starts with): ``anthropic_span``.
_ANTHROPIC_SPAN_ATTRIBUTES = {
    **_REQUIRED_ATTRIBUTES,
    "gen_ai.request.max_tokens": 5,
    "server.address": "127.0.0.1",
    "server.port": 8000,
    "gen_ai.response.id": "msg_fake000000000000000000000001",
    "gen_ai.response.model": "claude-3-5-haiku-latest",
    "gen_ai.response.finish_reasons": ["end_turn"],
    "gen_ai.usage.input_tokens": 29,
    "gen_ai.usage.output_tokens": 5,
}
# Per library: where the span floor wraps the SDK, its model, and the rest of its attributes.
_SPAN_FLOORS = {
    "openai": ("openai._base_client", "gpt-4o-mini", _SPAN_ATTRIBUTES),
    "anthropic": ("anthropic._base_client", "claude-3-5-haiku-latest", _ANTHROPIC_SPAN_ATTRIBUTES),
}


def _span_wrapper(library: str = "openai") -> Any:
    """The least any instrumentor pays for our call span through the SDK: start it
    with three attributes, make it current, set the others in one call, end it; no
    context manager, no check, nothing read from the call (``<library>_span``)."""
    from opentelemetry import context, trace
    from opentelemetry.trace import SpanKind

    tracer = trace.get_tracer("bench.span_floor", "0")
    _, model, rest = _SPAN_FLOORS[library]
    start = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": library,
        "gen_ai.request.model": model,
    }
    name = f"chat {model}"

    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        span = tracer.start_span(name, kind=SpanKind.CLIENT, attributes=start)
        token = context.attach(trace.set_span_in_context(span))
        try:
            return wrapped(*args, **kwargs)
        finally:
            context.detach(token)
            span.set_attributes(dict(rest))
            span.end()

    return wrapper


def _child(variant: str, calls: int, openai_url: str, anthropic_url: str, sdk: bool) -> int:
    import bench_instrumented as bench
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if sdk:
        provider = TracerProvider()
        provider.add_span_processor(
            BatchSpanProcessor(
                bench.DropExporter(),
                max_queue_size=1 << 20,
                schedule_delay_millis=3_600_000,
                max_export_batch_size=1 << 20,
            )
        )
        trace.set_tracer_provider(provider)
    library, kind = variant.split("_", 1)
    if library in ADAPTERS:
        return _adapter_child(library, kind, calls, anthropic_url)  # the server's root
    server = SimpleNamespace(openai_base_url=openai_url, anthropic_base_url=anthropic_url)
    if variant in PEERS:
        return _peer_child(bench, variant, calls, server)
    # The floors wrap a bare client themselves; enforce_off is ours on a bare client
    # (anthropic: the SDK's own tracing off, so we open our own span).
    client_kind = "bare" if kind in ("floor", "span", "enforce_off") else kind
    anthropic_instrumentor = None
    if library == "anthropic":
        anthropic_instrumentor, reason = bench._load_anthropic_instrumentor()
        if anthropic_instrumentor is None:
            raise SystemExit(f"anthropic variants need the instrumentor: {reason}")
        (chosen,) = bench._anthropic_variants(server, (client_kind,))  # type: ignore[arg-type]
    else:
        (chosen,) = bench._openai_variants(server, (client_kind,))  # type: ignore[arg-type]
    patches = bench.Patches(anthropic_instrumentor)
    patches.activate(bench.ANTHROPIC_OURS if kind == "enforce_off" else chosen.patch)
    if kind in ("floor", "span"):
        floor = (
            bench.observe_wrapper(_REQUIRED_ATTRIBUTES)
            if kind == "floor"
            else _span_wrapper(library)
        )
        wrap_function_wrapper(_SPAN_FLOORS[library][0], "SyncAPIClient.request", floor)
    with bench._make_context() as ctx:
        for _ in range(WARMUP_CALLS):
            chosen.call()
        gc.collect()
        gc.freeze()
        gc.disable()
        for _ in range(calls):
            chosen.call()
        gc.enable()
        steps = ctx.snapshot().steps
    expected = WARMUP_CALLS + calls if kind.startswith("enforce") else 0
    if steps != expected:
        raise SystemExit(f"{variant}: the chain counted {steps} steps, expected {expected}")
    if kind in ("floor", "span"):
        import importlib

        from opentelemetry.instrumentation.utils import unwrap

        unwrap(importlib.import_module(_SPAN_FLOORS[library][0]).SyncAPIClient, "request")
    patches.close()
    return 0


def _peer_child(bench: Any, variant: str, calls: int, server: Any) -> int:
    """One peer on a bare client (litellm: its own ``completion``)."""
    call = _peer_call(bench, variant, server)
    with bench._make_context() as ctx:  # our instrumentor is off: the chain sees nothing
        for _ in range(WARMUP_CALLS):
            call()
        gc.collect()
        gc.freeze()
        gc.disable()
        for _ in range(calls):
            call()
        gc.enable()
        if ctx.snapshot().steps != 0:
            raise SystemExit(f"{variant}: our instrumentor was active")
    return 0


def _peer_call(bench: Any, variant: str, server: Any) -> Any:
    kind = variant.split("_", 1)[1]
    if variant == "anthropic_genai":
        # The official one (opentelemetry-python-genai), on the client with the
        # SDK's own tracing off: one span per call, as ours makes one.
        from opentelemetry.instrumentation.genai.anthropic import (
            AnthropicInstrumentor as GenAIAnthropic,
        )

        GenAIAnthropic().instrument()
        (anthropic_bare,) = bench._anthropic_variants(server, ("bare",))
        return anthropic_bare.call
    if kind == "litellm":
        os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # no fetch of its price map
        import litellm

        litellm.max_budget = 1e9  # its in-process budget, checked and charged per call

        def completion() -> Any:
            return litellm.completion(
                model=f"openai/{bench.OPENAI_MODEL}",
                messages=bench.MESSAGES,
                max_tokens=bench.MAX_TOKENS,
                api_base=server.openai_base_url,
                api_key="test",
                max_retries=0,
            )

        return completion
    if kind == "contrib":
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

        OpenAIInstrumentor().instrument()
    elif kind == "genai":  # contrib openai-v2's successor
        from opentelemetry.instrumentation.genai.openai import OpenAIInstrumentor as GenAIOpenAI

        GenAIOpenAI().instrument()
    elif kind == "openllmetry":
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor as OpenLLMetry

        OpenLLMetry().instrument()
    elif kind == "openlit":
        import json
        import tempfile

        import openlit

        # Its price map, which it would otherwise download at start-up.
        prices = {"chat": {bench.OPENAI_MODEL: {"promptPrice": 0.15, "completionPrice": 0.6}}}
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
            json.dump(prices, handle)
        # It reuses the SDK provider set above (adds no processor to it).
        openlit.init(
            pricing_json=handle.name,
            disable_batch=True,
            disable_metrics=True,
            capture_message_content=False,
            collect_gpu_stats=False,
        )
    (chosen,) = bench._openai_variants(server, ("bare",))
    return chosen.call


# -- the other adapters: one row each -----------------------------------------------


def _genai(base_url: str) -> tuple[Any, Any]:
    from google import genai
    from google.genai import types

    client = genai.Client(api_key="test", http_options=types.HttpOptions(base_url=base_url))
    config = types.GenerateContentConfig(max_output_tokens=OUTPUT_TOKENS)

    def call() -> Any:
        return client.models.generate_content(
            model="gemini-2.5-flash", contents=PROMPT, config=config
        )

    return call, client.close


def _bedrock(base_url: str) -> tuple[Any, Any]:
    import boto3

    client = boto3.client(
        "bedrock-runtime",
        endpoint_url=base_url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    messages = [{"role": "user", "content": [{"text": PROMPT}]}]

    def call() -> Any:
        return client.converse(
            modelId="anthropic.claude-3-haiku-20240307-v1:0",
            messages=messages,
            inferenceConfig={"maxTokens": OUTPUT_TOKENS},
        )

    return call, client.close


def _mistralai(base_url: str) -> tuple[Any, Any]:
    from mistralai.client import Mistral

    client = Mistral(api_key="test", server_url=base_url)
    messages = [{"role": "user", "content": PROMPT}]

    def call() -> Any:
        return client.chat.complete(
            model="mistral-small-latest", messages=messages, max_tokens=OUTPUT_TOKENS
        )

    return call, lambda: client.__exit__(None, None, None)


def _cohere(base_url: str) -> tuple[Any, Any]:
    import cohere

    client = cohere.ClientV2(api_key="test", base_url=base_url)
    messages = [{"role": "user", "content": PROMPT}]

    def call() -> Any:
        return client.chat(model="command-a-03-2025", messages=messages, max_tokens=OUTPUT_TOKENS)

    return call, client._client_wrapper.httpx_client.httpx_client.close


def _ollama(base_url: str) -> tuple[Any, Any]:
    import ollama

    client = ollama.Client(host=base_url)
    messages = [{"role": "user", "content": PROMPT}]
    options = {"num_predict": OUTPUT_TOKENS}

    def call() -> Any:
        return client.chat(model="llama3.2", messages=messages, options=options)

    return call, client._client.close


def _litellm(base_url: str) -> tuple[Any, Any]:
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # no fetch of its price map
    import litellm

    messages = [{"role": "user", "content": PROMPT}]

    def call() -> Any:
        return litellm.completion(
            model="openai/gpt-4o-mini",
            messages=messages,
            max_tokens=OUTPUT_TOKENS,
            api_base=f"{base_url}/v1",
            api_key="test",
            max_retries=0,
        )

    return call, lambda: None


class Adapter(NamedTuple):
    """One adapter's benchmark: its instrumentor and a maker of its SDK call."""

    instrumentor: str  # module:class under veronica_otel.instrumentors
    client: Callable[[str], tuple[Callable[[], Any], Callable[[], Any]]]  # the call, a close
    free: str | None = None  # a price-table pattern priced at zero (local models)


ADAPTERS: dict[str, Adapter] = {
    "genai": Adapter("google_genai:GoogleGenAIInstrumentor", _genai),
    "bedrock": Adapter("bedrock:BedrockInstrumentor", _bedrock),
    "mistralai": Adapter("mistralai:MistralAIInstrumentor", _mistralai),
    "cohere": Adapter("cohere:CohereInstrumentor", _cohere),
    # A local model costs nothing, but a ceiling denies what has no price: say so.
    "ollama": Adapter("ollama:OllamaInstrumentor", _ollama, "ollama:*"),
    "litellm": Adapter("litellm:LiteLLMInstrumentor", _litellm),
}
for _name in ADAPTERS:
    VARIANTS[_name] = (f"{_name}_bare", f"{_name}_enforce")


def _adapter_child(library: str, kind: str, calls: int, base_url: str) -> int:
    """One adapter's SDK call, bare or under its instrumentor, in a chain either way."""
    import importlib

    from veronica_otel import ExecutionConfig, ExecutionContext
    from veronica_otel._pricing import PriceTable, UnitPrices

    adapter = ADAPTERS[library]
    call, close = adapter.client(base_url)
    instrumentor = None
    if kind == "enforce":
        module, name = adapter.instrumentor.split(":")
        found = importlib.import_module(f"veronica_otel.instrumentors.{module}")
        instrumentor = getattr(found, name)()
        instrumentor.instrument()
    prices = None if adapter.free is None else PriceTable({adapter.free: UnitPrices(0, 0, 0, 0)})
    config = ExecutionConfig(max_cost_usd=1e9, max_steps=10**9)
    with ExecutionContext(config, price_table=prices) as ctx:
        for _ in range(WARMUP_CALLS):
            call()
        gc.collect()
        gc.freeze()
        gc.disable()
        for _ in range(calls):
            call()
        gc.enable()
        steps = ctx.snapshot().steps
    expected = WARMUP_CALLS + calls if kind == "enforce" else 0
    if steps != expected:
        raise SystemExit(f"{library}_{kind}: the chain counted {steps} steps, expected {expected}")
    if instrumentor is not None:
        instrumentor.uninstrument()
    close()
    return 0


# -- the parent ----------------------------------------------------------------------


# The venvs peers run from, best first: (name, recipe, the peers it holds).
def _peer_venvs() -> list[tuple[str, tuple[tuple[str, ...], ...], tuple[str, ...]]]:
    sys.path.insert(0, str(ROOT))
    from tests import _venvs

    classic = ("openai_contrib", "openai_openllmetry", "openai_openlit")
    return [
        ("genai", _venvs.GENAI_PEERS, ("openai_genai", "anthropic_genai")),
        ("bench-litellm", (*_venvs.PEERS, ("litellm!=1.107.0",)), (*classic, "openai_litellm")),
        ("peers", _venvs.PEERS, classic),
    ]


def _peer_pythons(wanted: tuple[str, ...]) -> tuple[dict[str, str], dict[str, str]]:
    """The Python each wanted peer runs with (the first venv holding it that
    builds), and the peers with none, with the reason."""
    recipes = _peer_venvs()  # puts the checkout on the path
    from tests import _venvs

    found: dict[str, str] = {}
    missing: dict[str, str] = {}
    for name, recipe, holds in recipes:
        needed = [p for p in holds if p in wanted and p not in found]
        if not needed:
            continue
        try:
            venv = _venvs.venv(name, recipe)
        except subprocess.CalledProcessError as exc:
            reason = _venvs.build_error(exc)
            for peer in needed:
                missing.setdefault(peer, f"venv {name!r} did not build: {reason}")
            continue
        except subprocess.TimeoutExpired:
            for peer in needed:
                missing.setdefault(peer, f"venv {name!r} took too long to build")
            continue
        for peer in needed:
            found[peer] = str(venv / "bin" / "python")
    for peer in wanted:
        if peer not in found:
            missing.setdefault(peer, "not in any venv that built")
    return found, {p: missing[p] for p in wanted if p in missing}


def _loads(python: str, variant: str, server: FakeLLMServer) -> str | None:
    """None when ``variant`` runs (a few calls, no valgrind), else why not."""
    try:
        _count(variant, 1, True, server, python, valgrind=False)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        return str(exc)[-500:]
    return None


def _count(
    variant: str,
    calls: int,
    sdk: bool,
    server: FakeLLMServer,
    python: str = sys.executable,
    *,
    valgrind: bool = True,
    layout: int = 0,
) -> int:
    """Instructions the child executed in all, start-up and exit included.
    ``layout``: which of :data:`LAYOUT_PADS` pads the child's environment."""
    tool = ("valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null")
    command = [
        *(tool if valgrind else ()),
        python,
        str(HERE),
        "--child",
        variant,
        "--calls",
        str(calls),
        "--openai-url",
        server.openai_base_url,
        "--anthropic-url",
        server.anthropic_base_url,
        *(() if sdk else ("--no-sdk",)),
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0", _PAD_VARIABLE: "x" * LAYOUT_PADS[layout]}
    done = subprocess.run(
        command, check=False, capture_output=True, text=True, env=env, timeout=1800
    )
    if done.returncode != 0:
        raise RuntimeError(f"{variant} x{calls} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    if not valgrind:
        return 0
    found = _I_REFS.search(done.stderr)
    if found is None:
        raise RuntimeError(f"{variant}: no instruction count in valgrind's output")
    return int(found.group(1).replace(",", ""))


def _measure(
    libraries: tuple[str, ...],
    low: int,
    high: int,
    sdk: bool,
    peers: dict[str, str] | None = None,
    python: str = sys.executable,
    skip: frozenset[str] = frozenset(),
    layouts: int = DEFAULT_LAYOUTS,
) -> dict[str, Any]:
    peers = peers or {}
    variants = {
        lib: (*VARIANTS[lib], *(p for p in peers if p.startswith(f"{lib}_"))) for lib in libraries
    }
    jobs = [
        (v, n, sdk, layout)
        for lib in libraries
        for v in variants[lib]
        # No SDK: every span is a no-op, so there is no telemetry floor to measure.
        if (sdk or not v.endswith(("_floor", "_span"))) and v not in skip
        for n in (low, high)
        for layout in range(layouts)
    ]
    # Every openai variant but a peer of its own venv in one environment (the
    # classic peers' venv when there is one); each peer in the venv that holds it.
    pythons = {
        v: peers.get(v) or (python if v.startswith("openai_") else sys.executable)
        for v, _, _, _ in jobs
    }
    with FakeLLMServer(output_tokens=OUTPUT_TOKENS) as server:
        with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
            counts = pool.map(
                lambda job: _count(*job[:3], server, pythons[job[0]], layout=job[3]), jobs
            )
            totals = dict(zip(jobs, counts, strict=True))
        requests = server.request_count  # all of them: the recorded list keeps the last 10,000
    expected_requests = sum(WARMUP_CALLS + n for _, n, _, _ in jobs)
    if requests != expected_requests:
        raise RuntimeError(f"the server saw {requests} requests, expected {expected_requests}")
    report: dict[str, Any] = {}
    for library in libraries:
        by_layout = {
            v.split("_", 1)[1]: [
                (totals[(v, high, sdk, i)] - totals[(v, low, sdk, i)]) / (high - low)
                for i in range(layouts)
            ]
            for v in variants[library]
            if (v, high, sdk, 0) in totals
        }
        per_call = {kind: statistics.median(counts) for kind, counts in by_layout.items()}
        if "bare" not in per_call or "enforce" not in per_call:
            continue  # left out (--skip)
        _check_above_bare(library, per_call)
        report[library] = _ratios(
            per_call, sdk, TARGETS_OVER_BARE.get(library, TARGET_OVER_BARE), library
        )
        report[library]["per_layout"] = {
            kind: [round(c) for c in counts] for kind, counts in by_layout.items()
        }
    return report


def _check_above_bare(library: str, per_call: dict[str, float]) -> None:
    """Refuse a run where an instrumented variant counted clearly fewer
    instructions than the bare call: that is no saving but a broken run (most
    often a module compiled in one child and read from its .pyc in the next),
    and its ratios would read as targets met."""
    bare = per_call["bare"]
    for kind, count in per_call.items():
        if count < bare - _NOISE_PER_CALL:
            raise RuntimeError(
                f"{library}_{kind} counted {count:,.0f} instructions a call, below the bare "
                f"call's {bare:,.0f}: the run is unreliable (were the .pyc files written "
                "before it? see the module docstring); run it again"
            )


def _dry_run(libraries: tuple[str, ...]) -> dict[str, str]:
    """Each variant with one timed call, no valgrind, no SDK: "ok", or why it failed."""
    variants = [
        v for lib in libraries for v in VARIANTS[lib] if not v.endswith(("_floor", "_span"))
    ]

    def run(variant: str) -> str:
        try:
            _count(variant, 1, False, server, valgrind=False)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            return str(exc)[-500:]
        return "ok"

    workers = max(1, os.cpu_count() or 1)
    with FakeLLMServer(output_tokens=OUTPUT_TOKENS) as server, ThreadPoolExecutor(workers) as pool:
        return dict(zip(variants, pool.map(run, variants), strict=True))


def _ratios(
    per_call: dict[str, float],
    sdk: bool,
    target_over_bare: float = TARGET_OVER_BARE,
    library: str = "openai",
) -> dict[str, Any]:
    bare = per_call["bare"]
    added = {k: v - bare for k, v in per_call.items() if k != "bare"}
    enforce_added = added["enforce"]
    ratios: dict[str, Any] = {
        "enforce_added_over_bare": _round(enforce_added / bare),
        "over_bare": {k: _round(v / bare) for k, v in per_call.items() if k != "bare"},
    }
    observe_added = added.get("observe", 0.0)  # the adapters have no observe variant
    if "observe" in added:
        over_observe = enforce_added / observe_added if observe_added > 0 else None
        ratios["enforce_added_over_observe_added"] = _round(over_observe)
        ratios["enforce_minus_observe"] = round(enforce_added - observe_added)
    if "floor" in added and observe_added > 0:
        # The required telemetry alone, and what the check itself adds beyond it.
        ratios["floor_added_over_observe_added"] = _round(added["floor"] / observe_added)
        ratios["enforce_minus_floor"] = round(enforce_added - added["floor"])
    contrib_added = added.get("contrib")
    if contrib_added is not None and contrib_added > 0:
        ratios["added_over_contrib_added"] = {
            k: _round(v / contrib_added) for k, v in added.items()
        }
    targets: dict[str, Any] = {}
    if sdk:
        ratios["over_official"] = over = _over_official(per_call, added, library)
        targets["ours_added_over_official_added_max"] = TARGET_OURS_OVER_OFFICIAL
        targets["enforcement_over_floor_over_official_added_max"] = TARGET_ENFORCEMENT_OVER_OFFICIAL
        targets["met"] = {name: row["met"] for name, row in over.items() if row["target"]}
    else:
        targets["enforce_added_over_bare_max"] = target_over_bare
        targets["met_over_bare"] = enforce_added / bare <= target_over_bare
    return {
        "instructions_per_call": {k: round(v) for k, v in per_call.items()},
        "added_over_bare": {k: round(v) for k, v in added.items()},
        "ratios": ratios,
        "targets": targets,
    }


def _over_official(
    per_call: dict[str, float], added: dict[str, float], library: str
) -> dict[str, Any]:
    """Ours against each official instrumentor of ``library`` (issue 26): what
    ours adds in all (observe + enforce) over what the official adds, and what
    enforcement adds over the span floor (the span ours rides on) over the same.
    One row per official and per way ours runs (:data:`OURS`): ``<official>`` is
    the one the targets read, ``<official>_<label>`` one for information."""
    rows: dict[str, Any] = {}
    for name in OFFICIAL.get(library, ()):
        official = added.get(name)
        if official is None or official <= 0:
            continue
        for label, kind, floor_kind, target in OURS.get(library, ()):
            if kind not in added:
                continue  # left out (--skip)
            ours = added[kind] / official
            floor = per_call.get(floor_kind)
            enforcement = None if floor is None else per_call[kind] - floor
            over_floor = None if enforcement is None else enforcement / official
            rows[f"{name}_{label}" if label else name] = {
                "ours": kind,
                "floor": floor_kind,
                "target": target,
                "official_added": round(official),
                "ours_added": round(added[kind]),
                "enforcement_over_floor": None if enforcement is None else round(enforcement),
                "ours_added_over_official_added": _round(ours),
                "enforcement_over_floor_over_official_added": _round(over_floor),
                "met": ours <= TARGET_OURS_OVER_OFFICIAL
                and over_floor is not None
                and over_floor <= TARGET_ENFORCEMENT_OVER_OFFICIAL,
            }
    return rows


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    names = ("veronica-otel", "openai", "anthropic", "opentelemetry-sdk", "wrapt", "httpx")
    for name in (*names, "google-genai", "boto3", "mistralai", "cohere", "ollama", "litellm"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="openai only, a few calls")
    parser.add_argument(
        "--peers",
        nargs="?",
        const=",".join(PEERS),
        help=f"only these peers (default: all of {','.join(PEERS)}); with --quick: the peers too",
    )
    parser.add_argument("--no-peers", action="store_true", help="no peer instrumentors")
    parser.add_argument(
        "--skip", default="", help="comma-separated variants not to run (openai_floor,...)"
    )
    parser.add_argument(
        "--only",
        choices=("sdk", "no-sdk"),
        help="only the pass with a TracerProvider, or only the one without (to run both "
        "side by side)",
    )
    parser.add_argument(
        "--libraries", help="comma-separated subset of openai,anthropic (default: both)"
    )
    parser.add_argument(
        "--adapters",
        nargs="?",
        const=",".join(ADAPTERS),
        help=f"only these adapters, no SDK (default: all of {','.join(ADAPTERS)}); "
        "with --libraries, those too",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="run each variant once, without valgrind (that it runs and counts right)",
    )
    parser.add_argument("--low", type=int, help=f"timed calls in the short run ({DEFAULT_LOW})")
    parser.add_argument("--high", type=int, help=f"timed calls in the long run ({DEFAULT_HIGH})")
    parser.add_argument(
        "--layouts",
        type=int,
        choices=range(1, len(LAYOUT_PADS) + 1),
        default=DEFAULT_LAYOUTS,
        help=f"memory layouts each count is the median of ({DEFAULT_LAYOUTS}; 1: faster, noisier)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--openai-url", help=argparse.SUPPRESS)
    parser.add_argument("--anthropic-url", help=argparse.SUPPRESS)
    parser.add_argument("--no-sdk", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args.child, args.calls, args.openai_url, args.anthropic_url, not args.no_sdk)
    report = environment("instructions_per_sdk_call")
    low = args.low or (QUICK_LOW if args.quick else DEFAULT_LOW)
    high = args.high or (QUICK_HIGH if args.quick else DEFAULT_HIGH)
    if not 0 <= low < high:
        parser.error(f"need 0 <= --low < --high, got {low} and {high}")
    libraries: tuple[str, ...] = ("openai",) if args.quick else SDK_LIBRARIES
    adapters: tuple[str, ...] = () if args.quick else tuple(ADAPTERS)
    if args.adapters is not None:
        adapters, libraries = tuple(args.adapters.split(",")), ()
        if not set(adapters) <= set(ADAPTERS):
            parser.error(f"--adapters: choose from {', '.join(ADAPTERS)}, got {args.adapters}")
    if args.libraries:
        libraries = tuple(args.libraries.split(","))
        if not set(libraries) <= set(SDK_LIBRARIES):
            parser.error(
                f"--libraries: choose from {', '.join(SDK_LIBRARIES)}, got {args.libraries}"
            )
    report["packages"] = _versions()
    report["parameters"] = {
        "tool": "valgrind --tool=cachegrind --cache-sim=no (instructions executed)",
        "low_calls": low,
        "high_calls": high,
        "warmup_calls": WARMUP_CALLS,
        "libraries": list(libraries),
        "adapters": list(adapters),
        "per_call": "(instructions at high - instructions at low) / (high - low), the median "
        "over the layouts",
        "layouts": [f"{_PAD_VARIABLE} of {pad} bytes" for pad in LAYOUT_PADS[: args.layouts]],
    }
    if args.dry_run:
        report["dry_run"] = _dry_run((*libraries, *adapters))
        return emit(report)
    if shutil.which("valgrind") is None:
        report["skipped"] = "valgrind is not installed (Debian: apt-get install valgrind)"
        return emit(report)
    skip = frozenset(filter(None, args.skip.split(",")))
    python, peers = sys.executable, {}
    with_peers = not args.no_peers and args.only != "no-sdk" and (args.peers or not args.quick)
    if libraries and with_peers:
        chosen = (args.peers or ",".join(PEERS)).split(",")
        if not set(chosen) <= set(PEERS):
            parser.error(f"--peers: choose from {', '.join(PEERS)}, got {args.peers}")
        wanted = tuple(p for p in chosen if p.split("_", 1)[0] in libraries and p not in skip)
        python, peers, missing = _peers(python, wanted)
        report["peers"] = {"python": peers, "measured": list(peers), "missing": missing}
    if libraries and args.only != "no-sdk":
        report.update(
            _measure(
                libraries,
                low,
                high,
                sdk=True,
                peers=peers,
                python=python,
                skip=skip,
                layouts=args.layouts,
            )
        )
        _print_officials(report)
    # No SDK: the peers observe nothing; enforce over bare is what containment costs.
    # The other adapters run only here: their target is a share of the bare call.
    no_sdk = (*(() if args.quick else libraries), *adapters)
    if no_sdk and args.only != "sdk":
        report["no_sdk"] = _measure(
            no_sdk, low, high, sdk=False, python=python, skip=skip, layouts=args.layouts
        )
        report["no_sdk_shares"] = _shares(report["no_sdk"])
    return emit(report)


def _shares(no_sdk: dict[str, Any]) -> dict[str, Any]:
    """Per library: enforcing's added instructions as a share of its bare call, its
    target and whether it is met; also printed as a table on stderr (stdout: JSON)."""
    shares: dict[str, Any] = {}
    for library, row in no_sdk.items():
        bare = row["instructions_per_call"]["bare"]
        # Like for like: anthropic's bare client has the SDK's own tracing off, so
        # its share is ours on that same client (``enforce_off``); ours on the
        # default client is read over that client (``default_client``, below).
        added = row["added_over_bare"].get("enforce_off", row["added_over_bare"]["enforce"])
        target = row["targets"]["enforce_added_over_bare_max"]
        shares[library] = {
            "added": added,
            "bare": bare,
            "share_pct": round(100 * added / bare, 2),
            "target_pct": round(100 * target, 2),
            "met": added / bare <= target,
        }
        default = row["instructions_per_call"].get("observe")
        if library == "anthropic" and default:
            # Its bare variant has the SDK's own tracing off; enforce runs on the
            # default client (tracing on: a no-op span with no TracerProvider),
            # so this is what enforcing adds to the call a user makes by default.
            over_default = row["instructions_per_call"]["enforce"] - default
            shares[library]["default_client"] = {
                "added": round(over_default),
                "bare": round(default),
                "share_pct": round(100 * over_default / default, 2),
                "met": over_default / default <= target,
            }
    lines = ["no TracerProvider: enforce added / bare call"]
    for library, share in shares.items():
        verdict = "met" if share["met"] else "NOT met"
        lines.append(
            f"  {library:<10} {share['added']:>9,} / {share['bare']:>11,} = "
            f"{share['share_pct']:5.2f} %  (target <= {share['target_pct']:.1f} %: {verdict})"
        )
        default = share.get("default_client")
        if default is not None:
            lines.append(
                f"  {'  default':<10} {default['added']:>9,} / {default['bare']:>11,} = "
                f"{default['share_pct']:5.2f} %  (over the SDK's default client, its "
                "own tracing on)"
            )
    print("\n".join(lines), file=sys.stderr)
    return shares


def _print_officials(report: dict[str, Any]) -> None:
    """The with-SDK targets as a table on stderr (stdout: JSON)."""
    lines = ["with a TracerProvider: ours against each official instrumentor"]
    for library in SDK_LIBRARIES:
        for name, row in report.get(library, {}).get("ratios", {}).get("over_official", {}).items():
            what = f"{row['ours']} over {row['floor']}" + ("" if row["target"] else ", info")
            over_floor = row["enforcement_over_floor"]  # None: its floor was skipped
            enforcement = (
                "no floor measured"
                if over_floor is None
                else f"{over_floor:>9,} = {row['enforcement_over_floor_over_official_added']:.2f}x"
            )
            lines.append(
                f"  {library}/{name:<15} ({what}) official adds {row['official_added']:>9,}; ours "
                f"{row['ours_added']:>9,} = {row['ours_added_over_official_added']:.2f}x "
                f"(<= {TARGET_OURS_OVER_OFFICIAL}x); enforcement over the floor "
                f"{enforcement} (<= {TARGET_ENFORCEMENT_OVER_OFFICIAL}x)"
            )
    print("\n".join(lines), file=sys.stderr)


def _peers(python: str, wanted: tuple[str, ...]) -> tuple[str, dict[str, str], dict[str, str]]:
    """The Python the openai variants run with (the classic peers' venv when it
    built), each peer that loads with its venv's Python, and the rest with the reason."""
    found, missing = _peer_pythons(wanted)
    with FakeLLMServer(output_tokens=OUTPUT_TOKENS) as server:
        for peer, venv_python in found.items():
            reason = _loads(venv_python, peer, server)
            if reason is not None:
                missing[peer] = f"did not run: {reason}"
    peers = {p: found[p] for p in wanted if p in found and p not in missing}
    return peers.get("openai_contrib", python), peers, missing


if __name__ == "__main__":
    sys.exit(main())
