"""Six chat calls, as an app does them, for the real-install tests.

``python real_install_agent.py`` (under ``opentelemetry-instrument``): six
calls in the process default chain. ``... threads``: an explicit chain of 2
steps, its four calls made in a thread pool. ``... peer NAME ORDER
[LIMIT...]``: programmatic, with a peer GenAI instrumentor (``openai-v2``,
``openllmetry``, ``openlit`` or ``none``) instrumented before or after ours
(``peer-first`` / ``ours-first``), then six calls in a chain limited by steps
(3), then six in one limited by cost (or only the LIMITs named): one process
serves both limits (importing openai and a
peer costs more than the calls), each limit's requests marked with an
``x-limit`` header so the server counts them apart. ``... peers FOLDER
NAME:ORDER...``: each ``NAME:ORDER`` as ``peer NAME ORDER``, all at once, in
processes forked from this one once openai, the SDK, ours and every peer's
module are imported (not instrumented: each child instruments in its order),
since importing them is most of what a run costs, and each ends as
``frameworks/_report.py``'s scenarios do (threads and atexit handlers, not
the teardown of what it inherited); each run's stdout and
stderr go to ``FOLDER/NAME:ORDER.out`` and ``.err``, and this process exits
with the number of runs that failed.
Each call prints ``step N ok`` or ``step N refused: <error>`` (in the peer
mode after ``steps: `` or ``cost: ``, which then also prints
``<limit>: spans: {"ours": N, "theirs": M}``, the CLIENT spans made).
"""

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import openai

MODEL = "gpt-4o-mini"


def call(client: openai.OpenAI, step: int) -> str:
    try:
        client.chat.completions.create(
            model=MODEL,
            max_tokens=50,
            messages=[{"role": "user", "content": f"step {step}: what next?"}],
        )
    except Exception as exc:
        return f"step {step} refused: {type(exc).__name__}: {exc}"
    return f"step {step} ok"


def plain() -> None:
    client = openai.OpenAI(max_retries=0)
    for step in range(6):
        print(call(client, step), flush=True)


def threads() -> None:
    from veronica_otel import ExecutionConfig, ExecutionContext

    client = openai.OpenAI(max_retries=0)
    with ExecutionContext(ExecutionConfig(max_steps=2)), ThreadPoolExecutor(2) as pool:
        for line in pool.map(lambda step: call(client, step), range(4)):
            print(line, flush=True)


def instrument_peer(name: str) -> None:
    if name == "openai-v2":
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

        OpenAIInstrumentor().instrument()
    elif name == "openllmetry":
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor

        OpenAIInstrumentor().instrument()
    elif name == "openlit":
        import openlit

        openlit.init(disable_batch=True, disable_metrics=True, collect_gpu_stats=False)
    elif name != "none":
        raise SystemExit(f"unknown peer {name!r}")


def peer(name: str, order: str, *only: str) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from veronica_otel import ExecutionConfig, ExecutionContext
    from veronica_otel.instrumentors.openai import OpenAIInstrumentor as Ours

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    if order == "peer-first":
        instrument_peer(name)
        Ours().instrument()
    else:
        Ours().instrument()
        instrument_peer(name)
    limits = {"steps": ExecutionConfig(max_steps=3), "cost": ExecutionConfig(max_cost_usd=6.5e-5)}
    for limit, config in limits.items():
        if only and limit not in only:
            continue
        exporter.clear()
        client = openai.OpenAI(max_retries=0, default_headers={"x-limit": limit})
        with ExecutionContext(config):
            for step in range(6):
                print(f"{limit}:", call(client, step), flush=True)
        client.close()
        spans = [s for s in exporter.get_finished_spans() if s.kind == trace.SpanKind.CLIENT]
        ours = [s for s in spans if any(k.startswith("veronica.") for k in s.attributes or {})]
        theirs = len(spans) - len(ours)
        print(f"{limit}: spans:", json.dumps({"ours": len(ours), "theirs": theirs}), flush=True)


def peers(folder: str, *runs: str) -> int:
    import gc
    import importlib

    gc.disable()  # while the runs' imports run here (frameworks/_report.py's no_collection)
    import openlit  # noqa: F401
    import opentelemetry.instrumentation.openai

    # What OpenLLMetry's instrument() imports (its wrappers, openai's beta types):
    # about 1 CPU-second in each of its two runs, else.
    import opentelemetry.instrumentation.openai.v1
    import opentelemetry.instrumentation.openai_v2
    import opentelemetry.sdk.trace  # noqa: F401
    from frameworks._report import WARM, exit_as_the_interpreter_does

    import veronica_otel.instrumentors.openai  # noqa: F401

    for name in WARM:  # what a run's first call imports
        importlib.import_module(name)
    gc.freeze()  # a child's collections then leave what was imported here uncopied

    children = []
    for run in runs:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            gc.enable()  # collected as a run of its own is
            for fd, suffix in ((1, "out"), (2, "err")):
                path = os.path.join(folder, f"{run}.{suffix}")
                target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(target, fd)
                os.close(target)
            peer(*run.split(":"))
            exit_as_the_interpreter_does()  # its threads and atexit handlers, no teardown
        children.append(pid)
    return sum(os.waitpid(pid, 0)[1] != 0 for pid in children)


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "plain"
    if mode == "threads":
        threads()
    elif mode == "peer":
        peer(*sys.argv[2:])
    elif mode == "peers":
        sys.exit(peers(*sys.argv[2:]))
    else:
        plain()
