"""A real HTTP/1.1 server that answers what a test scripts, byte for byte.

FakeLLMServer answers well-formed bodies; the failure-path tests also need
replies no honest provider sends (usage ``null``, a string, ``1e26``), a
connection dropped after the request arrived, and a stream cut mid-body.
:class:`RawServer` serves one scripted :class:`Reply` per request, in order,
and counts the requests it received (the test's truth for what was sent).
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

__all__ = [
    "RawServer",
    "Reply",
    "anthropic_message",
    "anthropic_sse",
    "chat_completion",
    "chat_sse",
]


@dataclass(frozen=True)
class Reply:
    """One scripted answer.

    ``body`` is sent whole with a Content-Length; ``chunks`` are sent with
    chunked encoding (``cut=True``: the connection is closed before the final
    empty chunk, so the client sees the body end mid-way). ``drop=True``
    closes the connection without answering. ``on_request`` runs once the
    request has been read, before anything is answered.
    """

    status: int = 200
    body: bytes = b""
    chunks: Sequence[bytes] = ()
    content_type: str = "application/json"
    cut: bool = False
    drop: bool = False
    on_request: Callable[[], None] | None = field(default=None, compare=False)


class RawServer:
    """Serves scripted replies on a loopback port; counts requests exactly."""

    def __init__(self) -> None:
        self._replies: deque[Reply] = deque()
        self._lock = threading.Lock()
        self.count = 0
        server = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                try:
                    server._serve(self.connection, self.rfile)
                except OSError:  # the client went away (a cancelled or timed-out call)
                    return

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._replies.extend(replies)

    def __enter__(self) -> RawServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def _serve(self, connection: socket.socket, rfile: Any) -> None:
        while True:  # keep-alive: one scripted reply per request
            length = _read_head(rfile)
            if length is None:
                return
            rfile.read(length)
            with self._lock:
                self.count += 1
                reply = self._replies.popleft() if self._replies else Reply(status=500)
            if reply.on_request is not None:
                reply.on_request()
            if reply.drop:
                connection.shutdown(socket.SHUT_RDWR)
                return
            if not _answer(connection, reply):
                return


def _read_head(rfile: Any) -> int | None:
    """Read one request's head; its Content-Length, or None when the client left."""
    length = 0
    first = rfile.readline()
    if not first:
        return None
    while True:
        line = rfile.readline()
        if not line or line in (b"\r\n", b"\n"):
            return length
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())


def _answer(connection: socket.socket, reply: Reply) -> bool:
    head = [f"HTTP/1.1 {reply.status} X", f"Content-Type: {reply.content_type}"]
    if reply.chunks:
        head.append("Transfer-Encoding: chunked")
        connection.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        for chunk in reply.chunks:
            connection.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        if reply.cut:
            connection.shutdown(socket.SHUT_RDWR)
            return False
        connection.sendall(b"0\r\n\r\n")
        return True
    head.append(f"Content-Length: {len(reply.body)}")
    connection.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + reply.body)
    return True


def _json(payload: object) -> bytes:
    return json.dumps(payload).encode()


def chat_completion(model: str, usage: object) -> Reply:
    """A chat completion whose ``usage`` is whatever the test says."""
    return Reply(
        body=_json(
            {
                "id": "chatcmpl-raw",
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "hi"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            }
        )
    )


def chat_sse(model: str, usage: object = None, *, words: int = 3) -> Iterator[bytes]:
    """A chat completion stream; a usage chunk last when ``usage`` is not None."""
    base = {"id": "chatcmpl-raw", "object": "chat.completion.chunk", "created": 0, "model": model}
    for i in range(words):
        delta = {"role": "assistant", "content": f" tok{i}"} if i == 0 else {"content": f" tok{i}"}
        chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        yield b"data: " + _json(chunk) + b"\n\n"
    if usage is not None:
        yield b"data: " + _json({**base, "choices": [], "usage": usage}) + b"\n\n"
    yield b"data: [DONE]\n\n"


def anthropic_message(model: str, usage: object) -> Reply:
    """A whole Messages API reply whose ``usage`` is whatever the test says."""
    return Reply(
        body=_json(
            {
                "id": "msg_raw",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [{"type": "text", "text": "hi"}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": usage,
            }
        )
    )


def anthropic_sse(model: str, final_usage: object, *, words: int = 3) -> Iterator[bytes]:
    """A Messages stream: message_start (input 10, output 1), deltas, message_delta."""

    def event(kind: str, payload: dict[str, Any]) -> bytes:
        return f"event: {kind}\ndata: ".encode() + _json({"type": kind, **payload}) + b"\n\n"

    start = {
        "id": "msg_raw",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    }
    yield event("message_start", {"message": start})
    yield event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
    for i in range(words):
        delta = {"type": "text_delta", "text": f" tok{i}"}
        yield event("content_block_delta", {"index": 0, "delta": delta})
    yield event("content_block_stop", {"index": 0})
    delta_payload: dict[str, Any] = {"delta": {"stop_reason": "end_turn", "stop_sequence": None}}
    if final_usage is not None:
        delta_payload["usage"] = final_usage
    yield event("message_delta", delta_payload)
    yield event("message_stop", {})
