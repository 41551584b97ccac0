"""Running a framework's runaway app in its own venv, under zero code.

The app is an unchanged script (``apps/frameworks/*_app.py``) run with the
venv's ``opentelemetry-instrument``; the model is the runaway fake server in
the test process, whose counts are the truth of what was sent. The app ends
with one ``RESULT {json}`` line (``apps/frameworks/_report.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests import _venvs
from veronica_otel.testing import FakeLLMServer

APPS = Path(__file__).parent / "apps" / "frameworks"
TIMEOUT = 300  # generous: a loaded CI machine; a run takes a few CPU seconds


def framework_venv(name: str) -> Path:
    """The cached venv of recipe ``name`` in :mod:`tests._venvs` (built if missing)."""
    try:
        return _venvs.venv(name.lower(), getattr(_venvs, name))
    except subprocess.CalledProcessError as exc:  # say what pip said, do not hide it
        pytest.fail(f"building the {name} venv: {_venvs.build_error(exc)}")


def run_app(
    venv: Path, app: str, server: FakeLLMServer, *args: str, **env: str | None
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """Run ``apps/frameworks/<app>`` under zero code; its RESULT and the process.

    ``env`` overrides the defaults; a ``None`` value removes the variable.
    """
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("VERONICA_", "OTEL_", "OPENAI_", "ANTHROPIC_", "PYTHON"))
    }
    environ.update(
        OPENAI_BASE_URL=server.openai_base_url,
        OPENAI_API_BASE=server.openai_base_url,  # llama-index-llms-openai reads this one
        OPENAI_API_KEY="test-key",
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        FAKE_LLM_URL=server.base_url,
    )
    for name, value in env.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    done = subprocess.run(
        [str(venv / "bin" / "opentelemetry-instrument"), str(venv / "bin" / "python"), app, *args],
        cwd=APPS,
        env=environ,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no RESULT line; exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return json.loads(lines[-1].removeprefix("RESULT ")), done


def agent_policy(folder: Path, name: str, max_steps: int) -> str:
    """A policy file limiting agent ``name`` alone, for ``VERONICA_POLICY_FILE``."""
    policy = folder / "policy.toml"
    policy.write_text(f'[agents."{name}"]\nmax_steps = {max_steps}\n')
    return str(policy)
