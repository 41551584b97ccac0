"""The in-process fake LLM server: lifecycle, request log, failures and latency.

:class:`FakeLLMServer` routes requests to the OpenAI, Anthropic and Gemini builders
(``_openai_api.py``, ``_anthropic_api.py``, ``_gemini_api.py``) and serves them through the
HTTP/1.1 plumbing in ``_http.py`` on a daemon thread.
"""

from __future__ import annotations

import contextlib
import email
import email.policy
import json
import logging
import math
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from . import (
    _anthropic_api,
    _bedrock_api,
    _cohere_api,
    _gemini_api,
    _mistral_api,
    _ollama_api,
    _openai_api,
)
from ._common import (
    ApiCall,
    ApiError,
    JSONReply,
    ScriptedReply,
    StreamReply,
    TokenSettings,
    Usage,
    dumps,
)
from ._http import HTTPServer, Reply
from ._live_api import SESSIONS as _LIVE_SESSIONS
from ._realtime_api import SESSIONS as _OPENAI_SESSIONS
from ._runaway import runaway_reply, wants_runaway
from ._websocket import accept_key, read_message, write_text

__all__ = ["BilledUsage", "FakeLLMServer", "RecordedRequest"]

_logger = logging.getLogger("veronica_otel.testing")

_JOIN_TIMEOUT_S = 5.0
# WebSocket messages that make the model generate (what drop_next_responses drops).
_GENERATING = frozenset(("response.create", "client_content", "clientContent"))
_SCRIPTED_PATH = "/v1/chat/completions"

Responder = Callable[["RecordedRequest"], "ScriptedReply | str | None"]
"""Chooses a chat completion's reply from its request; ``None``: the generated one."""


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received.

    Attributes:
        method: HTTP method, e.g. ``"POST"``.
        path: Path without the query string, e.g. ``"/v1/chat/completions"``.
        query: The raw query string (``""`` if none).
        headers: Request headers, names lower-cased (repeated ones joined by ``", "``).
        body: The parsed JSON body, or ``None`` if there was none or it was not JSON.
        received_at: ``time.monotonic()`` when the request arrived.
    """

    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    body: Any
    received_at: float


@dataclass(frozen=True)
class BilledUsage:
    """The usage one model reply reported (input includes cached; output, reasoning)."""

    model: str
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    reasoning_tokens: int


@dataclass(frozen=True)
class _Failure:
    status: int
    body: object
    headers: Mapping[str, str]


class FakeLLMServer:
    """A local fake of the OpenAI and Anthropic HTTP APIs for tests and demos.

    It answers with well-formed bodies that the real ``openai`` and
    ``anthropic`` SDKs parse (streams included), with deterministic token
    usage, counts every request exactly, and can be told to fail or to slow
    down.

    Usage::

        with FakeLLMServer(output_tokens=5) as server:
            client = openai.OpenAI(base_url=server.openai_base_url, api_key="test")
            client.chat.completions.create(model="gpt-4o-mini", messages=[...])
            assert server.count("/v1/chat/completions") == 1

    Token usage: input tokens are ``input_tokens`` if given, else
    ``ceil(len(request body) / 4)``; output tokens are ``output_tokens`` but
    never more than the request's ``max_tokens`` / ``max_completion_tokens`` /
    ``max_output_tokens`` (when the cap cuts the reply it says so:
    ``finish_reason="length"``, ``stop_reason="max_tokens"``, or Responses
    ``status="incomplete"`` with a ``response.incomplete`` stream event).
    ``reasoning_tokens`` are part of the output tokens and ``cached_tokens``
    part of the input tokens; each API reports them in its own usage details
    (Anthropic's ``input_tokens`` excludes ``cache_read_input_tokens``, as
    the real API does). The text is one word per visible output token
    (``"tok0 tok1 ..."``), streamed one word per chunk.

    Making SDK retries fast: both SDKs wait ``retry-after-ms`` milliseconds
    (else ``retry-after`` seconds) before retrying, but only when the value is
    greater than zero; ``0`` falls back to their exponential backoff (0.5 s,
    1 s, ...). ``openai`` refuses to retry at all when the delay is over
    120 s; ``anthropic`` waits whatever it is told. ``x-should-retry: true`` /
    ``false`` overrides either SDK's status-code rule (both retry 408, 409,
    429 and 5xx by default). Pass ``retry_after_ms=1`` to :meth:`fail_next`
    for near-instant retries. Each attempt carries an
    ``x-stainless-retry-count`` header, visible in :attr:`requests`.

    Scripting an agent: :meth:`script` queues replies for the next chat
    completions (a :class:`ScriptedReply` can ask for tool calls), and
    :meth:`set_responder` picks a reply from each request, so a real agent
    loop (call a tool, read its result, answer) runs against the server::

        server.script(ScriptedReply.tool_call("add", {"a": 1, "b": 2}), "It is 3.")

    Playing a runaway model: with ``runaway=True`` (or :meth:`set_runaway`,
    or a request header ``x-fake-runaway: 1``; ``0`` turns it off for one
    request) every model reply, in every wire format and streamed or not,
    asks for another call of a tool the request declares (OpenAI chat
    ``tool_calls``, Responses ``function_call``, Anthropic ``tool_use``,
    Gemini ``functionCall``, Bedrock Converse ``toolUse``), so an agent
    framework's loop never ends on its own. Scripted replies come first.

    Args:
        host: Interface to bind.
        port: TCP port; ``0`` picks a free one.
        input_tokens: Fixed input token count; ``None`` derives it from the body size.
        output_tokens: Output tokens per reply, before the request's cap.
        reasoning_tokens: Reasoning (thinking) tokens reported within the output.
        cached_tokens: Cached prompt tokens reported within the input.
        latency_s: Delay before every response.
        chunk_delay_s: Delay between the chunks of a stream.
        max_recorded: How many recent requests :attr:`requests` keeps
            (``None``: all). Counts are exact regardless.
        runaway: Play a runaway model (see above).

    Raises:
        ValueError: An argument is negative, not finite, or of the wrong type.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        input_tokens: int | None = None,
        output_tokens: int = 20,
        reasoning_tokens: int = 0,
        cached_tokens: int = 0,
        latency_s: float = 0.0,
        chunk_delay_s: float = 0.0,
        max_recorded: int | None = 10_000,
        runaway: bool = False,
    ) -> None:
        _check_count("port", port)
        if input_tokens is not None:
            _check_count("input_tokens", input_tokens)
        _check_count("output_tokens", output_tokens)
        _check_count("reasoning_tokens", reasoning_tokens)
        _check_count("cached_tokens", cached_tokens)
        if max_recorded is not None:
            _check_count("max_recorded", max_recorded)
        self._host = host
        self._requested_port = port
        self._settings = TokenSettings(input_tokens, output_tokens, reasoning_tokens, cached_tokens)
        self._initial_latency_s = _check_seconds("latency_s", latency_s)
        self._latency_s = self._initial_latency_s
        self._chunk_delay_s = _check_seconds("chunk_delay_s", chunk_delay_s)
        self._lock = threading.Lock()
        self._recorded: deque[RecordedRequest] = deque(maxlen=max_recorded)
        self._billed: deque[BilledUsage] = deque(maxlen=max_recorded)
        self._counts: Counter[str] = Counter()
        self._events: Counter[tuple[str, str]] = Counter()
        self._drops = 0
        self._total = 0
        self._serial = 0
        self._pending_failures: deque[_Failure] = deque()
        self._permanent_failure: _Failure | None = None
        self._script: deque[ScriptedReply] = deque()
        self._responder: Responder | None = None
        self._runaway = _check_flag("runaway", runaway)
        self._httpd: HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._closing = threading.Event()

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> FakeLLMServer:
        """Bind the socket and start serving on a daemon thread.

        Returns:
            The server itself, so ``server = FakeLLMServer().start()`` works.

        Raises:
            RuntimeError: The server was already started.
        """
        if self._httpd is not None or self._stopped:
            raise RuntimeError("FakeLLMServer can be started only once")
        httpd = HTTPServer(
            (self._host, self._requested_port), self._handle, self._chunk_delay, self._closing
        )
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"FakeLLMServer:{httpd.server_port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close every open connection and wait for handler threads.

        Idempotent; a stopped server cannot be started again.
        """
        self._stopped = True
        self._closing.set()  # wakes handlers sleeping in latency or chunk delays
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(_JOIN_TIMEOUT_S)
        httpd.close_connections()

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- addresses ---------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound TCP port (after :meth:`start`)."""
        return self._running().server_port

    @property
    def base_url(self) -> str:
        """Root URL, e.g. ``"http://127.0.0.1:40123"``."""
        host = self._host if ":" not in self._host else f"[{self._host}]"
        return f"http://{host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        """``base_url`` for ``openai.OpenAI``: the root plus ``/v1``."""
        return f"{self.base_url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """``base_url`` for ``anthropic.Anthropic``: the root (the SDK adds ``/v1/...``)."""
        return self.base_url

    def _running(self) -> HTTPServer:
        if self._httpd is None:
            raise RuntimeError("FakeLLMServer is not running; call start() or use `with`")
        return self._httpd

    # -- request log -------------------------------------------------------

    @property
    def request_count(self) -> int:
        """Number of requests received since start or the last :meth:`reset`."""
        with self._lock:
            return self._total

    @property
    def requests(self) -> list[RecordedRequest]:
        """A copy of the recorded requests, oldest first (at most ``max_recorded``)."""
        with self._lock:
            return list(self._recorded)

    def count(self, path: str) -> int:
        """Number of requests received for ``path`` (exact, without query string).

        Args:
            path: e.g. ``"/v1/chat/completions"`` or ``"/v1/messages"``.
        """
        with self._lock:
            return self._counts[path]

    def stats(self) -> dict[str, Any]:
        """Requests received so far (``GET /stats``): ``{"total": n, "routes":
        {path: n}}``, and once a WebSocket session received any message, ``"events":
        {path: {type: n}}`` (a session's opening is a ``GET`` route).

        ``/stats`` itself is not counted, so a client can ask what was sent
        before and after without changing the answer.
        """
        with self._lock:
            events: dict[str, dict[str, int]] = {}
            for (path, kind), n in sorted(self._events.items()):
                events.setdefault(path, {})[kind] = n
            stats: dict[str, Any] = {
                "total": self._total,
                "routes": dict(sorted(self._counts.items())),
            }
            if events:
                stats["events"] = events
            return stats

    def event_count(self, path: str, kind: str) -> int:
        """Messages of type ``kind`` received on WebSocket sessions at ``path``
        (e.g. ``("/v1/realtime", "response.create")``). Each is in :attr:`requests`
        too, with method ``"WS"`` and the event as its body."""
        with self._lock:
            return self._events[(path, kind)]

    def drop_next_responses(self, n: int = 1) -> None:
        """Make the next ``n`` ``response.create`` (Live: ``client_content``)
        received on a WebSocket session go unanswered: the connection is cut
        without a close frame."""
        with self._lock:
            self._drops += _check_count("n", n)

    def reset(self) -> None:
        """Forget requests and counts, clear failures and scripts, restore the latency."""
        with self._lock:
            self._script.clear()
            self._responder = None
            self._recorded.clear()
            self._billed.clear()
            self._counts.clear()
            self._events.clear()
            self._drops = 0
            self._total = 0
            self._pending_failures.clear()
            self._permanent_failure = None
            self._latency_s = self._initial_latency_s

    # -- behaviour ---------------------------------------------------------

    def fail_next(
        self,
        n: int = 1,
        status: int = 500,
        body: object = None,
        headers: Mapping[str, str] | None = None,
        *,
        retry_after_ms: float | None = None,
    ) -> None:
        """Make the next ``n`` requests (any route) fail with ``status``.

        Failures queue up behind any already pending.

        Args:
            n: How many requests fail.
            status: HTTP status of the failures (400-599).
            body: Response body; ``None`` gives the API's own error shape
                (OpenAI ``{"error": {...}}``, Anthropic ``{"type": "error", ...}``).
                A ``str`` or ``bytes`` body is sent as is; anything else as JSON.
            headers: Extra response headers, e.g. ``{"x-should-retry": "false"}``.
            retry_after_ms: Shorthand for a ``retry-after-ms`` header; must be
                greater than 0 for the SDKs to honour it.

        Raises:
            ValueError: ``n`` is negative or ``status`` is not an error status.
        """
        _check_count("n", n)
        failure = _make_failure(status, body, headers, retry_after_ms)
        with self._lock:
            self._pending_failures.extend([failure] * n)

    def fail_always(
        self,
        status: int = 500,
        body: object = None,
        headers: Mapping[str, str] | None = None,
        *,
        retry_after_ms: float | None = None,
    ) -> None:
        """Make every request fail with ``status`` until :meth:`clear_failures`.

        Pending :meth:`fail_next` failures are used up first. Arguments as in
        :meth:`fail_next`.
        """
        failure = _make_failure(status, body, headers, retry_after_ms)
        with self._lock:
            self._permanent_failure = failure

    def clear_failures(self) -> None:
        """Drop pending and permanent failures."""
        with self._lock:
            self._pending_failures.clear()
            self._permanent_failure = None

    def script(self, *replies: ScriptedReply | str) -> None:
        """Queue replies for the next chat completions requests, one each, in order.

        Queued replies come before the responder's; a request that fails by
        :meth:`fail_next` or :meth:`fail_always` does not use one up. Once the
        queue is empty, replies are generated as usual.

        Args:
            replies: A :class:`ScriptedReply` (text and/or tool calls), or a
                ``str``, short for ``ScriptedReply(text=...)``.

        Raises:
            ValueError: A reply is neither.
        """
        queued = [_scripted(reply) for reply in replies]
        with self._lock:
            self._script.extend(queued)

    def set_responder(self, responder: Responder | None) -> None:
        """Choose each chat completion's reply with ``responder(request)``.

        It runs on the handler thread once the queue of :meth:`script` is
        empty; it returns a :class:`ScriptedReply`, a ``str`` (the text), or
        ``None`` for the generated reply. If it raises, the request gets a 500.
        ``None`` removes it.
        """
        if responder is not None and not callable(responder):
            raise ValueError(f"responder must be callable or None, got {responder!r}")
        with self._lock:
            self._responder = responder

    def set_runaway(self, on: bool) -> None:
        """Play (or stop playing) a runaway model: every reply calls a declared tool."""
        value = _check_flag("on", on)
        with self._lock:
            self._runaway = value

    def _next_script(self, request: RecordedRequest) -> ScriptedReply | None:
        with self._lock:
            if self._script:
                return self._script.popleft()
            responder = self._responder
        if responder is None:
            return None
        reply = responder(request)
        return None if reply is None else _scripted(reply)

    def set_latency(self, seconds: float) -> None:
        """Delay every later response by ``seconds`` (failures included)."""
        value = _check_seconds("seconds", seconds)
        with self._lock:
            self._latency_s = value

    def set_chunk_delay(self, seconds: float) -> None:
        """Delay every later stream by ``seconds`` between chunks."""
        value = _check_seconds("seconds", seconds)
        with self._lock:
            self._chunk_delay_s = value

    @property
    def billed(self) -> list[BilledUsage]:
        """Usage of every model reply sent (what a real provider would bill), oldest first."""
        with self._lock:
            return list(self._billed)

    def _bill(self, model: str, usage: Usage) -> None:
        billed = BilledUsage(
            model,
            usage.input_tokens,
            usage.output_tokens,
            usage.cached_tokens,
            usage.reasoning_tokens,
        )
        with self._lock:
            self._billed.append(billed)

    # -- request handling (called on handler threads) ----------------------

    def _handle(self, method: str, target: str, headers: dict[str, str], raw: bytes) -> Reply:
        parts = urlsplit(target)
        path = parts.path
        if path == "/stats" and method in ("GET", "DELETE"):  # not API requests: not counted
            if method == "DELETE":
                self.reset()  # counts back to zero between runs of a stand-alone server
            return Reply(200, {"content-type": "application/json"}, body=dumps(self.stats()))
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                body = _form_fields(headers, raw)
        now = time.monotonic()
        with self._lock:
            self._serial += 1
            serial = self._serial
            self._total += 1
            self._counts[path] += 1
            record = RecordedRequest(method, path, parts.query, headers, body, now)
            self._recorded.append(record)
            if self._pending_failures:
                failure: _Failure | None = self._pending_failures.popleft()
            else:
                failure = self._permanent_failure
            latency = self._latency_s
        if latency > 0:
            self._closing.wait(latency)
        request_id = f"req_fake{serial}"
        ids = {"x-request-id": request_id, "request-id": request_id}
        if failure is not None:
            return _failure_reply(failure, path, request_id, ids, headers)
        if method == "GET" and headers.get("upgrade", "").lower() == "websocket":
            return self._upgrade(path, parts.query, headers, serial)
        try:
            reply = self._route(record, len(raw), serial)
        except ApiError as exc:
            return _error_reply(exc.status, exc.message, path, request_id, ids, headers)
        except Exception:
            _logger.exception("fake LLM server failed on %s %s", method, path)
            return _error_reply(500, "fake server error", path, request_id, ids, headers)
        if isinstance(reply, StreamReply):
            stream_headers = {
                "content-type": reply.content_type,
                "cache-control": "no-cache",
                **ids,
            }
            return Reply(reply.status, stream_headers, chunks=tuple(reply.chunks))
        json_headers = {"content-type": "application/json", **ids, **reply.headers}
        return Reply(reply.status, json_headers, body=dumps(reply.payload))

    def _route(self, record: RecordedRequest, size: int, serial: int) -> JSONReply | StreamReply:
        method, path, body = record.method, record.path, record.body
        if method == "GET" and path in ("/", "/health", "/healthz"):
            return JSONReply({"status": "ok"})
        if method == "GET" and path == "/v1/models":
            model = {"id": "fake-model", "object": "model", "created": 0, "owned_by": "fake"}
            return JSONReply({"object": "list", "data": [model]})
        builder = _builder(path, record.headers)
        if builder is None:
            raise ApiError(404, f"Unknown route {method} {path}")
        if method != "POST":
            raise ApiError(405, f"Method {method} not allowed on {path}")
        if not isinstance(body, dict):
            raise ApiError(400, "The request body must be a JSON object")
        script = self._next_script(record) if path == _SCRIPTED_PATH else None
        if script is None and wants_runaway(self._runaway, record.headers):
            script = runaway_reply(body)
        call = ApiCall(
            path, body, size, self._settings, serial, int(time.time()), self._bill, script
        )
        return builder(call)

    def _upgrade(self, path: str, query: str, headers: Mapping[str, str], serial: int) -> Reply:
        kind = _OPENAI_SESSIONS.get(path) or _LIVE_SESSIONS.get(path)
        key = headers.get("sec-websocket-key")
        if kind is None or not key:
            return Reply(404, {"content-type": "application/json"}, body=b"{}")
        session = kind(query, self._settings, serial, self._bill)

        def run(rfile: Any, wfile: Any, sock: socket.socket) -> None:
            for opening in session.opened():
                write_text(wfile, json.dumps(opening))
            while (message := read_message(rfile, wfile)) is not None:
                try:
                    parsed = json.loads(message)
                except ValueError:
                    parsed = None
                event: dict[str, Any] = parsed if isinstance(parsed, dict) else {}
                # OpenAI events name their type; Live messages are keyed by it.
                kind = str(event.get("type") or next(iter(event), ""))
                record = RecordedRequest("WS", path, query, headers, event, time.monotonic())
                with self._lock:
                    self._events[(path, kind)] += 1
                    self._recorded.append(record)
                    drop = kind in _GENERATING and self._drops > 0
                    self._drops -= drop
                if drop:  # unanswered: the connection lost mid-response
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    return
                for answer in session.answer(event, len(message.encode("utf-8"))):
                    write_text(wfile, json.dumps(answer))

        upgrade = {
            "upgrade": "websocket",
            "connection": "Upgrade",
            "sec-websocket-accept": accept_key(key),
        }
        return Reply(101, upgrade, upgrade=run)

    def _chunk_delay(self) -> float:
        with self._lock:
            return self._chunk_delay_s


# Each wire format's module: ``ROUTES`` (exact paths) and, where a path
# carries the model (Gemini, Bedrock), ``PATTERNS`` (regex, builder) pairs.
# A module whose paths another API shares (Mistral's /v1/chat/completions)
# has ``CLAIMS``: (header, value prefix) pairs, set by its SDK, under which its
# routes come first; and optionally its own ``error_payload(status, message)``
# and ``error_headers(status)``.
_APIS: tuple[Any, ...] = (
    _openai_api,
    _anthropic_api,
    _mistral_api,
    _cohere_api,
    _bedrock_api,
    _ollama_api,
    _gemini_api,
)


def _claimants(headers: Mapping[str, str] | None) -> tuple[Any, ...]:
    """The APIs whose ``CLAIMS`` match ``headers`` (the request came from their SDK)."""
    if not headers:
        return ()
    return tuple(
        api
        for api in _APIS
        if any(
            headers.get(name, "").startswith(prefix) for name, prefix in getattr(api, "CLAIMS", ())
        )
    )


def _claimed(headers: Mapping[str, str] | None) -> tuple[Any, ...]:
    """The APIs in the order a request with ``headers`` tries them (claimants first)."""
    first = _claimants(headers)
    return first + tuple(api for api in _APIS if api not in first) if first else _APIS


def _form_fields(headers: Mapping[str, str], raw: bytes) -> dict[str, Any] | None:
    """A ``multipart/form-data`` body (image edits, transcriptions, videos) as a
    dict: text fields as str, files as their size in bytes; None if not one."""
    ctype = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    if not ctype.lower().startswith("multipart/form-data"):
        return None
    head = f"Content-Type: {ctype}\r\n\r\n".encode("latin-1")
    message = email.message_from_bytes(head + raw, policy=email.policy.HTTP)
    fields: dict[str, Any] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if not isinstance(name, str) or not isinstance(payload, bytes):
            continue
        fields[name] = len(payload) if part.get_filename() else payload.decode("utf-8", "replace")
    return fields


def _builder(
    path: str, headers: Mapping[str, str] | None = None
) -> Callable[[ApiCall], JSONReply | StreamReply] | None:
    api = _api_for(path, headers)
    if api is None:
        return None
    builder = api.ROUTES.get(path)
    if builder is None:
        builder = next(b for p, b in api.PATTERNS if p.fullmatch(path))
    return builder  # type: ignore[no-any-return]


def _is_anthropic(path: str) -> bool:
    return path.startswith("/v1/messages")


def _api_for(path: str, headers: Mapping[str, str] | None = None) -> Any:
    """The wire-format module serving ``path`` (None: no route): exact routes
    before patterns, an API the request's headers claim before the others."""
    apis = _claimed(headers)
    for api in apis:
        if path in api.ROUTES:
            return api
    for api in apis:
        if any(p.fullmatch(path) for p, _ in getattr(api, "PATTERNS", ())):
            return api
    return None


def _error_reply(
    status: int,
    message: str,
    path: str,
    request_id: str,
    ids: Mapping[str, str],
    headers: Mapping[str, str] | None = None,
) -> Reply:
    api = _api_for(path, headers)
    extra: Mapping[str, str] = {}
    if _is_anthropic(path):
        payload = _anthropic_api.error_payload(status, message, request_id)
    elif api is not None and api is not _openai_api and hasattr(api, "error_payload"):
        payload = api.error_payload(status, message)  # the route's own error shape
        if hasattr(api, "error_headers"):
            extra = api.error_headers(status)
    else:
        payload = _openai_api.error_payload(status, message)
    reply_headers = {"content-type": "application/json", **ids, **extra}
    return Reply(status, reply_headers, body=dumps(payload))


def _failure_reply(
    failure: _Failure,
    path: str,
    request_id: str,
    ids: Mapping[str, str],
    headers: Mapping[str, str] | None = None,
) -> Reply:
    if failure.body is None:
        reply = _error_reply(failure.status, "Injected failure", path, request_id, ids, headers)
        return Reply(reply.status, {**reply.headers, **failure.headers}, body=reply.body)
    if isinstance(failure.body, bytes):
        raw = failure.body
    elif isinstance(failure.body, str):
        raw = failure.body.encode("utf-8")
    else:
        raw = dumps(failure.body)
    headers = {"content-type": "application/json", **ids, **failure.headers}
    return Reply(failure.status, headers, body=raw)


def _make_failure(
    status: int, body: object, headers: Mapping[str, str] | None, retry_after_ms: float | None
) -> _Failure:
    if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
        raise ValueError(f"status must be an HTTP error status (400-599), got {status!r}")
    extra = {k.lower(): str(v) for k, v in (headers or {}).items()}
    if retry_after_ms is not None:
        extra["retry-after-ms"] = f"{_check_seconds('retry_after_ms', retry_after_ms):g}"
    if body is not None and not isinstance(body, (str, bytes)):
        dumps(body)  # fail now, not on the handler thread
    return _Failure(status, body, extra)


def _scripted(reply: object) -> ScriptedReply:
    if isinstance(reply, ScriptedReply):
        return reply
    if isinstance(reply, str):
        return ScriptedReply(text=reply)
    raise ValueError(f"a scripted reply must be a ScriptedReply or a str, got {reply!r}")


def _check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value


def _check_flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")
    return value


def _check_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    return float(value)
