"""Run a script unchanged under ``opentelemetry-instrument``, as users do.

The environment is this process's minus any ``VERONICA_*``, ``OTEL_*``,
``OPENAI_*`` and ``ANTHROPIC_*`` settings, pointed at the fake LLM server,
with OpenTelemetry exporters off unless a test sets them.

:func:`run_instrumented` starts a process per script. :func:`script_scenarios`
starts one zero-code process for a module whose tests vary only the script
and its ``VERONICA_*`` variables: each runs in a process forked from it after
openai's import, with a default chain built from those variables as start-up
builds it (``e2e/apps/unchanged_scripts.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tests._venvs import plain_http_tls
from veronica_otel.testing import FakeLLMServer

if TYPE_CHECKING:
    from tests.e2e._frameworks import CompletedProcess, FrameworkApp

INSTRUMENT = Path(sys.executable).parent / "opentelemetry-instrument"
SCRIPTS_APP = Path(__file__).parent / "e2e" / "apps" / "unchanged_scripts.py"
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


def script_scenarios(server: FakeLLMServer) -> FrameworkApp:
    """``apps/unchanged_scripts.py`` under zero code here; ``.run(script, **env)`` per scenario.

    Use as a context manager (a module fixture); each test's script then runs
    as :func:`run_instrumented` would run it, in a process of its own forked
    from this one, and reports how it ended (``frameworks/_report.py``).
    """
    from tests.e2e._frameworks import FrameworkApp

    return FrameworkApp(
        Path(sys.executable).parent.parent,  # this environment, as run_instrumented's
        str(SCRIPTS_APP),
        server,
        PYTHONPATH=os.environ.get("PYTHONPATH"),  # these sources, as run_instrumented's
    )


def printed(done: CompletedProcess) -> list[str]:
    """What a scenario's script printed (its RESULT line aside)."""
    return [line for line in done.stdout.splitlines() if not line.startswith("RESULT ")]
