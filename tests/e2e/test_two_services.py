"""Two services in two processes share one chain.

Service B is a Starlette app under uvicorn (a subprocess) behind
``VeronicaASGIMiddleware``, asking the fake LLM server through the openai SDK.
Process A (another subprocess) opens a chain with ``max_steps=3``, asks the LLM
once, calls B with httpx2, and asks again. The fake LLM server's request log
is the ground truth of what was sent, and of which headers went with it.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from veronica_otel._grants import Grant, GrantKeys, sign_grant
from veronica_otel.testing import FakeLLMServer

APPS = Path(__file__).parent / "apps"
KEY = "two-services-grant-key-0123456789"
# A bound, not a speed: service B starts in about a second, far longer on a busy
# machine (a run beside other jobs took past 30 s); a dead one is seen at once.
STARTUP_S = 120.0


def environment(llm: FakeLLMServer, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("VERONICA_", "OTEL_", "OPENAI_", "ANTHROPIC_"))
    }
    env.update(
        OPENAI_BASE_URL=llm.openai_base_url,
        OPENAI_API_KEY="test-key",
        VERONICA_GRANT_KEY=KEY,
        VERONICA_PROPAGATE_HOSTS="127.0.0.1",
    )
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServiceB:
    port: int
    log: Path
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        """A plain request from the test process (stdlib: no instrumentation)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", path, headers=headers or {})
            response = conn.getresponse()
            return response.status, json.loads(response.read())
        finally:
            conn.close()


@pytest.fixture(scope="module")
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=10) as server:
        yield server


def start_service_b(
    llm: FakeLLMServer,
    tmp_path_factory: pytest.TempPathFactory,
    *,
    audience: bool = False,
    **env: str,
) -> ServiceB:
    """Service B under uvicorn on a free port; ``audience``: it names itself
    (``VERONICA_GRANT_AUDIENCE``) instead of trusting the Host header."""
    port = free_port()
    if audience:
        env["VERONICA_GRANT_AUDIENCE"] = f"127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("service_b") / "stderr.log"
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "service_b:app",
                "--app-dir",
                str(APPS),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "warning",
                "--no-access-log",
            ],
            env=environment(llm, VERONICA_MAX_STEPS="10", **env),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    service = ServiceB(port, log, process)
    deadline = time.monotonic() + STARTUP_S
    while True:  # bounded poll for start-up
        try:
            if service.get("/health")[0] == 200:
                return service
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            stop(service)
            pytest.fail(f"service B did not start:\n{log.read_text()}")
        time.sleep(0.05)


def stop(service: ServiceB) -> None:
    service.process.terminate()
    try:
        service.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        service.process.kill()
        service.process.wait(timeout=10)


@pytest.fixture(scope="module")
def service_b(llm: FakeLLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceB]:
    service = start_service_b(llm, tmp_path_factory)
    yield service
    stop(service)


def run_client_a(llm: FakeLLMServer, service: ServiceB, calls: int, **env: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, str(APPS / "client_a.py"), str(calls)],
        env=environment(llm, SERVICE_B_URL=service.url, **env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def grant_header(service: ServiceB, key: Any = KEY, **overrides: Any) -> str:
    now = int(time.time())
    fields: dict[str, Any] = {
        "chain_id": "outside-chain",
        "depth": 0,
        "nonce": secrets.token_urlsafe(12),
        "issued_at": now,
        "expires_at": now + 60,
        "audience": f"127.0.0.1:{service.port}",
        "steps": 1,
        "carved": True,
    }
    fields.update(overrides)
    return f"veronica.chain=outside-chain,veronica.grant={sign_grant(Grant(**fields), key)}"


def test_two_processes_share_one_chain(llm: FakeLLMServer, service_b: ServiceB) -> None:
    llm.reset()
    report = run_client_a(llm, service_b, calls=5)
    b = report["b"]
    # B joined A's chain one hop down, held to what A had left (3 - 1 = 2 steps).
    assert report["b_status"] == 200
    assert b["chain_id"].startswith(report["chain_id"] + ":")
    assert (b["depth"], b["max_steps"]) == (1, 2)
    assert (b["made"], b["denied"]) == (2, "steps")
    # B's spend is in A's chain: the steps limit spans both processes.
    own, after = report["after_own_call"], report["after_b"]
    assert (own["steps"], after["steps"]) == (1, 3)
    assert after["cost_usd"] == pytest.approx(own["cost_usd"] + b["cost_usd"], abs=1e-9)
    assert after["tokens"] == own["tokens"] + b["tokens"] > own["tokens"] > 0
    assert report["last_call"] == "steps"
    # Ground truth: three model calls in all, traced, and no baggage on any of them.
    assert llm.count("/v1/chat/completions") == 3
    for request in llm.requests:
        assert "traceparent" in request.headers
        assert "veronica" not in json.dumps(dict(request.headers)).lower()
        assert "baggage" not in request.headers


def test_forged_and_oversized_grants_are_ignored_by_b(service_b: ServiceB) -> None:
    before = service_b.get("/stats")[1]
    forger = {GrantKeys.single(KEY).kid: "an-attackers-key-0123456789abcdef"}
    forged = grant_header(service_b, key=forger, steps=1)
    status, seen = service_b.get("/agent?calls=0", {"baggage": forged})
    assert status == 200
    assert (seen["depth"], seen["max_steps"]) == (0, 10)  # B's local config
    assert not seen["chain_id"].startswith("outside-chain")
    oversized = grant_header(service_b, steps=1) + ",padding=" + "p" * 9000
    status, seen = service_b.get("/agent?calls=0", {"baggage": oversized})
    assert (status, seen["depth"], seen["max_steps"]) == (200, 0, 10)
    after = service_b.get("/stats")[1]
    for reason in ("bad_signature", "oversized"):
        assert after.get(reason, 0) - before.get(reason, 0) == 1
    log = service_b.log.read_text()
    assert "budget grant rejected (bad_signature)" in log
    assert "budget grant rejected (oversized)" in log


def test_a_grant_is_good_for_one_request_only(service_b: ServiceB) -> None:
    header = grant_header(service_b, steps=4)
    status, joined = service_b.get("/agent?calls=0", {"baggage": header})
    assert (status, joined["depth"], joined["max_steps"]) == (200, 1, 4)
    before = service_b.get("/stats")[1]
    status, replayed = service_b.get("/agent?calls=0", {"baggage": header})
    assert (status, replayed["depth"], replayed["max_steps"]) == (200, 0, 10)
    assert service_b.get("/stats")[1].get("replayed", 0) == before.get("replayed", 0) + 1


def test_b_refuses_before_the_handler_when_the_caller_has_nothing_left(
    service_b: ServiceB, llm: FakeLLMServer
) -> None:
    sent = llm.count("/v1/chat/completions")
    status, body = service_b.get("/agent?calls=3", {"baggage": grant_header(service_b, steps=0)})
    assert status == 429
    assert (body["error"], body["reason"]) == ("budget_exceeded", "steps")
    assert llm.count("/v1/chat/completions") == sent
