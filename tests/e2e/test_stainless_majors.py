"""openai 2.x and anthropic below 2 contained, as the agent frameworks pin them.

Each venv is built by pip from the package indexes (cached between runs,
:mod:`tests._venvs`) with this checkout's ``[openai,anthropic]`` extras and
an older SDK major pinned next to it, as a user types it
(``pip install veronica-otel[openai] 'openai<3'`` must resolve). One app,
``apps/stainless_checks.py``, runs every check once per venv against a fake
server in its own process and reports the server's own counts; each test
here reads one part of that report.

- OPENAI_2: openai 2.54 and anthropic 0.79 (the retry loop in ``request``, httpx);
- OPENAI_2_LOW: openai 2.30 (the lowest supported) and anthropic 0.125
  (per-attempt ``_attempt_request`` and middleware, httpx);
- ANTHROPIC_1: anthropic 1.17 (its own spans around ``_request``, httpx2).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests import _venvs
from veronica_otel.testing import FakeLLMServer

APP = Path(__file__).parent / "apps" / "stainless_checks.py"
UNCHANGED = Path(__file__).parent / "apps" / "unchanged_agent.py"  # five openai calls
TIMEOUT = 300
N = 3  # the app's max_steps

# venv -> (versions it must hold, the anthropic hooks its shape takes, the HTTP library)
EXPECTED: dict[str, tuple[dict[str, str], str | None, dict[str, str]]] = {
    "OPENAI_2": (
        {"openai": "2.54.0", "anthropic": "0.79.0"},
        "SyncAPIClient._sleep_for_retry",
        {"openai": "httpx", "anthropic": "httpx"},
    ),
    "OPENAI_2_LOW": (
        {"openai": "2.30.0", "anthropic": "0.125.0"},
        "SyncAPIClient._attempt_request",
        {"openai": "httpx", "anthropic": "httpx"},
    ),
    "ANTHROPIC_1": ({"anthropic": "1.17.0"}, "SyncAPIClient._request", {"anthropic": "httpx2"}),
}


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def report(request: pytest.FixtureRequest) -> dict[str, Any]:
    name: str = request.param
    try:
        root = _venvs.venv(name.lower(), getattr(_venvs, name))
    except subprocess.CalledProcessError as exc:  # say what pip said, do not hide it
        pytest.fail(f"building the {name} venv: {_venvs.build_error(exc)}")
    done = subprocess.run(
        [str(root / "bin" / "python"), str(APP)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=root,  # not the clone: the installed copy is what is imported
        env={"PATH": str(root / "bin"), "HOME": str(Path.home()), **_venvs.plain_http_tls()},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    found["venv"] = name
    found["root"] = str(root)
    return found


def _checks(report: dict[str, Any], check: str) -> list[tuple[str, dict[str, Any]]]:
    """``(sdk, result)`` of ``check`` for every SDK of the venv; a check that raised fails."""
    results = []
    for sdk in ("openai", "anthropic"):
        if sdk in report:
            result = report[sdk][check]
            assert "error" not in result, f"{report['venv']} {sdk} {check}: {result.get('trace')}"
            results.append((sdk, result))
    assert results
    return results


def test_the_older_majors_install_with_our_extras_and_are_instrumented(
    report: dict[str, Any],
) -> None:
    versions, anthropic_hook, http = EXPECTED[report["venv"]]
    for sdk, expected in versions.items():
        assert report["versions"][sdk] == expected
    assert anthropic_hook in report["hooks"]["anthropic"]  # the shape probed for this release
    if "openai" in report:
        assert "SyncAPIClient.request" in report["hooks"]["openai"]
    for sdk, result in _checks(report, "steps_sync"):
        assert result["http"] == http[sdk]


@pytest.mark.parametrize("check", ["steps_sync", "steps_async", "steps_threads"])
def test_max_steps_lets_exactly_n_requests_reach_the_server(
    report: dict[str, Any], check: str
) -> None:
    for sdk, result in _checks(report, check):
        assert result["at_server"] == N, (sdk, result)
        assert sorted(result["outcomes"]) == ["denied:steps"] * 2 + ["sent"] * N, (sdk, result)
        assert result["steps"] == N and result["reserved"] == 0


def test_a_cost_ceiling_holds_on_the_usage_the_provider_reports(report: dict[str, Any]) -> None:
    for sdk, result in _checks(report, "cost_ceiling"):
        sent = result["outcomes"].count("sent")
        assert result["outcomes"][-1] == "denied:cost", (sdk, result)
        assert result["at_server"] == sent > 2
        assert result["cost"] == pytest.approx(result["billed"], abs=1e-12)  # the server's usage
        assert result["cost"] <= result["ceiling"] and result["reserved"] == 0


def test_a_stream_is_cut_when_its_chain_trips(report: dict[str, Any]) -> None:
    for sdk, result in _checks(report, "stream_cut"):
        assert result["tripping"] == result["cut"] == "denied:steps", (sdk, result)
        assert result["closed"] and result["reserved"] == 0
        assert result["at_server"] == 2


def test_a_500_then_success_costs_the_reply_and_draws_a_retry(report: dict[str, Any]) -> None:
    for sdk, result in _checks(report, "retry_after_500"):
        assert result["outcome"] == "sent", (sdk, result)
        assert result["at_server"] == 2 and result["retries"] == 1 and result["steps"] == 1
        assert result["cost"] == pytest.approx(result["billed"], abs=1e-12)  # zero for the 500


def test_a_retry_over_the_chain_limit_is_never_sent(report: dict[str, Any]) -> None:
    for sdk, result in _checks(report, "retry_refused"):
        assert result["outcome"] == "denied:retries", (sdk, result)
        assert result["at_server"] == 1 and result["cost"] == 0 and result["reserved"] == 0


def test_an_error_reply_costs_nothing_and_reaches_the_caller(report: dict[str, Any]) -> None:
    for sdk, result in _checks(report, "status_error"):
        assert result["raised"] == "InternalServerError:500", (sdk, result)
        assert result["at_server"] == 1 and result["steps"] == 1
        assert result["cost"] == 0 and result["reserved"] == 0


@pytest.mark.parametrize(
    ("check", "raised"),
    [("timeout_after_send", "APITimeoutError"), ("cancelled_after_send", "cancelled")],
)
def test_a_call_lost_after_sending_costs_its_reservation(
    report: dict[str, Any], check: str, raised: str
) -> None:
    for sdk, result in _checks(report, check):
        assert result["raised"] == raised, (sdk, result)
        assert result["at_server"] == 1
        assert result["reservation"] > 0
        assert result["cost"] == pytest.approx(result["reservation"], abs=1e-12)
        assert result["reserved"] == 0


def test_zero_code_contains_an_unchanged_openai_2_app(report: dict[str, Any]) -> None:
    if "openai" not in report:
        pytest.skip("no openai in this venv")
    root = Path(report["root"])
    with FakeLLMServer() as server:
        done = subprocess.run(
            [
                str(root / "bin" / "opentelemetry-instrument"),
                str(root / "bin" / "python"),
                UNCHANGED,
            ],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            cwd=root,
            env={
                "PATH": str(root / "bin"),
                "HOME": str(Path.home()),
                "OPENAI_BASE_URL": server.openai_base_url,
                "OPENAI_API_KEY": "k",
                "OTEL_TRACES_EXPORTER": "none",
                "OTEL_METRICS_EXPORTER": "none",
                "OTEL_LOGS_EXPORTER": "none",
                "VERONICA_MAX_STEPS": "2",
                **_venvs.plain_http_tls(),
            },
            check=False,
        )
        sent = server.count("/v1/chat/completions")
    assert sent == 2, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["step 0 ok", "step 1 ok"]
    assert done.returncode != 0 and "BudgetExceededError" in done.stderr
    assert "steps limit reached" in done.stderr
