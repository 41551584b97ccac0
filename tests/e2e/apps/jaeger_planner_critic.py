"""The demo's planner/critic chain, set up in code and exported over OTLP.

The demo's own scenario (``planner_critic``) under its own ceiling
(``max_handoffs=8``), through the real openai SDK against an embedded fake
LLM server, with OpenTelemetry's httpx instrumentation on, so each call that
is sent has its HTTP client span. Prints one JSON line: the chain and trace
ids, the trip and how many model calls the server received. With arguments,
one such run per argument, each in a process of its own (:func:`runs`).
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import sys
import traceback

import openai
from _export import tracer_provider
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from veronica_otel import BudgetExceededError, ExecutionContext
from veronica_otel.cli._demo_scenarios import SCENARIOS, planner_critic
from veronica_otel.instrumentors.httpx import HTTPXInstrumentor
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer


def instrumented() -> TracerProvider:
    """The provider set, then the instrumentors on (they take it when instrumenting)."""
    provider = tracer_provider()
    trace.set_tracer_provider(provider)
    OpenAIInstrumentor().instrument()
    HTTPXInstrumentor().instrument(enable_otel_http=True)  # the POST span under each call
    return provider


def main(provider: TracerProvider) -> None:
    config = next(s.config for s in SCENARIOS if s.run is planner_critic)
    with FakeLLMServer(output_tokens=40) as server:
        client = openai.OpenAI(base_url=server.openai_base_url, api_key="fake", max_retries=0)
        trip = None
        with ExecutionContext(config, name="planner-critic") as ctx:
            trace_id = trace.get_current_span().get_span_context().trace_id
            try:
                planner_critic(client)
            except BudgetExceededError as exc:
                trip = exc.reason
        client.close()
        sent = server.request_count
    provider.shutdown()  # flush to the collector before the report
    report = {"chain_id": ctx.chain_id, "trace_id": f"{trace_id:032x}", "trip": trip}
    print(json.dumps({**report, "sent": sent}))


def runs(*settings: str) -> int:
    """Each ``settings`` (JSON: the OTLP variables of one run) as a run of its own.

    Each runs in a process forked from this one once openai, the SDK, both OTLP
    exporters and ours are imported (most of what a run costs), and ends as
    ``frameworks/_report.py``'s scenarios do; one after the other, each
    printing its line. Returns how many failed.
    """
    gc.disable()  # while the runs' imports run here (frameworks/_report.py's no_collection)
    import opentelemetry.exporter.otlp.proto.grpc.trace_exporter
    import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
    from frameworks._report import WARM, exit_as_the_interpreter_does

    for name in WARM:  # what the first call imports (all installed here)
        importlib.import_module(name)
    gc.freeze()  # a child's collections then skip (so do not copy) what this process made
    failed = 0
    for run in settings:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            gc.enable()  # collected as a run of its own is
            os.environ.update(json.loads(run))
            try:
                main(instrumented())
            except BaseException:  # said on stderr; the child must not go on serving runs
                traceback.print_exc()
                exit_as_the_interpreter_does(1)
            exit_as_the_interpreter_does()  # its threads and atexit handlers, no teardown
        failed += os.waitpid(pid, 0)[1] != 0
    return failed


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit(runs(*sys.argv[1:]))
    main(instrumented())
