"""Zero code contains every provider client, unchanged, under ``opentelemetry-instrument``.

One process calls google-genai, Bedrock (boto3), mistralai, cohere, ollama,
litellm and a plain ``requests.post`` to a provider path (the vendor guard),
each once, then each again, under ``VERONICA_MAX_STEPS`` equal to the number
of clients: each first call reaches the fake server, no second one does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._zero_code import run_instrumented
from veronica_otel.testing import FakeLLMServer

APP = Path(__file__).parent / "apps" / "unchanged_providers.py"
CLIENTS = ("google-genai", "bedrock", "mistralai", "cohere", "ollama", "litellm", "requests")


@pytest.fixture
def server() -> FakeLLMServer:
    with FakeLLMServer(output_tokens=4) as fake:
        yield fake  # type: ignore[misc]


def test_every_provider_client_is_contained_with_zero_code(server: FakeLLMServer) -> None:
    result = run_instrumented(
        APP,
        server,
        FAKE_LLM_URL=server.base_url,
        VERONICA_MAX_STEPS=str(len(CLIENTS)),
        # the local model is priced at zero only by configuration; no cost ceiling here
    )
    assert result.returncode == 0, result.stderr
    # The app's own lines (litellm prints banners of its own on stdout).
    lines = [line for line in result.stdout.splitlines() if line.split(" ")[0] in CLIENTS]
    first, second = lines[: len(CLIENTS)], lines[len(CLIENTS) :]
    assert first == [f"{name} sent" for name in CLIENTS], result.stdout + result.stderr
    # Every second call refused, each as our own error (no SDK wrapper of it).
    assert second == [f"{name} refused BudgetExceededError" for name in CLIENTS], result.stdout
    assert server.request_count == len(CLIENTS)
