"""Zero code with hostile configuration: the unchanged app's LLM calls are refused, loudly.

The app, the SDK and the HTTP traffic are real; the fake server's request
count is the truth of what was sent. Each test here starts a process, since
the instrumentors' own installation is what reads these variables; a hostile
policy file, read when the default chain is built, is in ``test_zero_code.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests._zero_code import UNCHANGED_AGENT, run_instrumented
from veronica_otel.testing import FakeLLMServer

CHAT = "/v1/chat/completions"


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=10) as srv:
        yield srv


def test_a_bad_propagation_variable_is_named_and_calls_are_refused(server: FakeLLMServer) -> None:
    result = run_instrumented(
        UNCHANGED_AGENT,
        server,
        VERONICA_MAX_STEPS="3",
        VERONICA_PROPAGATE_HOSTS="svc:99999",
        VERONICA_GRANT_KEY="k" * 16,
    )
    assert result.returncode != 0
    assert result.stdout == ""
    assert server.count(CHAT) == 0
    assert "VERONICA_PROPAGATE_HOSTS: bad port in host pattern 'svc:99999'" in result.stderr
    # The instrumentors that read the variable say which one stopped them.
    failures = [line for line in result.stderr.splitlines() if "could not install" in line]
    assert failures
    assert all("VERONICA_PROPAGATE_HOSTS" in line for line in failures)


def test_a_bad_vendor_guard_mode_is_named_and_calls_are_refused(server: FakeLLMServer) -> None:
    result = run_instrumented(
        UNCHANGED_AGENT, server, VERONICA_MAX_STEPS="3", VERONICA_VENDOR_GUARD="contian"
    )
    assert result.returncode != 0
    assert result.stdout == ""  # not one step ran uncontained
    assert server.count(CHAT) == 0
    assert "VERONICA_VENDOR_GUARD must be one of contain, refuse, off, got 'contian'" in (
        result.stderr
    )
