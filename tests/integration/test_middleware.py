"""Server middleware: one chain per request, joined to the caller's through a signed grant.

Real Starlette apps in-process (Starlette's ``TestClient``, WebSockets
included), a raw ASGI driver where the exact message sequence matters, and a
WSGI app through ``httpx2.WSGITransport``.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import httpx2
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient, WebSocketDenialResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

from veronica_otel import (
    BudgetExceededError,
    ExecutionConfig,
    ExecutionContext,
    LocalLedger,
    WrapOptions,
    current_context,
)
from veronica_otel._grants import Grant, GrantKeys, NonceCache, Spent, sign_grant, verify_spent
from veronica_otel._remote import issue_grant
from veronica_otel.middleware import VeronicaASGIMiddleware, VeronicaWSGIMiddleware

KEY = "middleware-test-key-0123456789ab"
CENT = WrapOptions(operation_name="step", cost_estimate_hint=0.01)


def make_grant(**overrides: Any) -> Grant:
    now = int(time.time())
    fields: dict[str, Any] = {
        "chain_id": "caller-chain",
        "depth": 0,
        "nonce": secrets.token_urlsafe(12),
        "issued_at": now,
        "expires_at": now + 60,
        "audience": "testserver",  # the Host the test clients send
        "carved": True,
    }
    fields.update(overrides)
    return Grant(**fields)


def baggage(grant: Grant, key: Any = KEY, extra: str = "") -> dict[str, str]:
    value = (
        f"veronica.chain={grant.chain_id},veronica.depth={grant.depth},"
        f"veronica.grant={sign_grant(grant, key)}"
    )
    return {"baggage": value + (f",{extra}" if extra else "")}


def rejected(reader: InMemoryMetricReader) -> dict[str, int]:
    counts: dict[str, int] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "veronica.grants.rejected":
                    for point in metric.data.data_points:
                        reason = str(point.attributes["veronica.grant.reason"])
                        counts[reason] = counts.get(reason, 0) + int(point.value)
    return counts


def describe(ctx: ExecutionContext) -> dict[str, Any]:
    config = ctx.config
    return {
        "chain_id": ctx.chain_id,
        "depth": ctx.depth,
        "max_steps": config.max_steps,
        "max_cost_usd": config.max_cost_usd,
        "max_tokens": config.max_tokens,
        "max_retries_total": config.max_retries_total,
        "max_depth": config.max_depth,
        "timeout_ms": config.timeout_ms,
    }


class Recorder:
    """What the application saw (the app runs in the TestClient's thread)."""

    def __init__(self) -> None:
        self.calls = 0
        self.errors: list[str] = []
        self.sent = 0


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


def build_app(recorder: Recorder, **middleware: Any) -> Starlette:
    async def chain(request: Request) -> JSONResponse:
        recorder.calls += 1
        ctx = current_context()
        assert ctx is not None
        return JSONResponse(describe(ctx))

    async def spend(request: Request) -> JSONResponse:
        recorder.calls += 1
        ctx = current_context()
        assert ctx is not None
        made = 0
        for _ in range(int(request.query_params.get("n", "1"))):
            try:
                ctx.begin_call("tool", CENT).finish()
            except BudgetExceededError:
                if request.query_params.get("escape"):
                    raise
                break
            made += 1
        return JSONResponse({"made": made, **describe(ctx)})

    def sync_spend(request: Request) -> JSONResponse:  # runs in Starlette's threadpool
        ctx = current_context()
        assert ctx is not None
        for _ in range(int(request.query_params.get("n", "1"))):
            ctx.begin_call("tool", CENT).finish()  # escapes on a trip
        return JSONResponse(describe(ctx))

    async def ws_send_loop(websocket: WebSocket) -> None:
        await websocket.accept()
        for _ in range(100):  # an app that keeps sending after an error
            try:
                await websocket.send_text("tick")
                recorder.sent += 1
            except BudgetExceededError as exc:
                recorder.errors.append(exc.reason)
                if len(recorder.errors) == 3:
                    return

    async def ws_echo(websocket: WebSocket) -> None:
        await websocket.accept()
        while True:
            text = await websocket.receive_text()
            await websocket.send_text(text.upper())

    async def ws_cancel(websocket: WebSocket) -> None:
        await websocket.accept()
        ctx = current_context()
        assert ctx is not None
        ctx.cancel()  # a trip from elsewhere while the app waits for the client
        try:
            await websocket.receive_text()
        except BudgetExceededError as exc:
            recorder.errors.append(exc.reason)
        try:
            await websocket.send_text("late")
        except BudgetExceededError as exc:
            recorder.errors.append(exc.reason)

    routes = [
        Route("/chain", chain),
        Route("/spend", spend),
        Route("/sync-spend", sync_spend),
        WebSocketRoute("/ws/send", ws_send_loop),
        WebSocketRoute("/ws/echo", ws_echo),
        WebSocketRoute("/ws/cancel", ws_cancel),
    ]
    if middleware.pop("inner", False):
        return Starlette(
            routes=routes, middleware=[Middleware(VeronicaASGIMiddleware, **middleware)]
        )
    return Starlette(routes=routes)


@pytest.fixture
def client_for(recorder: Recorder) -> Callable[..., TestClient]:
    def make(config: ExecutionConfig | None = None, **kwargs: Any) -> TestClient:
        kwargs.setdefault("grant_key", KEY)
        kwargs.setdefault("replay_cache", NonceCache())
        config = config if config is not None else ExecutionConfig(max_steps=10)
        if kwargs.pop("inner", False):
            return TestClient(build_app(recorder, inner=True, config=config, **kwargs))
        return TestClient(VeronicaASGIMiddleware(build_app(recorder), config, **kwargs))

    return make


# -- HTTP: joining a chain ------------------------------------------------------------


def test_without_a_grant_each_request_is_a_fresh_chain_from_local_config(
    client_for: Callable[..., TestClient],
) -> None:
    client = client_for(ExecutionConfig(max_steps=7, max_cost_usd=2.0))
    first, second = client.get("/chain").json(), client.get("/chain").json()
    assert first["depth"] == second["depth"] == 0
    assert first["chain_id"] != second["chain_id"]
    assert (first["max_steps"], first["max_cost_usd"]) == (7, 2.0)
    assert "veronica-spent" not in client.get("/chain").headers


def test_effective_limits_are_the_minimum_of_local_config_and_grant(
    client_for: Callable[..., TestClient],
) -> None:
    local = ExecutionConfig(
        max_steps=10, max_cost_usd=0.25, max_tokens=None, max_retries_total=1, max_depth=5
    )
    grant = make_grant(
        depth=1,
        steps=4,  # lower than local
        cost_nano=900_000_000,  # higher than local
        tokens=1000,  # local has none
        retries=None,  # grant has none
        max_depth=3,
        deadline_ms=int(time.time() * 1000) + 30_000,
    )
    seen = client_for(local).get("/chain", headers=baggage(grant)).json()
    assert seen["chain_id"].startswith("caller-chain:")
    assert seen["depth"] == 2
    assert seen["max_steps"] == 4
    assert seen["max_cost_usd"] == 0.25
    assert seen["max_tokens"] == 1000
    assert seen["max_retries_total"] == 1
    assert seen["max_depth"] == 3
    assert 25_000 < seen["timeout_ms"] <= 30_000


def test_a_joined_chain_is_held_to_the_grant_and_reports_its_spend(
    client_for: Callable[..., TestClient],
) -> None:
    grant = make_grant(steps=2, cost_nano=1_000_000_000)
    response = client_for().get("/spend", params={"n": 5}, headers=baggage(grant))
    assert response.status_code == 200
    assert response.json()["made"] == 2
    spent = verify_spent(response.headers["veronica-spent"], KEY, grant.nonce, "testserver")
    assert isinstance(spent, Spent)
    assert (spent.steps, spent.cost_nano) == (2, 20_000_000)


def test_depth_grows_by_one_per_hop_and_max_depth_is_enforced_before_the_app(
    client_for: Callable[..., TestClient], recorder: Recorder
) -> None:
    client = client_for(ExecutionConfig(max_depth=2))
    assert client.get("/chain", headers=baggage(make_grant(depth=1))).json()["depth"] == 2
    calls = recorder.calls
    response = client.get("/chain", headers=baggage(make_grant(depth=2)))
    assert response.status_code == 429
    body = response.json()
    assert body["error"] == "budget_exceeded"
    assert (body["reason"], body["limit"], body["observed"]) == ("depth", 2, 3)
    assert body["chain_id"].startswith("caller-chain:")
    assert recorder.calls == calls  # the handler never ran
    # The caller's max_depth counts too, whatever the local config says.
    response = client_for().get("/chain", headers=baggage(make_grant(depth=4, max_depth=4)))
    assert response.json()["reason"] == "depth"


@pytest.mark.parametrize(
    ("grant", "reason"),
    [
        pytest.param({"steps": 0}, "steps", id="no-steps-left"),
        pytest.param({"cost_nano": 0}, "cost", id="no-budget-left"),
        pytest.param({"tokens": 0}, "tokens", id="no-tokens-left"),
        pytest.param({"trip_reason": "loop"}, "loop", id="caller-tripped"),
        pytest.param({"deadline_ms": int(time.time() * 1000) - 1}, "timeout", id="past-deadline"),
    ],
)
def test_pre_flight_denial_is_a_429_json_naming_the_reason(
    grant: dict[str, Any],
    reason: str,
    client_for: Callable[..., TestClient],
    recorder: Recorder,
) -> None:
    response = client_for().get("/spend", headers=baggage(make_grant(**grant)))
    assert response.status_code == 429
    assert response.headers["content-type"] == "application/json"
    assert response.json()["reason"] == reason
    assert recorder.calls == 0


@pytest.mark.parametrize("inner", [False, True], ids=["wrapping-the-app", "add_middleware"])
def test_a_trip_escaping_the_handler_is_a_429_not_a_500(
    inner: bool, client_for: Callable[..., TestClient]
) -> None:
    client = client_for(ExecutionConfig(max_steps=3), inner=inner)
    response = client.get("/spend", params={"n": 5, "escape": 1})
    assert response.status_code == 429
    body = response.json()
    assert (body["reason"], body["limit"], body["observed"]) == ("steps", 3, 4)
    # A sync handler in the threadpool runs in the chain too.
    response = client.get("/sync-spend", params={"n": 4})
    assert (response.status_code, response.json()["reason"]) == (429, "steps")


def test_the_spend_of_a_denied_request_still_goes_back(
    client_for: Callable[..., TestClient],
) -> None:
    grant = make_grant(steps=2)
    response = client_for().get("/spend", params={"n": 5, "escape": 1}, headers=baggage(grant))
    assert response.status_code == 429
    spent = verify_spent(response.headers["veronica-spent"], KEY, grant.nonce, "testserver")
    assert isinstance(spent, Spent) and spent.steps == 2


def test_forged_and_oversized_grants_are_ignored_and_counted(
    client_for: Callable[..., TestClient], metric_reader: InMemoryMetricReader
) -> None:
    client = client_for(ExecutionConfig(max_steps=10))
    before = rejected(metric_reader)
    forger = {GrantKeys.single(KEY).kid: "x" * 32}  # our key id, another secret
    forged = client.get("/chain", headers=baggage(make_grant(steps=1), key=forger)).json()
    oversized = client.get(
        "/chain", headers=baggage(make_grant(steps=1), extra="pad=" + "p" * 9000)
    ).json()
    unsigned = client.get("/chain", headers={"baggage": "veronica.chain=c,veronica.depth=3"}).json()
    for seen in (forged, oversized, unsigned):
        assert (seen["depth"], seen["max_steps"]) == (0, 10)  # local config, fresh chain
        assert not seen["chain_id"].startswith("caller-chain")
    after = rejected(metric_reader)
    delta = {r: v - before.get(r, 0) for r, v in after.items() if v - before.get(r, 0)}
    assert delta == {"bad_signature": 1, "oversized": 1, "unsigned": 1}


def test_a_replayed_grant_runs_on_local_config(client_for: Callable[..., TestClient]) -> None:
    client = client_for(ExecutionConfig(max_steps=10))
    headers = baggage(make_grant(steps=1))
    assert client.get("/chain", headers=headers).json()["max_steps"] == 1
    again = client.get("/chain", headers=headers).json()
    assert (again["max_steps"], again["depth"]) == (10, 0)


def test_app_baggage_survives_and_veronica_entries_do_not_leak_into_the_handler(
    client_for: Callable[..., TestClient],
) -> None:
    from opentelemetry import baggage as otel_baggage

    seen: dict[str, object] = {}

    async def probe(request: Request) -> JSONResponse:
        seen.update(otel_baggage.get_all())
        return JSONResponse({})

    app = VeronicaASGIMiddleware(
        Starlette(routes=[Route("/probe", probe)]), grant_key=KEY, replay_cache=NonceCache()
    )
    TestClient(app).get("/probe", headers=baggage(make_grant(), extra="tenant=acme"))
    assert seen == {"tenant": "acme"}


def test_shared_ledger_charges_the_callers_chain_directly() -> None:
    class SharedLedger(LocalLedger):
        shared_id = "ledger-under-test"

    ledger = SharedLedger()
    caller = ExecutionContext(ExecutionConfig(max_steps=5), chain_id="caller-x", ledger=ledger)
    grant, carve = issue_grant(caller, audience="testserver")
    assert (grant.ledger_id, carve) == ("ledger-under-test", None)  # nothing carved
    recorder = Recorder()
    app = VeronicaASGIMiddleware(
        build_app(recorder), ledger=ledger, grant_key=KEY, replay_cache=NonceCache()
    )
    value = f"veronica.grant={sign_grant(grant, KEY)}"
    response = TestClient(app).get("/spend", params={"n": 2}, headers={"baggage": value})
    assert response.json()["made"] == 2
    assert caller.snapshot().steps == 2  # counted in the caller's chain, no header needed
    again, _ = issue_grant(caller, audience="testserver")
    value = f"veronica.grant={sign_grant(again, KEY)}"
    response = TestClient(app).get("/spend", params={"n": 9}, headers={"baggage": value})
    assert response.json()["made"] == 3  # the caller's own ceiling holds exactly
    assert caller.snapshot().steps == 5


# -- HTTP: what only a raw ASGI driver shows ------------------------------------------


def drive(app: Any, headers: list[tuple[bytes, bytes]] | None = None) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(dict(message))

    scope = {"type": "http", "method": "GET", "path": "/", "headers": headers or []}
    asyncio.run(app(scope, receive, send))
    return sent


def test_a_trip_after_the_response_started_aborts_it() -> None:
    async def streaming(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        ctx = current_context()
        assert ctx is not None
        ctx.begin_call("tool", CENT)

    app = VeronicaASGIMiddleware(streaming, ExecutionConfig(max_steps=0), grant_key=KEY)
    sent: list[dict[str, Any]] = []

    async def run() -> None:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(dict(message))

        await app({"type": "http", "headers": []}, receive, send)

    with pytest.raises(BudgetExceededError):
        asyncio.run(run())
    # The server aborts the connection: never a complete-looking response.
    assert [m.get("more_body") for m in sent if m["type"] == "http.response.body"] == [True]


def test_a_genuine_500_is_passed_through_unchanged() -> None:
    async def failing(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b"boom"})

    sent = drive(VeronicaASGIMiddleware(failing, grant_key=KEY))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 500 and sent[1]["body"] == b"boom"


def streaming_spender(chunks: int, size: int) -> Any:
    """An ASGI app streaming ``chunks`` bodies of ``size`` bytes, one step spent per chunk."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(chunks):
            ctx = current_context()
            assert ctx is not None
            ctx.begin_call("tool", CENT).finish()
            await send({"type": "http.response.body", "body": b"x" * size, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


def test_spend_while_a_granted_body_streams_is_in_the_spend_back() -> None:
    grant = make_grant(steps=5)
    app = VeronicaASGIMiddleware(
        streaming_spender(3, 10), grant_key=KEY, replay_cache=NonceCache(), audience="testserver"
    )
    headers = [(b"baggage", baggage(grant)["baggage"].encode())]
    sent = drive(app, headers)
    start = dict(sent[0]["headers"])
    spent = verify_spent(start[b"veronica-spent"].decode(), KEY, grant.nonce, "testserver")
    assert isinstance(spent, Spent) and spent.steps == 3  # all three, not the first one only
    assert b"".join(m.get("body", b"") for m in sent[1:]) == b"x" * 30


def test_a_granted_body_too_long_to_hold_goes_without_a_spend_back() -> None:
    grant = make_grant(steps=5)
    app = VeronicaASGIMiddleware(
        streaming_spender(3, 10),
        grant_key=KEY,
        replay_cache=NonceCache(),
        audience="testserver",
        spent_buffer_bytes=15,
    )
    sent = drive(app, [(b"baggage", baggage(grant)["baggage"].encode())])
    assert b"veronica-spent" not in dict(sent[0]["headers"])  # the caller commits its carve
    assert b"".join(m.get("body", b"") for m in sent[1:]) == b"x" * 30


# -- WebSocket ---------------------------------------------------------------------------


def test_websocket_trip_mid_session_closes_1008_and_every_later_send_raises(
    client_for: Callable[..., TestClient], recorder: Recorder
) -> None:
    client = client_for(ExecutionConfig(max_steps=3))
    with client.websocket_connect("/ws/send") as ws:
        assert [ws.receive_text() for _ in range(3)] == ["tick"] * 3
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
    assert closed.value.code == 1008
    assert closed.value.reason == "budget_exceeded: steps"
    assert recorder.sent == 3
    assert recorder.errors == ["steps", "steps", "steps"]  # the loop cannot spin


def test_each_websocket_receive_and_send_is_a_step(client_for: Callable[..., TestClient]) -> None:
    client = client_for(ExecutionConfig(max_steps=4))
    with client.websocket_connect("/ws/echo") as ws:
        ws.send_text("a")  # receive 1, send 2
        assert ws.receive_text() == "A"
        ws.send_text("b")  # receive 3, send 4
        assert ws.receive_text() == "B"
        ws.send_text("c")  # receive 5: denied
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
    assert closed.value.code == 1008


def test_websocket_is_closed_at_once_when_the_chain_stops_while_waiting(
    client_for: Callable[..., TestClient], recorder: Recorder
) -> None:
    client = client_for()
    with client.websocket_connect("/ws/cancel") as ws, pytest.raises(WebSocketDisconnect) as closed:
        ws.receive_text()  # nothing sent by the client: only the trip wakes the app
    assert closed.value.code == 1008
    assert recorder.errors == ["timeout", "timeout"]


def test_websocket_pre_flight_denial(client_for: Callable[..., TestClient]) -> None:
    client = client_for(ExecutionConfig(max_depth=0))
    with (
        pytest.raises(WebSocketDenialResponse) as denied,
        client.websocket_connect("/ws/echo", headers=baggage(make_grant(depth=0))),
    ):
        pass
    assert denied.value.status_code == 429
    assert denied.value.json()["reason"] == "depth"


# -- WSGI ----------------------------------------------------------------------------------


def wsgi_app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    ctx = current_context()
    assert ctx is not None
    query = environ.get("QUERY_STRING", "")
    for _ in range(int(query.split("n=")[1]) if "n=" in query else 0):
        ctx.begin_call("tool", CENT).finish()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps(describe(ctx)).encode()]


def streaming_wsgi_app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
    ctx = current_context()  # called lazily, inside the iteration
    assert ctx is not None
    start_response("200 OK", [("Content-Type", "text/plain")])
    late = "late" in environ.get("QUERY_STRING", "")
    if late:
        yield b"first chunk"
    ctx.begin_call("tool", CENT)
    yield b"never"


@pytest.fixture
def wsgi_client() -> Iterator[Callable[..., httpx2.Client]]:
    clients: list[httpx2.Client] = []

    def make(app: Any, config: ExecutionConfig | None = None) -> httpx2.Client:
        wrapped = VeronicaWSGIMiddleware(app, config, grant_key=KEY, replay_cache=NonceCache())
        # Like a real server: start_response(..., exc_info) before any body replaces
        # the response instead of raising.
        transport = httpx2.WSGITransport(app=wrapped, raise_app_exceptions=False)
        client = httpx2.Client(transport=transport, base_url="http://testserver")
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def test_wsgi_joins_the_callers_chain(wsgi_client: Callable[..., httpx2.Client]) -> None:
    client = wsgi_client(wsgi_app, ExecutionConfig(max_steps=10))
    fresh = client.get("/").json()
    assert (fresh["depth"], fresh["max_steps"]) == (0, 10)
    grant = make_grant(depth=3, steps=2)
    response = client.get("/", params={"n": 2}, headers=baggage(grant))
    joined = response.json()
    assert (joined["depth"], joined["max_steps"]) == (4, 2)
    spent = verify_spent(response.headers["veronica-spent"], KEY, grant.nonce, "testserver")
    assert isinstance(spent, Spent) and spent.steps == 2


def test_wsgi_pre_flight_and_escaping_trips_are_429(
    wsgi_client: Callable[..., httpx2.Client],
) -> None:
    client = wsgi_client(wsgi_app, ExecutionConfig(max_steps=2, max_depth=1))
    denied = client.get("/", headers=baggage(make_grant(depth=1)))
    assert (denied.status_code, denied.json()["reason"]) == (429, "depth")
    escaped = client.get("/", params={"n": 3})
    assert (escaped.status_code, escaped.json()["reason"]) == (429, "steps")


def test_wsgi_trip_while_iterating_the_body(wsgi_client: Callable[..., httpx2.Client]) -> None:
    client = wsgi_client(streaming_wsgi_app, ExecutionConfig(max_steps=0))
    early = client.get("/")
    assert (early.status_code, early.json()["reason"]) == (429, "steps")
    with pytest.raises(BudgetExceededError):  # headers are out: the response is aborted
        client.get("/", params={"late": 1})


def spending_body_app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    """Starts the answer, then spends one step per body chunk while it is iterated."""
    start_response("200 OK", [("Content-Type", "text/plain")])

    def body() -> Iterator[bytes]:
        for _ in range(3):
            ctx = current_context()
            assert ctx is not None
            ctx.begin_call("tool", CENT).finish()
            yield b"chunk "

    return body()


def test_wsgi_spend_while_the_body_is_iterated_is_in_the_spend_back(
    wsgi_client: Callable[..., httpx2.Client],
) -> None:
    client = wsgi_client(spending_body_app, ExecutionConfig(max_steps=10))
    grant = make_grant(steps=5)
    response = client.get("/", headers=baggage(grant))
    assert response.text == "chunk " * 3
    spent = verify_spent(response.headers["veronica-spent"], KEY, grant.nonce, "testserver")
    assert isinstance(spent, Spent) and spent.steps == 3  # not 0: counted after the body


def test_wsgi_a_trip_in_a_held_body_is_still_a_429(
    wsgi_client: Callable[..., httpx2.Client],
) -> None:
    client = wsgi_client(spending_body_app, ExecutionConfig(max_steps=10))
    grant = make_grant(steps=2)  # the third chunk trips: nothing was sent yet
    response = client.get("/", headers=baggage(grant))
    assert (response.status_code, response.json()["reason"]) == (429, "steps")
    spent = verify_spent(response.headers["veronica-spent"], KEY, grant.nonce, "testserver")
    assert isinstance(spent, Spent) and spent.steps == 2


def test_a_malformed_audience_names_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERONICA_GRANT_AUDIENCE", "orders.internal, bad host")
    with pytest.raises(ValueError, match="VERONICA_GRANT_AUDIENCE"):
        VeronicaASGIMiddleware(wsgi_app, grant_key=KEY)
    with pytest.raises(ValueError, match="audience"):
        VeronicaWSGIMiddleware(wsgi_app, grant_key=KEY, audience=["a/b"])


def test_a_websocket_session_is_a_chain_named_websocket_and_a_request_one_named_request(
    client_for: Callable[..., TestClient], span_exporter: InMemorySpanExporter
) -> None:
    client = client_for(ExecutionConfig(max_steps=1))
    with client.websocket_connect("/ws/send") as ws, pytest.raises(WebSocketDisconnect):
        ws.receive_text()
        ws.receive_text()  # the session's chain tripped: closed 1008
    client.get("/chain")
    roots = [s.name for s in span_exporter.get_finished_spans() if s.name.startswith("invoke_")]
    assert roots == ["invoke_workflow websocket", "invoke_workflow request"]
