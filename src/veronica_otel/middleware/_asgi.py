"""``VeronicaASGIMiddleware``: one chain per HTTP request or WebSocket session.

HTTP: the request joins the caller's chain (or starts one from the local
configuration), is refused with 429 before the application runs when the
pre-flight check fails, and runs inside the chain, so instrumented calls in
handlers find it. A ``BudgetExceededError`` escaping the application becomes
a 429 JSON answer when no response has started. Frameworks that turn an
unhandled error into a 500 before re-raising it (Starlette's
``ServerErrorMiddleware``) are covered: a 500 is held back until the
application returns, and replaced by the 429 if the error was a budget trip.
If the response had already started, the error is re-raised and the server
aborts the connection: the client sees an incomplete response, never a
complete-looking one. When the budget store cannot be reached (or admitting
the request fails in any other way), the answer is 503 with a JSON body
``{"error": "budget store unavailable", "reason": ...}`` and the handler does
not run; a store failure escaping the handler before the response started
is a 503 too. A WebSocket is then refused with 503 (or closed with 1013,
"try again later", where the server cannot answer a handshake with HTTP).
A response to a granted request is held until the application returns (up
to ``spent_buffer_bytes``), then sent with the signed ``veronica-spent``
header counting everything the handler spent.

WebSocket: each data message is one step of the session's chain
(``websocket.receive`` delivered to the application, ``websocket.send``
sent); the handshake and close messages are free. When a step is denied, or
the chain trips or passes its deadline mid-session, the socket is closed at
once, and every later ``send`` or ``receive`` of the application raises
``BudgetExceededError``, so an application looping on ``send`` cannot spin.
The close code says whether trying again can help: 1008 (policy violation)
for a chain's ceiling; 1013 (try again later) for a pool denial that says
when its window frees room (the reason ends ``retry_after_s=N``, N in whole
seconds rounded up, as in ``Retry-After``) and for a budget store that
cannot be reached (our outage, not the client's fault). A session refused
before it is accepted gets the HTTP answer a request would (429 with
``Retry-After``, or 503) where the server supports the ASGI
``websocket.http.response`` extension; elsewhere it is accepted and closed
at once with that code (the application does not run): a close before the
accept would reach the client as a bare 403, without code or reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from opentelemetry import context as otel_context

from veronica_otel._call import CallHandle
from veronica_otel._config import ExecutionConfig
from veronica_otel._context import ExecutionContext
from veronica_otel._errors import BudgetExceededError, TripEvent
from veronica_otel._grants import MAX_GRANT_BYTES, NonceCache
from veronica_otel._ledger import Ledger
from veronica_otel._options import WrapOptions
from veronica_otel._policy import PolicyPipeline

from ._core import (
    MAX_BAGGAGE_BYTES,
    UNAVAILABLE,
    Gate,
    PoolsFor,
    budget_error,
    denial_body,
    refusal,
    retry_after_header,
    store_failure,
)

__all__ = ["VeronicaASGIMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_logger = logging.getLogger("veronica_otel.middleware")
_RECEIVE = WrapOptions(operation_name="websocket.receive")
_SEND = WrapOptions(operation_name="websocket.send")
_POLICY_VIOLATION = 1008
_TRY_AGAIN_LATER = 1013
_MAX_CLOSE_REASON = 123  # bytes of UTF-8 (RFC 6455: a control frame carries 125)
SPENT_BUFFER_BYTES = 64 * 1024


class VeronicaASGIMiddleware:
    """Contain every HTTP request and WebSocket session of an ASGI app in a chain.

    Usage::

        app = VeronicaASGIMiddleware(app, ExecutionConfig(max_cost_usd=0.5, max_steps=20))
        # or, in Starlette / FastAPI:
        app.add_middleware(VeronicaASGIMiddleware, config=ExecutionConfig(...))

    Args:
        app: The ASGI application.
        config: Local limits per request (``ExecutionConfig.from_env()`` when omitted).
        ledger: Where request chains are counted (in-process by default).
        grant_key: HMAC key for caller grants (``VERONICA_GRANT_KEY`` when omitted).
        pipeline: Policies run before every call (shared by all requests).
        max_baggage_bytes: Longest ``baggage`` header read (longer: ignored, counted).
        max_grant_bytes: Longest grant accepted.
        replay_cache: Accepted grant nonces (process-wide by default).
        clock: Wall clock in unix seconds.
        audience: The ``host[:port]`` names this service accepts grants for
            (else ``VERONICA_GRANT_AUDIENCE``, else the request's Host header).
        spent_buffer_bytes: How much of a granted request's response is held
            back so its ``veronica-spent`` header can count everything the
            handler spent (64 KiB). A longer body is streamed without one,
            and the caller commits its whole carve.
        pools: A callable of the ASGI scope returning the budget pools the
            request's chain also spends from (by API key, tenant header, ...).
            A pool with no room refuses the request with 429 and
            ``Retry-After``; a callable that raises refuses it with 503.
    """

    def __init__(
        self,
        app: ASGIApp,
        config: ExecutionConfig | None = None,
        *,
        ledger: Ledger | None = None,
        grant_key: bytes | str | None = None,
        pipeline: PolicyPipeline | None = None,
        max_baggage_bytes: int = MAX_BAGGAGE_BYTES,
        max_grant_bytes: int = MAX_GRANT_BYTES,
        replay_cache: NonceCache | None = None,
        clock: Callable[[], float] = time.time,
        audience: str | Sequence[str] | None = None,
        spent_buffer_bytes: int = SPENT_BUFFER_BYTES,
        pools: PoolsFor | None = None,
    ) -> None:
        if type(spent_buffer_bytes) is not int or spent_buffer_bytes < 0:
            raise ValueError(f"spent_buffer_bytes must be an int >= 0, got {spent_buffer_bytes!r}")
        self.app = app
        self.spent_buffer_bytes = spent_buffer_bytes
        self.gate = Gate(
            config,
            ledger=ledger,
            grant_key=grant_key,
            pipeline=pipeline,
            max_baggage_bytes=max_baggage_bytes,
            max_grant_bytes=max_grant_bytes,
            replay_cache=replay_cache,
            clock=clock,
            audience=audience,
            pools=pools,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            admission = await self.gate.aadmit(_headers(scope), scope)
        except Exception as exc:  # the store is down: refuse, never a 500
            status, body, _ = refusal(exc)
            await _send_json(send, status, body, None)
            return
        key = self.gate.key
        if admission.denial is not None:
            await _send_denial(send, admission.denial, await admission.aspent_header(key))
            return
        responder = _Responder(
            send,
            lambda: admission.aspent_header(key),
            self.spent_buffer_bytes if admission.grant is not None else None,
        )
        token = otel_context.attach(admission.otel_context)
        try:
            async with admission.ctx:
                await self.app(scope, receive, responder.send)
        except BaseException as exc:
            error = budget_error(exc)
            if error is None or responder.started:
                if isinstance(exc, Exception):
                    await responder.flush()
                raise
            responder.discard()
            status, body, _ = refusal(error)
            retry = retry_after_header(error.trip) if status == 429 else None
            await _send_json(send, status, body, await admission.aspent_header(key), retry)
        else:
            await responder.flush()
        finally:
            otel_context.detach(token)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:  # a session, not a request: its chain (and its graph) says so
            admission = await self.gate.aadmit(_headers(scope), scope, "websocket")
        except Exception as exc:
            status, body, reason = refusal(exc)
            code = _TRY_AGAIN_LATER if status == 503 else _POLICY_VIOLATION
            await _refuse_websocket(scope, receive, send, status, body, code, reason)
            return
        if admission.denial is not None:
            await _deny_websocket(scope, receive, send, admission.denial)
            return
        guard = _WebSocketGuard(admission.ctx, receive, send)
        token = otel_context.attach(admission.otel_context)
        try:
            async with admission.ctx:
                guard.watch()
                await self.app(scope, guard.receive, guard.send)
        except BaseException as exc:
            error = budget_error(exc)
            if error is None:
                raise
            await guard.close(error)
        finally:
            guard.done = True
            otel_context.detach(token)


def _headers(scope: Scope) -> dict[str, str]:
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers") or ():
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        headers[name] = f"{headers[name]},{value}" if name in headers else value
    return headers


def _denial_headers(body: bytes, *extra: tuple[str, str] | None) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode("ascii")),
    ]
    for header in extra:
        if header is not None:
            headers.append((header[0].encode("latin-1"), header[1].encode("latin-1")))
    return headers


async def _send_denial(send: Send, trip: TripEvent, extra: tuple[str, str] | None) -> None:
    await _send_json(send, 429, denial_body(trip), extra, retry_after_header(trip))


async def _send_json(
    send: Send,
    status: int,
    body: bytes,
    extra: tuple[str, str] | None,
    retry: tuple[str, str] | None = None,
) -> None:
    headers = _denial_headers(body, extra, retry)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _deny_websocket(scope: Scope, receive: Receive, send: Send, trip: TripEvent) -> None:
    code, reason = _trip_close(trip)
    retry = retry_after_header(trip)
    await _refuse_websocket(scope, receive, send, 429, denial_body(trip), code, reason, retry)


async def _refuse_websocket(
    scope: Scope,
    receive: Receive,
    send: Send,
    status: int,
    body: bytes,
    code: int,
    reason: str,
    retry: tuple[str, str] | None = None,
) -> None:
    """Refuse before accepting: the HTTP answer if the server can send one, else close."""
    message = await receive()
    if message.get("type") != "websocket.connect":
        return
    if "websocket.http.response" in (scope.get("extensions") or {}):
        await send(
            {
                "type": "websocket.http.response.start",
                "status": status,
                "headers": _denial_headers(body, retry),
            }
        )
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        # Closed before the accept, the server would answer a bare 403 (ASGI
        # spec): accept, so the code and the reason reach the client.
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": code, "reason": _bounded(reason)})


def _reason(trip: TripEvent) -> str:
    return f"budget_exceeded: {trip.reason}"


def _close_for(error: BudgetExceededError) -> tuple[int, str]:
    """The close code and reason for a session a budget error stops."""
    if store_failure(error):
        return _TRY_AGAIN_LATER, UNAVAILABLE
    return _trip_close(error.trip)


def _trip_close(trip: TripEvent) -> tuple[int, str]:
    """1008 for a ceiling; 1013 and the wait for a pool whose window says when."""
    retry = retry_after_header(trip)
    if retry is None:
        return _POLICY_VIOLATION, _reason(trip)
    tail = f"; retry_after_s={retry[1]}"
    pool = f" (pool {trip.pool})" if trip.pool is not None else ""
    head = _reason(trip)
    room = _MAX_CLOSE_REASON - len((head + tail).encode("utf-8"))
    # A long pool name is cut, never the wait.
    pool = pool.encode("utf-8")[: max(room, 0)].decode("utf-8", "ignore")
    return _TRY_AGAIN_LATER, head + pool + tail


def _bounded(reason: str) -> str:
    """``reason`` cut to what a close frame carries (whole UTF-8 characters)."""
    return reason.encode("utf-8")[:_MAX_CLOSE_REASON].decode("utf-8", "ignore")


class _Responder:
    """Forwards the application's messages; holds a 500 back, and a granted response.

    A response to a request that came with a grant is held until the
    application returns (up to ``buffer`` body bytes), so the signed
    ``veronica-spent`` header added to it then counts everything the
    handler spent, the body's streaming included. A longer body is sent on
    as it comes, with no spend-back: the caller then commits its whole carve.
    """

    def __init__(
        self,
        send: Send,
        spent_header: Callable[[], Awaitable[tuple[str, str] | None]],
        buffer: int | None,
    ) -> None:
        self._send = send
        self._spent_header = spent_header
        self._held: list[Message] | None = None
        self._buffer = buffer  # None: no grant, nothing to report
        self._size = 0
        self.started = False

    async def send(self, message: Message) -> None:
        if self._held is not None:
            self._held.append(message)
            if self._buffer is not None and message.get("type") == "http.response.body":
                self._size += len(message.get("body") or b"")
                if self._size > self._buffer:
                    await self._release(report=False)
            return
        if message.get("type") == "http.response.start":
            if self._buffer is not None or message.get("status") == 500:
                # A granted response waits for the final spend; a 500 may be a
                # framework's answer to a BudgetExceededError it re-raises next.
                self._held = [message]
                return
            self.started = True
        await self._send(message)

    async def _release(self, *, report: bool) -> None:
        held, self._held = self._held, None
        self._buffer = None
        if not held:
            return
        self.started = True
        extra = await self._spent_header() if report else None
        for message in held:
            if extra is not None and message.get("type") == "http.response.start":
                headers = list(message.get("headers") or ())
                headers.append((extra[0].encode("latin-1"), extra[1].encode("latin-1")))
                await self._send({**message, "headers": headers})
            else:
                await self._send(message)

    async def flush(self) -> None:
        """The application returned (or raised): send what was held, with the spend."""
        await self._release(report=True)

    def discard(self) -> None:
        self._held = None


class _WebSocketGuard:
    """Wraps a session's ``receive`` and ``send``: one step per data message."""

    def __init__(self, ctx: ExecutionContext, receive: Receive, send: Send) -> None:
        self._ctx = ctx
        self._receive = receive
        self._send = send
        self._trip: TripEvent | None = None
        self._closed = False
        self._closer: asyncio.Task[None] | None = None
        self.done = False

    def watch(self) -> None:
        """Close at once when the chain is cancelled or its deadline passes."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return

        def fire() -> None:
            if not self.done and not loop.is_closed():
                loop.call_soon_threadsafe(self._on_cancel)

        self._ctx.cancellation.add_callback(fire)

    def _on_cancel(self) -> None:
        if self.done or self._trip is not None:
            return
        trip = self._ctx.trip or TripEvent(
            "timeout", 0.0, 0.0, self._ctx.chain_id, f"chain {self._ctx.chain_id} cancelled"
        )
        self._closer = asyncio.ensure_future(self.close(BudgetExceededError(trip)))

    async def receive(self) -> Message:
        self._check()
        message = await self._receive()
        self._check()  # closed while waiting
        if message.get("type") == "websocket.receive":
            await (await self._step(_RECEIVE)).afinish()
        return message

    async def send(self, message: Message) -> None:
        self._check()
        kind = message.get("type")
        if kind != "websocket.send":
            if kind == "websocket.close":
                self._closed = True
            await self._send(message)
            return
        call = await self._step(_SEND)
        try:
            await self._send(message)
        except BaseException as exc:
            await call.afinish(exc)
            raise
        await call.afinish()

    def _check(self) -> None:
        if self._trip is not None:
            raise BudgetExceededError(self._trip)

    async def _step(self, options: WrapOptions) -> CallHandle:
        try:
            return await self._ctx.abegin_call("tool", options)
        except BudgetExceededError as exc:
            await self.close(exc)
            raise

    async def close(self, error: BudgetExceededError) -> None:
        """Close (once) with the code ``error`` calls for; every later send or receive raises."""
        if self._trip is None:
            self._trip = error.trip
        if self._closed:
            return
        self._closed = True
        code, reason = _close_for(error)
        try:
            await self._send({"type": "websocket.close", "code": code, "reason": _bounded(reason)})
        except Exception:
            _logger.debug("closing the websocket after a trip failed", exc_info=True)
