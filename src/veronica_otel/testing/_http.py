"""HTTP/1.1 plumbing of the fake LLM server, on ``http.server`` and ``socketserver``.

One thread per connection, keep-alive, ``Content-Length`` on JSON replies and
chunked transfer encoding on event streams. ``TCP_NODELAY`` is set on every
accepted socket: ``http.server`` writes headers and body separately, and
without it Nagle's algorithm plus the client's delayed ACK add about 40 ms to
every response on loopback. The server tracks its connections, so stopping it
closes idle keep-alive connections instead of waiting for clients to hang up.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import TCPServer
from typing import Any, cast

__all__ = ["HTTPServer", "Reply", "Responder"]

_logger = logging.getLogger("veronica_otel.testing")

_JOIN_TIMEOUT_S = 5.0
_MAX_BODY_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Reply:
    """A response to write: a complete ``body``, event-stream ``chunks``, or a
    WebSocket ``upgrade`` (run on the connection after the 101 response)."""

    status: int
    headers: Mapping[str, str]
    body: bytes | None = None
    chunks: tuple[bytes, ...] = ()
    upgrade: Callable[[Any, Any, socket.socket], None] | None = None


Responder = Callable[[str, str, dict[str, str], bytes], Reply]
"""``(method, target, headers, body) -> Reply``: answers one request."""


class HTTPServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` that tracks its connections so ``stop()`` can close them."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        respond: Responder,
        chunk_delay: Callable[[], float],
        closing: threading.Event,
    ) -> None:
        self.respond = respond
        self.chunk_delay = chunk_delay
        self.closing = closing
        self._connections_lock = threading.Lock()
        self._connections: dict[socket.socket, threading.Thread] = {}
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), a reverse DNS lookup
        # that can take seconds in a sandbox; the name is never used here.
        TCPServer.server_bind(self)
        self.server_name = str(self.server_address[0])
        self.server_port = int(self.server_address[1])

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = self.socket.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock, address

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name="FakeLLMServer-connection",
            daemon=True,
        )
        with self._connections_lock:
            self._connections[request] = thread
        thread.start()

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.pop(request, None)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        _logger.debug("fake LLM server connection error", exc_info=True)

    def close_connections(self) -> None:
        """Shut down every open connection and wait for its handler thread."""
        with self._connections_lock:
            connections = list(self._connections.items())
        for sock, _ in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for _, thread in connections:
            thread.join(_JOIN_TIMEOUT_S)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeLLM/1.0"

    def version_string(self) -> str:
        """The ``Server`` header, without the Python version."""
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the per-request access log."""

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def _serve(self) -> None:
        server = cast(HTTPServer, self.server)
        raw = self._read_body()
        if raw is None:
            return
        headers: dict[str, str] = {}
        for name, value in self.headers.items():
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        reply = server.respond(self.command, self.path, headers, raw)
        try:
            self._write(reply, server)
        except OSError:  # the client went away mid-response
            self.close_connection = True

    def _read_body(self) -> bytes | None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= _MAX_BODY_BYTES:
            self.send_error(400, "Bad Content-Length")
            return None
        return self.rfile.read(length) if length else b""

    def _read_chunked(self) -> bytes | None:
        parts: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1024).split(b";", 1)[0].strip()
            try:
                size = int(line, 16)
            except ValueError:
                self.send_error(400, "Bad chunk size")
                return None
            total += size
            if total > _MAX_BODY_BYTES:
                self.send_error(413, "Body too large")
                return None
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline(1024)

    def _write(self, reply: Reply, server: HTTPServer) -> None:
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if reply.upgrade is not None:
            self.end_headers()
            self.wfile.flush()
            self.close_connection = True  # the socket is the session's until it ends
            reply.upgrade(self.rfile, self.wfile, self.connection)
            return
        if reply.body is not None:
            self.send_header("content-length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
            return
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        framed = [b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in reply.chunks]
        framed.append(b"0\r\n\r\n")
        delay = server.chunk_delay()
        if delay <= 0:
            # One write: the client still parses event by event, with one syscall.
            self.wfile.write(b"".join(framed))
            return
        for index, frame in enumerate(framed):
            if 0 < index < len(framed) - 1 and server.closing.wait(delay):
                self.close_connection = True  # server stopping: cut the stream
                return
            self.wfile.write(frame)
