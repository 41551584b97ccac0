"""WebSocket close codes: can the client try again, and when?

A real uvicorn server (the ``websockets-sansio`` protocol, which offers the ASGI
``websocket.http.response`` extension) and the ``websockets`` client. A
budget pool out of room refuses a new session with HTTP 429 and
``Retry-After``; mid-session, or on a server without the extension, the
session closes with 1013 ("try again later") and a reason carrying the wait.
A budget store that cannot be reached closes with 1013 too (our outage). A
chain's own ceiling stays 1008 (policy violation): waiting does not help.
"""

from __future__ import annotations

import json
import math
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests._clock import FakeClock
from veronica_otel import BudgetPool, ExecutionConfig, LocalLedger
from veronica_otel.distributed import RedisLedger
from veronica_otel.middleware import VeronicaASGIMiddleware
from veronica_otel.testing import RedisServerProcess

ASGIApp = Callable[..., Any]
CONFIG = ExecutionConfig(max_steps=100)
LONG_POOL = "tenant:" + "x" * 121  # the longest pool name there can be (128)


class Echo:
    """A Starlette app echoing text upper-cased; counts the sessions it ran."""

    def __init__(self) -> None:
        self.sessions = 0
        self.app = Starlette(routes=[WebSocketRoute("/ws", self.echo)])

    async def echo(self, websocket: WebSocket) -> None:
        self.sessions += 1
        await websocket.accept()
        try:
            while True:
                await websocket.send_text((await websocket.receive_text()).upper())
        except WebSocketDisconnect:
            pass


def without_http_response(app: ASGIApp) -> ASGIApp:
    """The app as a server without ``websocket.http.response`` would run it."""

    async def plain(scope: dict[str, Any], receive: Any, send: Any) -> None:
        extensions = {
            k: v
            for k, v in (scope.get("extensions") or {}).items()
            if k != "websocket.http.response"
        }
        await app({**scope, "extensions": extensions}, receive, send)

    return plain


@contextmanager
def serve(app: ASGIApp) -> Iterator[str]:
    """Run ``app`` under uvicorn; yield the WebSocket URL of ``/ws``."""
    # Listening before the server runs: the handshake waits in the backlog, no polling.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, ws="websockets-sansio", log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    try:
        yield f"ws://127.0.0.1:{port}/ws"
    finally:
        server.should_exit = True
        thread.join()
        sock.close()


def session(url: str) -> Any:
    return connect(url, proxy=None, open_timeout=30, close_timeout=30)


def closed_by_server(ws: Any) -> ConnectionClosed:
    """Wait for the server's close frame (the next ``recv`` raises)."""
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=30)
    assert closed.value.rcvd is not None, "no close frame from the server"
    return closed.value


class Pooled:
    """Sessions spending from one hourly pool of 3 steps, on a clock the test holds."""

    def __init__(self, name: str = "tenant:acme") -> None:
        self.echo = Echo()
        self.ledger = LocalLedger(clock=FakeClock(1000.0))
        self.pool = BudgetPool(name, max_steps=3, window="1h", ledger=self.ledger)
        self.app = VeronicaASGIMiddleware(
            self.echo.app, CONFIG, ledger=self.ledger, pools=lambda scope: [self.pool]
        )

    def spend_the_pool(self, url: str) -> ConnectionClosed:
        """One session: two steps, then the third message's reply is denied."""
        with session(url) as ws:
            ws.send("a")  # receive: step 1, send: step 2
            assert ws.recv(timeout=30) == "A"
            ws.send("b")  # receive: step 3, the reply: denied by the pool
            return closed_by_server(ws)


@pytest.fixture
def pooled() -> Pooled:
    return Pooled()


def test_a_pool_denial_mid_session_closes_1013_with_the_wait(pooled: Pooled) -> None:
    with serve(pooled.app) as url:
        closed = pooled.spend_the_pool(url)
    assert closed.rcvd is not None
    assert closed.rcvd.code == 1013
    reason = closed.rcvd.reason
    assert reason.startswith("budget_exceeded: steps (pool tenant:acme); retry_after_s=")
    assert 3540 <= int(reason.rsplit("=", 1)[1]) <= 3600
    assert pooled.pool.snapshot().steps == 3


def test_a_pool_denial_before_accept_is_a_429_with_retry_after(pooled: Pooled) -> None:
    with serve(pooled.app) as url:
        pooled.spend_the_pool(url)
        with pytest.raises(InvalidStatus) as refused, session(url):
            pass
    response = refused.value.response
    assert response.status_code == 429
    body = json.loads(response.body)
    assert body["pool"] == "tenant:acme" and body["reason"] == "steps"
    assert response.headers["Retry-After"] == str(math.ceil(body["retry_after_s"]))
    assert pooled.echo.sessions == 1  # the refused session never reached the app


def test_without_the_extension_a_pool_denial_is_accepted_then_closed_1013(
    pooled: Pooled,
) -> None:
    with serve(without_http_response(pooled.app)) as url:
        pooled.spend_the_pool(url)
        with session(url) as ws:
            closed = closed_by_server(ws)
    assert closed.rcvd is not None
    assert closed.rcvd.code == 1013
    wait = closed.rcvd.reason.rsplit("retry_after_s=", 1)[1]
    assert 3540 <= int(wait) <= 3600
    assert pooled.echo.sessions == 1


def test_the_close_reason_keeps_the_wait_within_123_bytes() -> None:
    pooled = Pooled(LONG_POOL)
    with serve(without_http_response(pooled.app)) as url:
        mid_session = pooled.spend_the_pool(url)
        with session(url) as ws:
            refused = closed_by_server(ws)
    for closed in (mid_session, refused):
        assert closed.rcvd is not None
        reason = closed.rcvd.reason
        assert closed.rcvd.code == 1013
        assert len(reason.encode("utf-8")) <= 123
        assert reason.startswith("budget_exceeded: steps (pool tenant:xxx")  # cut, not dropped
        assert 3540 <= int(reason.rsplit("; retry_after_s=", 1)[1]) <= 3600


def test_a_chain_ceiling_still_closes_1008() -> None:
    echo = Echo()
    app = VeronicaASGIMiddleware(echo.app, ExecutionConfig(max_steps=2), ledger=LocalLedger())
    with serve(app) as url, session(url) as ws:
        ws.send("a")
        assert ws.recv(timeout=30) == "A"
        ws.send("b")
        closed = closed_by_server(ws)
    assert closed.rcvd is not None
    assert (closed.rcvd.code, closed.rcvd.reason) == (1008, "budget_exceeded: steps")


def test_the_store_going_down_mid_session_closes_1013(
    restartable_redis: RedisServerProcess, redis_prefix: str
) -> None:
    echo = Echo()
    ledger = RedisLedger.from_url(restartable_redis.url, key_prefix=redis_prefix, fail_open=False)
    app = VeronicaASGIMiddleware(echo.app, CONFIG, ledger=ledger)
    with serve(app) as url, session(url) as ws:
        ws.send("a")
        assert ws.recv(timeout=30) == "A"
        restartable_redis.stop()
        ws.send("b")  # its receive step cannot reach the store
        closed = closed_by_server(ws)
    assert closed.rcvd is not None
    assert (closed.rcvd.code, closed.rcvd.reason) == (1013, "budget store unavailable")


def test_without_the_extension_the_store_down_closes_1013(
    restartable_redis: RedisServerProcess,
) -> None:
    url = restartable_redis.url
    restartable_redis.stop()
    echo = Echo()
    ledger = RedisLedger.from_url(url, fail_open=False)
    app = without_http_response(VeronicaASGIMiddleware(echo.app, CONFIG, ledger=ledger))
    with serve(app) as ws_url, session(ws_url) as ws:
        closed = closed_by_server(ws)
    assert closed.rcvd is not None
    assert (closed.rcvd.code, closed.rcvd.reason) == (1013, "budget store unavailable")
    assert echo.sessions == 0
