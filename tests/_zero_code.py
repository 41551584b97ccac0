"""Run a script unchanged under ``opentelemetry-instrument``, as users do.

The environment is this process's minus any ``VERONICA_*``, ``OTEL_*``,
``OPENAI_*`` and ``ANTHROPIC_*`` settings, pointed at the fake LLM server,
with OpenTelemetry exporters off unless a test sets them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests._venvs import plain_http_tls
from veronica_otel.testing import FakeLLMServer

INSTRUMENT = Path(sys.executable).parent / "opentelemetry-instrument"
UNCHANGED_AGENT = Path(__file__).parent / "e2e" / "apps" / "unchanged_agent.py"


def run_instrumented(
    script: Path, server: FakeLLMServer, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` under ``opentelemetry-instrument``; ``env`` overrides the defaults."""
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("VERONICA_", "OTEL_", "OPENAI_", "ANTHROPIC_"))
    }
    environ.update(
        OPENAI_BASE_URL=server.openai_base_url,
        OPENAI_API_KEY="test-key",
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        **plain_http_tls(),
    )
    environ.update(env)
    return subprocess.run(
        [str(INSTRUMENT), sys.executable, str(script)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
