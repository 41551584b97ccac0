"""Middleware with the shared budget store down: 503 JSON, the handler never runs, never a 500.

A real Valkey that is stopped (or stopped mid-request), and a port where
nothing listens; real Starlette apps through Starlette's ``TestClient`` (which
would show an unhandled error as a 500, not raise it), and a WSGI app through
``httpx2.WSGITransport``.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import httpx2
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient, WebSocketDenialResponse
from starlette.websockets import WebSocket

from veronica_otel import ExecutionConfig, WrapOptions, current_context
from veronica_otel.distributed import RedisLedger
from veronica_otel.middleware import VeronicaASGIMiddleware, VeronicaWSGIMiddleware
from veronica_otel.testing import RedisServerProcess

STEP = WrapOptions(operation_name="step")
CONFIG = ExecutionConfig(max_steps=10)
UNAVAILABLE = "budget store unavailable"


class Handler:
    """Counts how often the application ran; optionally stops the store first."""

    def __init__(self) -> None:
        self.runs = 0
        self.stop_store: RedisServerProcess | None = None

    def step(self) -> None:
        self.runs += 1
        if self.stop_store is not None:
            self.stop_store.stop()  # the store goes down while the request runs
        ctx = current_context()
        assert ctx is not None
        ctx.begin_call("tool", STEP).finish()


def starlette_app(handler: Handler) -> Starlette:
    async def spend(request: Request) -> JSONResponse:
        handler.step()
        return JSONResponse({"ok": True})

    async def echo(websocket: WebSocket) -> None:
        handler.runs += 1
        await websocket.accept()
        await websocket.send_text("hi")
        await websocket.close()

    return Starlette(routes=[Route("/spend", spend), WebSocketRoute("/ws", echo)])


def wsgi_app(handler: Handler) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        handler.step()
        start_response("200 OK", [("Content-Type", "application/json")])
        return [b'{"ok":true}']

    return app


def lazy_wsgi_app(handler: Handler) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        handler.step()  # runs while the server iterates the body
        start_response("200 OK", [("Content-Type", "application/json")])
        yield b'{"ok":true}'

    return app


def unreachable_url() -> str:
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


@pytest.fixture
def handler() -> Handler:
    return Handler()


@pytest.fixture
def stopped_store(restartable_redis: RedisServerProcess) -> str:
    url = restartable_redis.url
    restartable_redis.stop()
    return url


@pytest.fixture(params=["stopped", "unreachable"])
def down_url(request: pytest.FixtureRequest) -> str:
    if request.param == "stopped":
        return str(request.getfixturevalue("stopped_store"))
    return unreachable_url()


def asgi_client(handler: Handler, ledger: RedisLedger) -> TestClient:
    app = VeronicaASGIMiddleware(starlette_app(handler), CONFIG, ledger=ledger)
    return TestClient(app, raise_server_exceptions=False)


@pytest.fixture
def wsgi_client() -> Iterator[Any]:
    clients: list[httpx2.Client] = []

    def make(handler: Handler, ledger: RedisLedger, *, lazy: bool = False) -> httpx2.Client:
        inner = lazy_wsgi_app(handler) if lazy else wsgi_app(handler)
        app = VeronicaWSGIMiddleware(inner, CONFIG, ledger=ledger)
        transport = httpx2.WSGITransport(app=app, raise_app_exceptions=False)
        clients.append(httpx2.Client(transport=transport, base_url="http://svc"))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


def assert_unavailable(response: Any) -> None:
    assert response.status_code == 503
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["error"] == UNAVAILABLE
    assert "could not be reached" in body["reason"]
    assert "redis://" not in response.text  # the store's address stays in the logs


def test_asgi_store_down_is_a_503_and_the_handler_never_runs(
    handler: Handler, down_url: str
) -> None:
    client = asgi_client(handler, RedisLedger.from_url(down_url, fail_open=False))
    assert_unavailable(client.get("/spend"))
    assert handler.runs == 0


def test_wsgi_store_down_is_a_503_and_the_app_never_runs(
    handler: Handler, down_url: str, wsgi_client: Any
) -> None:
    client = wsgi_client(handler, RedisLedger.from_url(down_url, fail_open=False))
    assert_unavailable(client.get("/spend"))
    assert handler.runs == 0


def test_websocket_store_down_is_refused_with_503(handler: Handler, stopped_store: str) -> None:
    client = asgi_client(handler, RedisLedger.from_url(stopped_store, fail_open=False))
    with pytest.raises(WebSocketDenialResponse) as denied, client.websocket_connect("/ws"):
        pass
    assert_unavailable(denied.value)
    assert handler.runs == 0


def test_asgi_store_going_down_mid_request_is_a_503_not_a_500(
    handler: Handler, restartable_redis: RedisServerProcess, redis_prefix: str
) -> None:
    ledger = RedisLedger.from_url(restartable_redis.url, key_prefix=redis_prefix, fail_open=False)
    client = asgi_client(handler, ledger)
    assert client.get("/spend").status_code == 200
    handler.stop_store = restartable_redis
    assert_unavailable(client.get("/spend"))
    assert handler.runs == 2


def test_wsgi_store_going_down_mid_request_is_a_503_not_a_500(
    handler: Handler,
    restartable_redis: RedisServerProcess,
    redis_prefix: str,
    wsgi_client: Any,
) -> None:
    ledger = RedisLedger.from_url(restartable_redis.url, key_prefix=redis_prefix, fail_open=False)
    client = wsgi_client(handler, ledger)
    assert client.get("/spend").status_code == 200
    handler.stop_store = restartable_redis
    assert_unavailable(client.get("/spend"))


def test_wsgi_store_going_down_while_the_body_is_iterated_is_a_503(
    handler: Handler,
    restartable_redis: RedisServerProcess,
    redis_prefix: str,
    wsgi_client: Any,
) -> None:
    ledger = RedisLedger.from_url(restartable_redis.url, key_prefix=redis_prefix, fail_open=False)
    client = wsgi_client(handler, ledger, lazy=True)
    assert client.get("/spend").status_code == 200
    handler.stop_store = restartable_redis
    assert_unavailable(client.get("/spend"))


def test_fail_open_still_runs_requests_on_a_local_ledger(
    handler: Handler, stopped_store: str, wsgi_client: Any
) -> None:
    asgi = asgi_client(handler, RedisLedger.from_url(stopped_store, fail_open=True))
    assert asgi.get("/spend").status_code == 200
    wsgi = wsgi_client(handler, RedisLedger.from_url(stopped_store, fail_open=True))
    assert wsgi.get("/spend").status_code == 200
    assert handler.runs == 2


def test_a_limit_is_still_a_429(handler: Handler, redis_url: str, redis_prefix: str) -> None:
    ledger = RedisLedger.from_url(redis_url, key_prefix=redis_prefix, fail_open=False)
    config = ExecutionConfig(max_steps=0)
    app = VeronicaASGIMiddleware(starlette_app(handler), config, ledger=ledger)
    response = TestClient(app, raise_server_exceptions=False).get("/spend")
    assert response.status_code == 429
    assert response.json()["reason"] == "steps"


def test_under_uvicorn_the_store_down_answer_is_a_503(handler: Handler, stopped_store: str) -> None:
    import uvicorn

    app = VeronicaASGIMiddleware(
        starlette_app(handler), CONFIG, ledger=RedisLedger.from_url(stopped_store, fail_open=False)
    )
    # Listening before the server runs: the request waits in the backlog, no polling.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    try:
        with httpx2.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            assert_unavailable(client.get("/spend"))
    finally:
        server.should_exit = True
        thread.join()
        sock.close()
    assert handler.runs == 0
