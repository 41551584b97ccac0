"""Containment for the ``google-genai`` SDK (Gemini API and Vertex AI).

Usage::

    from veronica_otel.instrumentors.google_genai import GoogleGenAIInstrumentor

    GoogleGenAIInstrumentor().instrument()
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)):
        client.models.generate_content(...)   # raises BudgetExceededError when over

Configuration: limits come from the active :class:`ExecutionContext`, else the
process default chain (zero-code: ``VERONICA_*`` variables). With neither,
calls pass through untouched. Spans are ``gen_ai.provider.name``
``gcp.gemini`` (Gemini API) or ``gcp.vertex_ai`` (``vertexai=True`` clients).

Where it hooks:

- ``BaseApiClient.request`` / ``request_streamed`` / ``async_request`` /
  ``async_request_streamed`` (``google/genai/_api_client.py``): every REST
  call of every module (``models``, ``batches``, ``tunings``, ``caches``,
  ``files``, ...) passes here once per HTTP request, with the path naming
  model and method and the REST body, outside the SDK's own retry loop. So
  ``generate_content``'s automatic function calling and continuation hops,
  each a request the provider bills, are each admitted; ``count_tokens`` and
  the other free calls pass. Hooking ``Models`` instead would see one call
  for up to ten billed requests and miss every endpoint not listed.
  ``_genai_request`` says how a request reads: priced (generate, embed),
  free, or not priceable before it is sent (images, videos, batches,
  tuning, caches, file search indexing, grounding billed per request, any
  endpoint added later): refused under a cost ceiling, counted otherwise.
- ``_gaos.basesdk.BaseSDK.do_request`` / ``AsyncBaseSDK.do_request_async``
  (and, in 2.x releases, ``_interactions._base_client.SyncAPIClient.request``
  / ``AsyncAPIClient.request``): the Interactions API client
  (``client.interactions``, agents, triggers):
  a billed ``POST`` (an interaction, a trigger execution, a decision) is not
  priceable before it is sent (server-side history, agents): refused under a
  cost ceiling, counted otherwise; the rest passes.
- ``AsyncLive.connect``: a Live session is contained turn by turn
  (:mod:`._realtime`, :mod:`._live_session`): each turn admitted before the
  message that makes the model generate is sent, settled from its
  ``usageMetadata``; a trip refuses the session and cuts an open one.
- ``AsyncLiveMusic.connect`` and the Live Interactions WebSocket: many
  billed turns over one WebSocket that cannot be priced or counted per
  message before they are sent, so they are refused in a chain that limits
  anything (a ``cost`` denial saying so); outside such a chain they pass.

Each HTTP attempt (the SDK's ``HttpRetryOptions`` retries through tenacity,
its implicit aiohttp reconnect) is seen by the transport hooks of
``_attempts`` (httpx, httpx2, urllib3 for ``google.auth``'s session, aiohttp
for async clients): every attempt after the first draws on
``max_retries_total`` before it is sent.

Usage (``usageMetadata``): input is ``promptTokenCount`` (cached content
included) plus ``toolUsePromptTokenCount``; output is
``candidatesTokenCount`` plus ``thoughtsTokenCount`` (thinking, billed as
output); in a stream only the chunk finishing the last candidate counts.
The reservation caps output at ``maxOutputTokens`` (thinking counts against
it) times ``candidateCount``; a request without one is clamped to what the
budget buys, in a copy of the body.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Collection
from typing import Any
from urllib.parse import urlsplit

from veronica_otel._attributes import (
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_RESPONSE_ID,
    GEN_AI_RESPONSE_MODEL,
)
from veronica_otel._config import ExecutionConfig
from veronica_otel._context import ExecutionContext
from veronica_otel._propagation import default_context
from veronica_otel._units import MAX_COUNT

from . import _genai_request, _realtime
from ._adapter import (
    AdapterAsyncStream,
    AdapterStream,
    ProviderAdapter,
    Request,
    refuse_unpriced,
    wrapper,
)
from ._common import ContainedCall, token_count
from ._hooks import GuardedInstrumentor, Hook, InstrumentationError, SDKHooks
from ._json_body import loads

__all__ = ["GoogleGenAIInstrumentor"]

_logger = logging.getLogger(__name__)
_instruments = ("google-genai >= 1.40, < 4",)
_UNLIMITED = ExecutionConfig()


class _GeminiAdapter(ProviderAdapter):
    """``BaseApiClient.request*`` of a Gemini API client."""

    provider = "gcp.gemini"

    def read_request(
        self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], method: str
    ) -> Request | None:
        # ``(http_method, path, request_dict)``, the SDK's positional arguments: _arg's, inline.
        n = len(args)
        http_method = args[0] if n else kwargs.get("http_method")
        path = args[1] if n > 1 else kwargs.get("path")
        body = args[2] if n > 2 else kwargs.get("request_dict")
        options = getattr(instance, "_http_options", None)
        base_url = getattr(options, "base_url", None)
        server = _SERVERS.get(base_url) if type(base_url) is str else None  # _server's cache
        if server is None:
            server = _server(options)
        return _genai_request.read(
            http_method if type(http_method) is str else str(http_method),
            path if type(path) is str else str(path),
            body,
            server,
        )

    def rewrite(
        self,
        instance: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        cap: int | None,
        model: str | None,
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        path, body = _genai_request.rewrite(
            _path(args, kwargs), _arg(args, kwargs, 2, "request_dict"), cap, model
        )
        return _put(_put((args, kwargs), 1, "path", path), 2, "request_dict", body)

    def read_reply(self, call: ContainedCall, reply: Any) -> None:
        if not call.request.priced:
            return  # nothing in the reply prices it: the reservation stands
        body = getattr(reply, "body", None)
        data = loads(body) if body else None
        if isinstance(data, dict):
            _read(call, data, True)

    def wrap_stream(self, call: ContainedCall, reply: Any, is_async: bool) -> Any:
        reader = _Chunks(call.request.choices).read
        if is_async:
            return AdapterAsyncStream(reply, call, reader)
        return AdapterStream(reply, call, reader)


class _VertexAdapter(_GeminiAdapter):
    """``BaseApiClient.request*`` of a ``vertexai=True`` client."""

    provider = "gcp.vertex_ai"


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs.get(name)


def _path(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    return str(_arg(args, kwargs, 1, "path"))


def _put(
    call: tuple[tuple[Any, ...], dict[str, Any]], index: int, name: str, value: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    args, kwargs = call
    if len(args) > index:
        return (*args[:index], value, *args[index + 1 :]), kwargs
    return args, {**kwargs, name: value}


_SERVERS: dict[str, dict[str, Any]] = {}


def _server(options: Any) -> dict[str, Any] | None:
    """``server.address`` / ``server.port`` of a client's base URL (parsed once per
    URL; shared: never mutated)."""
    base_url = getattr(options, "base_url", None)
    if type(base_url) is not str:
        return None
    found = _SERVERS.get(base_url)
    if found is None:
        parts = urlsplit(base_url)
        found = {}
        if parts.hostname:
            found["server.address"] = parts.hostname
            port = parts.port or {"https": 443, "http": 80}.get(parts.scheme)
            if port is not None:
                found["server.port"] = port
        if len(_SERVERS) < 64:
            _SERVERS[base_url] = found
    return found


def _read(call: ContainedCall, data: dict[str, Any], final: bool) -> None:
    """Usage (when ``final``) and response attributes of one reply or chunk."""
    if final:
        usage = data.get("usageMetadata")
        if isinstance(usage, dict):
            _usage(call, usage, call.request.operation == "embeddings")
        elif isinstance(predictions := data.get("predictions"), list):
            _prediction_usage(call, predictions)
    attributes = call.pending_attributes
    if attributes is None:
        return
    if type(value := data.get("responseId")) is str and value:
        attributes[GEN_AI_RESPONSE_ID] = value
    if type(value := data.get("modelVersion")) is str and value:
        attributes[GEN_AI_RESPONSE_MODEL] = value
    candidates = data.get("candidates")
    if isinstance(candidates, list):
        reasons = [
            c["finishReason"].lower()
            for c in candidates
            if isinstance(c, dict) and type(c.get("finishReason")) is str
        ]
        if reasons:
            attributes[GEN_AI_RESPONSE_FINISH_REASONS] = reasons


def _usage(call: ContainedCall, usage: dict[str, Any], embeddings: bool) -> None:
    """Hand ``usageMetadata`` to the call: thinking is output, tool-use prompts input."""
    prompt, text = usage.get("promptTokenCount"), usage.get("candidatesTokenCount", 0)
    if (
        type(prompt) is int
        and type(text) is int
        and "thoughtsTokenCount" not in usage
        and "cachedContentTokenCount" not in usage
        and "toolUsePromptTokenCount" not in usage
    ):  # the common reply: prompt and candidates only
        out = 0 if embeddings else text
        plain = type(call) is ContainedCall and 0 <= prompt <= MAX_COUNT and 0 <= out <= MAX_COUNT
        if plain:  # ContainedCall.set_usage(prompt, out)'s rule for plain counts, copied
            call.cached_tokens = call.cache_write_tokens = call.reasoning_tokens = 0
            call.input_tokens, call.output_tokens, call.usage_seen = prompt, out, True
        else:
            call.set_usage(prompt, out)
        return
    prompt = token_count(usage.get("promptTokenCount"))
    tools = token_count(usage.get("toolUsePromptTokenCount") or 0)
    cached = token_count(usage.get("cachedContentTokenCount") or 0)
    text = token_count(usage.get("candidatesTokenCount") or 0)
    thoughts = token_count(usage.get("thoughtsTokenCount") or 0)
    if prompt is None or tools is None or cached is None or text is None or thoughts is None:
        call.set_usage(None, None)  # unreadable: settled at the reservation
        return
    if embeddings:
        call.set_usage(prompt, 0)
        return
    call.set_usage(prompt + tools, text + thoughts, cached=cached, reasoning=thoughts)


def _prediction_usage(call: ContainedCall, predictions: list[Any]) -> None:
    """Vertex ``predict`` embeddings: each prediction's ``statistics.token_count``."""
    total = 0
    for prediction in predictions:
        embeddings = prediction.get("embeddings") if isinstance(prediction, dict) else None
        stats = embeddings.get("statistics") if isinstance(embeddings, dict) else None
        count = token_count(stats.get("token_count")) if isinstance(stats, dict) else None
        if count is None:
            call.set_usage(None, None)  # one unreadable: settled at the reservation
            return
        total += count
    call.set_usage(total, 0)


class _Chunks:
    """One stream's chunks: text kept, usage final once every candidate finished."""

    __slots__ = ("choices", "finished")

    def __init__(self, choices: int) -> None:
        self.choices = choices
        self.finished: set[object] = set()

    def read(self, call: ContainedCall, item: Any) -> None:
        body = getattr(item, "body", None)
        data = json.loads(body) if body else None
        if not isinstance(data, dict):
            return
        candidates = data.get("candidates")
        for candidate in candidates if isinstance(candidates, list) else ():
            if not isinstance(candidate, dict):
                continue
            index = candidate.get("index", 0)
            if candidate.get("finishReason"):
                self.finished.add(index)
            content = candidate.get("content")
            parts = content.get("parts") if index == 0 and isinstance(content, dict) else None
            for part in parts if isinstance(parts, list) else ():
                if isinstance(part, dict) and not part.get("thought"):
                    text = part.get("text")
                    if type(text) is str:
                        call.add_text(text)
        _read(call, data, final=len(self.finished) >= self.choices)


# The Interactions API's billed POSTs (model or agent runs, server-side history).
_NEXTGEN_BILLED = re.compile(r"/(?:interactions|decisions|triggers/[^/]+/executions)$")


class _NextGenAdapter(ProviderAdapter):
    """``BaseSDK.do_request`` of the Interactions API client: billed POSTs are not
    priceable before they are sent (refused under a cost ceiling)."""

    provider = "gcp.gemini"

    def read_request(
        self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], method: str
    ) -> Request | None:
        request = _arg(args, kwargs, 1, "request")
        if getattr(request, "method", "") != "POST":
            return None
        path = str(request.url.path)
        if not _NEXTGEN_BILLED.search(path):
            return None
        try:
            body = json.loads(request.content or b"{}")
        except Exception:  # a streamed or unreadable body: still refused or counted
            body = {}
        return _unpriced(path, body if isinstance(body, dict) else {})


class _StainlessAdapter(ProviderAdapter):
    """``SyncAPIClient.request`` of the 2.x Interactions client (``_interactions``):
    as :class:`_NextGenAdapter`, read from the SDK's request options."""

    provider = "gcp.gemini"

    def read_request(
        self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], method: str
    ) -> Request | None:
        options = _arg(args, kwargs, 1, "options")
        if str(getattr(options, "method", "")).lower() != "post":
            return None
        path = str(getattr(options, "url", "")).split("?", 1)[0]
        if not _NEXTGEN_BILLED.search(path):
            return None
        body = getattr(options, "json_data", None)
        return _unpriced(path, body if isinstance(body, dict) else {})


def _unpriced(path: str, body: dict[str, Any]) -> Request:
    agent = body.get("agent")
    model = str(body.get("model") or agent or "unknown").rpartition("/")[2]
    operation = "invoke_agent" if agent else path.rpartition("/")[2]
    return Request(operation, model, body, priced=False)


_GEMINI, _VERTEX = _GeminiAdapter(), _VertexAdapter()
_NEXTGEN, _STAINLESS = _NextGenAdapter(), _StainlessAdapter()


def _by_client(method: str, is_async: bool) -> Callable[..., Any]:
    """One wrapper for both clients: the adapter (provider) by ``instance.vertexai``."""
    gemini, vertex = wrapper(_GEMINI, method, is_async), wrapper(_VERTEX, method, is_async)

    def contained(
        wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        return (vertex if instance.vertexai else gemini)(wrapped, instance, args, kwargs)

    return contained


def _limits_anything(ctx: ExecutionContext) -> bool:
    if ctx.has_cost_ceiling or ctx.pools:
        return True
    level: ExecutionContext | None = ctx
    while level is not None:
        if level.config != _UNLIMITED or level.pipeline:
            return True
        level = level.parent
    return False


def _refuse_session(what: str) -> Callable[..., Any]:
    """A wrapper refusing a Live session in a chain that limits anything."""

    def refuse(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        ctx = default_context()
        if ctx is not None and _limits_anything(ctx):
            model = kwargs.get("model")
            refuse_unpriced(
                ctx,
                f"{what} ({model})" if model else what,
                why="is many billed turns over one WebSocket and cannot be priced or counted "
                "per message before they are sent; it is refused in a chain with limits",
            )
        return wrapped(*args, **kwargs)

    return refuse


_ARGS = ("http_method", "path", "request_dict")
_API = "google.genai._api_client"
_CORE = SDKHooks(
    _instruments[0],
    _API,
    (
        Hook("BaseApiClient", "request", _by_client("request", False), _ARGS),
        Hook("BaseApiClient", "request_streamed", _by_client("request_streamed", False), _ARGS),
        Hook("BaseApiClient", "async_request", _by_client("async_request", True), _ARGS, (), True),
        Hook(
            "BaseApiClient",
            "async_request_streamed",
            _by_client("async_request_streamed", True),
            _ARGS,
            (),
            True,
        ),
    ),
    tuple(
        ("BaseApiClient", (name,))
        for name in ("request", "request_streamed", "async_request", "async_request_streamed")
    ),
)
_DO = ("hook_ctx", "request")
_OPTS = ("cast_to", "options")
# Modules only some releases have: hooked where present (absent, the endpoint is too).
_OPTIONAL = (
    SDKHooks(
        _instruments[0],
        "google.genai._gaos.basesdk",
        (
            Hook("BaseSDK", "do_request", wrapper(_NEXTGEN, "do_request"), _DO),
            Hook("AsyncBaseSDK", "do_request_async", wrapper(_NEXTGEN, "do", True), _DO, (), True),
        ),
        (("BaseSDK", ("do_request",)), ("AsyncBaseSDK", ("do_request_async",))),
    ),
    SDKHooks(
        _instruments[0],
        "google.genai._interactions._base_client",
        (
            Hook("SyncAPIClient", "request", wrapper(_STAINLESS, "request"), _OPTS),
            Hook(
                "AsyncAPIClient", "request", wrapper(_STAINLESS, "request", True), _OPTS, (), True
            ),
        ),
        (("SyncAPIClient", ("request",)), ("AsyncAPIClient", ("request",))),
    ),
    SDKHooks(
        _instruments[0],
        "google.genai.live",
        (Hook("AsyncLive", "connect", _realtime.live_connect, (), ("model",)),),
        (("AsyncLive", ("connect",)),),
    ),
    SDKHooks(
        _instruments[0],
        "google.genai.live_music",
        (
            Hook(
                "AsyncLiveMusic", "connect", _refuse_session("a Live music session"), (), ("model",)
            ),
        ),
        (("AsyncLiveMusic", ("connect",)),),
    ),
    SDKHooks(
        _instruments[0],
        "google.genai._interactions_websocket",
        (
            Hook(
                "InteractionWebSocketConnectionContext",
                "_connect",
                _refuse_session("a Live interaction"),
                (),
                (),
                True,
            ),
        ),
        (("InteractionWebSocketConnectionContext", ("_connect",)),),
    ),
)


def _present(hooks: SDKHooks) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(hooks.module) is not None
    except (ImportError, ValueError):
        return False


class GoogleGenAIInstrumentor(GuardedInstrumentor):
    """Contains every billed call of the ``google-genai`` SDK in the active chain.

    ``instrument()`` raises :class:`~veronica_otel.instrumentors.InstrumentationError`
    when the installed ``google-genai`` is outside the tested range or a hook
    changed; nothing of that module is patched and its calls in a chain are
    refused (fail closed).
    """

    _hooks = _CORE
    reports_attempts = True

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        super()._instrument(**kwargs)
        present = [hooks for hooks in _OPTIONAL if _present(hooks)]
        try:
            for hooks in present:
                hooks.probe()
        except InstrumentationError as exc:  # all or nothing: the core hooks come off too
            self._hooks.remove()
            for hooks in (self._hooks, *present):
                hooks.refuse(exc)
            _logger.error("%s", exc)
            raise
        for hooks in present:
            hooks.install()

    def _uninstrument(self, **kwargs: Any) -> None:
        for hooks in _OPTIONAL:
            hooks.remove()
        super()._uninstrument(**kwargs)

    def uninstrument(self, **kwargs: Any) -> Any:
        for hooks in _OPTIONAL:
            hooks.lift()  # a refusal left by a failed instrument()
        return super().uninstrument(**kwargs)
