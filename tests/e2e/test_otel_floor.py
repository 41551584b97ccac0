"""Contained at the oldest OpenTelemetry we declare.

The main venv has the newest OpenTelemetry (the rest of the suite tests it).
Here, a fresh venv built by pip (cached, :mod:`tests._venvs`), FLOOR: this
checkout with ``opentelemetry-api`` / ``-sdk`` / ``-instrumentation`` (and
``-instrumentation-httpx``, which has no ``HTTPX2ClientInstrumentor`` yet)
pinned to pyproject's floors: a contained openai call made in code, with the
SDK's spans, and a zero-code ``opentelemetry-instrument`` run. (google-adk,
which pins ``opentelemetry-api<=1.44``, resolving beside us at its newest is
checked in the venv its agents run in: ``test_frameworks_gemini_bedrock.py``.)

The LLM is the fake server in this process, whose request counts are the truth.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests import _venvs
from tests.e2e.test_real_installs import AGENT, CHAT, environment, instrumented, oks
from veronica_otel.testing import FakeLLMServer


def _venv(name: str) -> Path:
    try:
        return _venvs.venv(name.lower(), getattr(_venvs, name))
    except subprocess.CalledProcessError as exc:  # say what pip said, do not hide it
        pytest.fail(f"building the {name} venv: {_venvs.build_error(exc)}")


@pytest.fixture(scope="module")
def floor() -> Path:
    return _venv("FLOOR")


@pytest.fixture
def llm() -> FakeLLMServer:
    with FakeLLMServer(output_tokens=10) as server:
        yield server  # type: ignore[misc]


def versions(venv: Path, *names: str) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json, sys; "
        "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    )
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code, *names],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found: dict[str, str] = json.loads(out.stdout)
    return found


def contained_in_code(venv: Path, llm: FakeLLMServer) -> subprocess.CompletedProcess[str]:
    """Our OpenAIInstrumentor and the SDK's spans, six calls in a chain of 3 steps."""
    return subprocess.run(
        [str(venv / "bin" / "python"), str(AGENT), "peer", "none", "ours-first", "steps"],
        env=environment(llm),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def assert_three_of_six(result: subprocess.CompletedProcess[str], llm: FakeLLMServer) -> None:
    assert llm.count(CHAT) == 3, result.stderr
    calls = [
        line.removeprefix("steps: ")
        for line in result.stdout.splitlines()
        if line.startswith("steps: step ")
    ]
    assert len(calls) == 6, result.stdout
    assert sum(line.endswith(" ok") for line in calls) == 3, result.stdout
    assert all("steps limit reached" in line for line in calls[3:]), result.stdout
    assert "Traceback" not in result.stderr, result.stderr[-2000:]


def test_floor_versions_are_the_ones_installed(floor: Path) -> None:
    assert versions(floor, *_venvs.FLOOR_VERSIONS) == _venvs.FLOOR_VERSIONS


def test_floor_contains_a_call_in_code(floor: Path, llm: FakeLLMServer) -> None:
    result = contained_in_code(floor, llm)
    assert_three_of_six(result, llm)
    # The SDK records our span on every call, the three denied ones included.
    assert 'spans: {"ours": 6, "theirs": 0}' in result.stdout


def test_floor_contains_zero_code(floor: Path, llm: FakeLLMServer) -> None:
    result = instrumented(floor, llm, str(AGENT), VERONICA_MAX_STEPS="3")
    assert llm.count(CHAT) == 3, result.stderr
    assert oks(result) == 3, result.stdout


def test_floor_without_httpx2_instrumentor_warns_and_goes_on(floor: Path) -> None:
    # opentelemetry-instrumentation-httpx 0.62b0 has no HTTPX2ClientInstrumentor.
    code = (
        "import logging; logging.basicConfig()\n"
        "from veronica_otel.instrumentors.httpx import HTTPXInstrumentor\n"
        "HTTPXInstrumentor().instrument(enable_otel_http=True)\n"
        "import httpx2\n"
    )
    result = subprocess.run(
        [str(floor / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "has no HTTPX2ClientInstrumentor" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr
