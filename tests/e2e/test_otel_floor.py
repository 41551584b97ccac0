"""Contained at the oldest OpenTelemetry we declare, and beside google-adk.

The main venv has the newest OpenTelemetry (the rest of the suite tests it).
Here, fresh venvs built by pip (cached, :mod:`tests._venvs`):

- FLOOR: this checkout with ``opentelemetry-api`` / ``-sdk`` /
  ``-instrumentation`` (and ``-instrumentation-httpx``, which has no
  ``HTTPX2ClientInstrumentor`` yet) pinned to pyproject's floors: a contained
  openai call made in code, with the SDK's spans, and a zero-code
  ``opentelemetry-instrument`` run.
- ADK: this checkout beside ``google-adk``, which pins
  ``opentelemetry-api<=1.44``: pip must resolve the newest google-adk, not fall
  back to an old one with looser pins; a contained call in that venv.

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

# The newest google-adk on the package index when this test was written: a
# resolution that picks anything older fell back to dodge a conflict with us.
ADK_NEWEST = (2, 13, 0)


def _venv(name: str) -> Path:
    try:
        return _venvs.venv(name.lower(), getattr(_venvs, name))
    except subprocess.CalledProcessError as exc:  # say what pip said, do not hide it
        pytest.fail(f"building the {name} venv: {_venvs.build_error(exc)}")


@pytest.fixture(scope="module")
def floor() -> Path:
    return _venv("FLOOR")


@pytest.fixture(scope="module")
def adk() -> Path:
    return _venv("ADK")


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


def test_adk_installs_beside_us_at_its_newest(adk: Path, llm: FakeLLMServer) -> None:
    found = versions(adk, "google-adk", "opentelemetry-api", "veronica-otel")
    adk_version = tuple(int(part) for part in found["google-adk"].split(".")[:3])
    assert adk_version >= ADK_NEWEST, found  # no fall-back to an old google-adk
    api = tuple(int(part) for part in found["opentelemetry-api"].split(".")[:2])
    assert (1, 41) <= api <= (1, 44), found  # within google-adk's pin and our floor
    loaded = subprocess.run(
        [str(adk / "bin" / "python"), "-c", "import google.adk, veronica_otel.startup.distro"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert_three_of_six(contained_in_code(adk, llm), llm)
