"""Our call span replaces the official contrib instrumentor's: it carries every key that one sets.

The same calls (an error, a plain chat, a chat with every request parameter,
a stream, embeddings) run once under ``opentelemetry-instrumentation-openai-v2``
in a fresh venv where it is installed alone (:data:`tests._venvs.CONTRIB`,
cached between runs), in both of its semantic-convention modes, and once
under ours; each prints its call spans' attribute keys (``apps/span_keys.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import _venvs
from veronica_otel.testing import FakeLLMServer

APP = Path(__file__).parent / "apps" / "span_keys.py"
OURS = {"veronica.chain.id", "veronica.decision", "veronica.cost_usd"}
# Required by DESIGN whatever the contrib instrumentor records on this SDK version.
RECOMMENDED = {
    "server.address",
    "server.port",
    "gen_ai.response.id",
    "gen_ai.response.model",
    "gen_ai.response.finish_reasons",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
}


@pytest.fixture(scope="module")
def contrib() -> Path:
    try:
        return _venvs.venv("contrib", _venvs.CONTRIB)
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"building the contrib venv: {_venvs.build_error(exc)}")


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=5) as server:
        yield server


def span_keys(python: str, mode: str, llm: FakeLLMServer, **env: str) -> dict[str, set[str]]:
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("VERONICA_", "OTEL_", "OPENAI_"))
        and (mode == "ours" or k != "PYTHONPATH")
    }
    environ.update(OPENAI_BASE_URL=llm.openai_base_url, OPENAI_API_KEY="test-key", **env)
    llm.fail_next(1, 400)  # the first case is the error
    done = subprocess.run(
        [python, str(APP), mode],
        check=False,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    cases = json.loads(done.stdout.splitlines()[-1])
    out = {}
    for case, spans in cases.items():
        assert len(spans) == 1, (mode, case, spans)  # one CLIENT span per call
        out[case] = set(spans[0])
    return out


def test_our_call_spans_carry_every_key_the_contrib_instrumentor_sets(
    contrib: Path, llm: FakeLLMServer
) -> None:
    python = str(contrib / "bin" / "python")
    theirs = span_keys(python, "contrib", llm)
    latest = span_keys(
        python, "contrib", llm, OTEL_SEMCONV_STABILITY_OPT_IN="gen_ai_latest_experimental"
    )
    ours = span_keys(sys.executable, "ours", llm)
    assert set(ours) == set(theirs) == set(latest)
    # The reference is real: contrib described each call.
    assert "gen_ai.response.id" in theirs["chat"]
    assert "gen_ai.request.temperature" in theirs["chat_parameters"]
    assert "error.type" in theirs["error"]
    missing = {
        case: sorted((theirs[case] | latest[case] | OURS) - keys)
        for case, keys in ours.items()
        if not (theirs[case] | latest[case] | OURS) <= keys
    }
    assert not missing
    for case in ("chat", "chat_parameters", "stream"):
        assert ours[case] >= RECOMMENDED, (case, sorted(RECOMMENDED - ours[case]))
    assert {"server.address", "server.port", "error.type"} <= ours["error"]
    assert not [
        key for keys in ours.values() for key in keys if key.startswith("veronica.remaining")
    ]
