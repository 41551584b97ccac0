"""RFC 6455 server framing for the fake LLM server's WebSocket APIs (standard library only).

Just what the ``openai`` SDK's realtime and Responses sessions use through the
``websockets`` client: the opening handshake, masked text or binary messages
from the client (fragmented or not), pings, and a close. No extensions are
negotiated (the SDK turns compression off), so no frame is compressed.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from typing import BinaryIO

__all__ = ["accept_key", "read_message", "write_close", "write_text"]

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_TEXT, _BINARY, _CONTINUATION, _CLOSE, _PING, _PONG = 0x1, 0x2, 0x0, 0x8, 0x9, 0xA


def accept_key(key: str) -> str:
    """``Sec-WebSocket-Accept`` for the client's ``Sec-WebSocket-Key``."""
    digest = hashlib.sha1(key.strip().encode("ascii") + _GUID).digest()
    return base64.b64encode(digest).decode("ascii")


def _read_exact(rfile: BinaryIO, n: int) -> bytes | None:
    data = rfile.read(n) if n else b""
    return data if data is not None and len(data) == n else None


def _read_frame(rfile: BinaryIO) -> tuple[bool, int, bytes] | None:
    head = _read_exact(rfile, 2)
    if head is None:
        return None
    fin, opcode = bool(head[0] & 0x80), head[0] & 0x0F
    masked, length = bool(head[1] & 0x80), head[1] & 0x7F
    if length == 126:
        raw = _read_exact(rfile, 2)
        length = struct.unpack("!H", raw)[0] if raw else -1
    elif length == 127:
        raw = _read_exact(rfile, 8)
        length = struct.unpack("!Q", raw)[0] if raw else -1
    if not 0 <= length <= _MAX_MESSAGE_BYTES:
        return None
    mask = _read_exact(rfile, 4) if masked else b"\0\0\0\0"
    payload = _read_exact(rfile, length)
    if mask is None or payload is None:
        return None
    if masked:
        key = (mask * (length // 4 + 1))[:length]  # XOR as one big integer: fast in C
        payload = (int.from_bytes(payload) ^ int.from_bytes(key)).to_bytes(length)
    return fin, opcode, payload


def read_message(rfile: BinaryIO, wfile: BinaryIO) -> str | None:
    """The next text or binary message (decoded as UTF-8); None once the client
    closed or the connection broke. Pings are answered on the way."""
    parts: list[bytes] = []
    while True:
        frame = _read_frame(rfile)
        if frame is None:
            return None
        fin, opcode, payload = frame
        if opcode == _CLOSE:
            write_close(wfile)
            return None
        if opcode == _PING:
            _write_frame(wfile, _PONG, payload)
            continue
        if opcode == _PONG:
            continue
        parts.append(payload)
        if fin and opcode in (_TEXT, _BINARY, _CONTINUATION):
            return b"".join(parts).decode("utf-8", errors="replace")


def _write_frame(wfile: BinaryIO, opcode: int, payload: bytes) -> None:
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 127, n)
    wfile.write(head + payload)
    wfile.flush()


def write_text(wfile: BinaryIO, text: str) -> None:
    """Send one text message (server frames are not masked)."""
    _write_frame(wfile, _TEXT, text.encode("utf-8"))


def write_close(wfile: BinaryIO, code: int = 1000) -> None:
    """Send a close frame with ``code``."""
    _write_frame(wfile, _CLOSE, struct.pack("!H", code))
