"""Zero code does not make a missing collector slower to exit than OpenTelemetry alone.

With no collector listening, a process exits when its exporters give up:
OpenTelemetry's OTLP exporter retries each batch with backoff until its
timeout. So what decides the exit time is what is exported, how often it is
retried and with which timeout, plus the interpreter's teardown of what was
imported. Each is compared here, never the wall clock: the same app runs
under OpenTelemetry's own SDK configurator, then under ``opentelemetry-instrument``
with veronica-otel, against a collector that answers every export with 503
(retryable) and counts the attempts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

BIN = Path(sys.executable).parent
# What both runs print at exit: the export pipeline and the modules of the
# SDK the app itself imported (openai) that are loaded.
APP = """
import json, sys
import openai
from opentelemetry import trace, metrics
from opentelemetry._logs import get_logger_provider

with trace.get_tracer("exit-probe").start_as_current_span("probe"):
    pass

def described(exporter):  # its class and its timeout (on its HTTP client)
    client = getattr(exporter, "_client", exporter)
    return type(exporter).__name__, getattr(client, "_timeout", None)

def exporters(processors):
    for p in processors:
        inner = getattr(p, "_batch_processor", None)
        yield described(getattr(inner, "_exporter", None) or getattr(p, "span_exporter", None))

tracing = trace.get_tracer_provider()._active_span_processor._span_processors
logs = get_logger_provider()._multi_log_record_processor._log_record_processors
readers = metrics.get_meter_provider()._metric_readers
print(json.dumps({
    "traces": sorted(exporters(tracing)),
    "logs": sorted(exporters(logs)),
    "metrics": sorted(described(r._exporter) for r in readers),
    "openai_modules": sorted(m for m in sys.modules if m.startswith("openai.resources")),
}))
"""
THEIRS = (
    "from opentelemetry.sdk._configuration import _OTelSDKConfigurator\n"
    "_OTelSDKConfigurator().configure()\n"
)


class _Collector(BaseHTTPRequestHandler):
    attempts: ClassVar[Counter[str]] = Counter()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.attempts[self.path] += 1
        self.send_response(503)  # retryable: the exporter backs off and tries again
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, Counter[str]]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", _Collector.attempts
    finally:
        server.shutdown()
        server.server_close()
        _Collector.attempts.clear()


def _run(command: list[str], endpoint: str, cwd: Path) -> dict[str, object]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OTEL_", "VERONICA_"))
    }
    env.update(
        OTEL_TRACES_EXPORTER="otlp",  # what opentelemetry-distro sets by default
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_LOGS_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_EXPORTER_OTLP_TIMEOUT="2",  # the same for both: keeps the test short
        VERONICA_MAX_STEPS="10",  # zero code with a default chain
    )
    result = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


def test_zero_code_exports_and_retries_exactly_as_opentelemetry_alone(
    collector: tuple[str, Counter[str]], tmp_path: Path
) -> None:
    endpoint, attempts = collector
    (tmp_path / "theirs.py").write_text(THEIRS + APP, encoding="utf-8")
    (tmp_path / "app.py").write_text(APP, encoding="utf-8")
    theirs = _run([sys.executable, "theirs.py"], endpoint, tmp_path)
    their_attempts = dict(attempts)
    attempts.clear()
    ours = _run(
        [str(BIN / "opentelemetry-instrument"), sys.executable, "app.py"], endpoint, tmp_path
    )
    # The same exporters with the same timeouts, so the same retry schedule.
    for signal in ("traces", "metrics", "logs"):
        assert ours[signal] == theirs[signal], signal
    assert theirs["traces"] == [["OTLPSpanExporter", 2.0]]
    # The same export attempts reached the collector (the span batch, retried
    # until the timeout): nothing more to retry at exit.
    assert their_attempts.get("/v1/traces", 0) >= 2
    assert dict(attempts) == their_attempts
    # Nothing of the SDK the app did not use is loaded (it is torn down at exit).
    assert ours["openai_modules"] == theirs["openai_modules"] == []


def test_the_realtime_hooks_wait_for_the_client_to_import_them() -> None:
    probe = (
        "import sys, openai\n"
        "from veronica_otel.instrumentors.openai import OpenAIInstrumentor\n"
        "from veronica_otel.instrumentors import _realtime\n"
        "from veronica_otel.instrumentors._unwrap import is_ours\n"
        "OpenAIInstrumentor().instrument()\n"
        "before = [m for m in sys.modules if m.startswith('openai.resources')]\n"
        "client = openai.OpenAI(api_key='k', base_url='http://127.0.0.1:9')\n"
        "client.realtime, client.responses, client.beta\n"
        "hooked = [is_ours(m, n, w)\n"
        "          for m in _realtime.managers() for n, w in _realtime._hooks(m)]\n"
        "print(len(before), len(hooked), all(hooked))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    before, hooked, all_ours = result.stdout.split()
    assert before == "0"  # instrumenting imported no resource module
    assert int(hooked) >= 3 and all_ours == "True"  # wrapped once the client imported them
