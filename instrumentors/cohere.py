"""Containment for the ``cohere`` SDK (7.x): ``ClientV2``, ``Client`` and their async twins.

Usage::

    from veronica_otel.instrumentors.cohere import CohereInstrumentor

    CohereInstrumentor().instrument()
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)):
        co.chat(model="command-a-03-2025", messages=[...])

Configuration: limits come from the active :class:`ExecutionContext`, else the
process default chain (zero-code: ``VERONICA_*`` variables). With neither,
calls pass through untouched.

Where it hooks: ``cohere.core.http_client``. Every generated method of the
SDK (v1 and v2, the raw clients, batches, datasets, fine-tuning, embed jobs,
audio) sends through ``HttpClient.request`` / ``AsyncHttpClient.request``,
and the three streaming ones (v2 chat, v1 chat, v1 generate) through
``HttpClient.stream`` / ``AsyncHttpClient.stream``. The operation is read from
the SDK's own path (``"v2/chat"``), the model, cap and input from the ``json``
body it is given, so one place sees every endpoint, a new one included:

- token-priced: chat (v1, v2), generate, embed, classify, summarize,
  contained at their worst case (``max_tokens`` is set or lowered when the
  chain's budget requires it); a v1 chat that continues a server-side
  conversation or searches connectors adds :data:`_CONTEXT_BOUND` tokens;
- free (tokenize, detokenize, connectors, datasets, cancellations): passed;
- anything else (rerank, billed per search unit; batches, embed jobs and
  fine-tuning, billed for files the request does not hold; audio): admitted
  under a name no price table knows (``"v2/rerank:rerank-v3.5"``), so it is
  refused under a cost ceiling, naming it, and counted as a step without one.

``request()`` retries by calling itself (429, 408, 409, 5xx and lost
connections, up to ``max_retries``): the inner calls see the call already
admitted and pass, and each attempt goes through ``httpx``'s
``HTTPTransport.handle_request``, where the transport hooks (``_attempts``)
draw every retry from ``max_retries_total`` before it is sent. The response
comes back before the SDK reads it: an HTTP error status is a reply billed
nothing, a reply's ``usage.billed_units`` (v2) or ``meta.billed_units`` (v1)
is committed. Its body is decoded once: the SDK's own ``response.json()``,
its next step, is handed our decode (once; a reply that takes no attribute is
decoded by the SDK again). A stream is held as it is entered
(``_streamed_response.StreamContext``): its ``message-end`` event's
``delta.usage`` (v2) or ``stream-end`` event's ``response.meta`` (v1) is read,
and it is cut at the next event once the chain trips.

``AsyncHttpClient.stream`` returns its context manager synchronously: such a
call is admitted there with the in-process ledger's synchronous path.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from functools import partial
from typing import Any, ClassVar, NamedTuple
from weakref import ref

from veronica_otel._attributes import GEN_AI_RESPONSE_FINISH_REASONS, GEN_AI_RESPONSE_ID
from veronica_otel._units import MAX_COUNT

from ._adapter import HTTPErrorReply, ProviderAdapter, Request, wrapper
from ._common import ContainedCall
from ._hooks import GuardedInstrumentor, Hook, SDKHooks
from ._json_body import loads
from ._streamed_response import StreamContext

__all__ = ["CohereInstrumentor"]

_instruments = ("cohere >= 7.0, < 8",)

# The largest context window of Cohere's chat models (Command A: 256k): what
# a server-side conversation or connector search can add at most.
_CONTEXT_BOUND = 256_000
# Cohere documents no per-image maximum for its vision and embed models; this
# bound is above every per-image count we know of (Mistral's is 4,160).
_IMAGE_TOKENS = 16_384
_STREAMS = frozenset(("stream", "astream"))
_WHOLE: set[type] = set()  # _CohereAdapter.whole_replies, filled by _request_lane


class _Route(NamedTuple):
    operation: str
    inputs: tuple[str, ...]
    cap: str | None = None
    unpriced: bool = False
    server_side: tuple[str, ...] = ()  # body keys that add server-side input
    choices: str | None = None  # body key of the number of generations


_EMBED = _Route("embeddings", ("texts", "images", "inputs"))
_ROUTES: dict[str, _Route] = {
    "v2/chat": _Route("chat", ("messages", "tools", "documents", "response_format"), "max_tokens"),
    "v1/chat": _Route(
        "chat",
        ("message", "preamble", "chat_history", "documents", "tools", "tool_results"),
        "max_tokens",
        server_side=("conversation_id", "connectors"),
    ),
    "v1/generate": _Route("text_completion", ("prompt",), "max_tokens", choices="num_generations"),
    "v2/embed": _EMBED,
    "v1/embed": _EMBED,
    "v1/classify": _Route("classification", ("inputs", "examples")),
    "v1/summarize": _Route("summarize", ("text", "additional_command")),
}
_FREE = frozenset(
    ("v1/tokenize", "v1/detokenize", "v1/check-api-key", "v1/connectors", "v1/datasets")
)
_FREE_ENDINGS = (":cancel", "/cancel", "/oauth/authorize")
_NO_OUTPUT = frozenset(("embeddings", "classification"))


def _route(path: object) -> _Route | None:
    if type(path) is not str:
        return None
    route = _ROUTES.get(path)
    if route is not None:
        return route
    if path in _FREE or path.endswith(_FREE_ENDINGS):
        return None
    return _Route(path.split("/", 2)[-1] if "/" in path else path, (), unpriced=True)


_NOTHING: dict[str, Any] = {}
_ABSENT = (None, ...)  # a body key left out: None, or the SDK's OMIT


def _images(body: dict[str, Any]) -> int:
    """Images sent: ``image_url`` parts of v2 messages, embed images and inputs."""
    count = 0
    for key in ("messages", "inputs"):
        items = body.get(key)
        if not items or items is ...:  # absent, OMIT or empty
            continue
        for item in items:
            content = item.get("content") if type(item) is dict else None
            if type(content) is list:  # a text message's content is a str
                for part in content:
                    if type(part) is dict and part.get("type") in ("image_url", "image"):
                        count += 1
    images = body.get("images")
    return count + (len(images) if type(images) is list else 0)


# A Request from its fields without NamedTuple's Python-level __new__ (once per call).
_request_of = tuple.__new__  # every Request field, in order (a new field goes here too)


def _read_request(path: object, raw: Any, method: str) -> Request | None:
    """A POST to any route (:meth:`_CohereAdapter.read_request` reads v2 chat)."""
    # A known route is one dict read (_route's first step, without its frame).
    route = _ROUTES.get(path) if type(path) is str else None
    if route is None:
        route = _route(path)
        if route is None:
            return None
    # The SDK's body names every parameter, OMIT or None when left out: each
    # key is read once, straight from it (``...`` fails every type test below).
    get = raw.get if type(raw) is dict else _NOTHING.get
    named = get("model")
    model = named if type(named) is str and named else "unknown"
    if route.unpriced:
        model = f"{path}:{model}"
    parts = []
    for key in route.inputs:
        part = get(key)
        if part is not None and part is not ...:
            parts.append(part)
    messages = get("messages")
    if type(messages) is list:
        n_messages = len(messages)
    else:  # v1: the message, after its history
        history = get("chat_history")
        n_messages = len(history) + 1 if type(history) is list else 1
    cap_key = route.cap
    cap = get(cap_key) if cap_key is not None else None
    choices = get(route.choices) if route.choices is not None else None
    extra = 0
    if route.unpriced:
        extra = _CONTEXT_BOUND
    else:
        for key in route.server_side:
            value = get(key)
            if value and value is not ...:  # a conversation id, connectors
                extra = _CONTEXT_BOUND
                break
    if (cap_key is not None or route.operation == "embeddings") and type(raw) is dict:
        extra += _images(raw) * _IMAGE_TOKENS
    return Request(
        route.operation,
        model,
        parts,
        n_messages,
        cap if type(cap) is int else None,
        clampable=cap_key is not None and not route.unpriced,
        choices=choices if type(choices) is int and choices > 1 else 1,
        stream=method in _STREAMS,
        extra_input_tokens=extra,
    )


def read_plain(
    adapter: Any, args: tuple[Any, ...], kwargs: dict[str, Any], method: str = "request"
) -> tuple[Request | None, int]:
    """The request of an ``HttpClient`` call (``request``, unless ``method`` says), and
    the UTF-8 bytes of its input (``_utf8_bytes(request.input_parts)``, as
    ``_describe`` walks it) when it is a plain v2 chat: messages whose keys and
    values are all strings, nothing else as input; -1 for any other. The shared
    lane's reader (``ProviderAdapter.read_plain``: the ``request`` hook's, never a
    stream's) and read_request's."""
    if kwargs.get("method") != "POST":
        return None, -1
    path = args[0] if args else kwargs.get("path")
    raw = kwargs.get("json")
    if path != "v2/chat" or type(raw) is not dict:
        return _read_request(path, raw, method), -1
    # v2 chat, the SDK's dict body: _read_request's rules for its route in one
    # frame (OMIT is ``...``, which fails every type test below).
    get = raw.get
    named = get("model")
    model = named if type(named) is str and named else "unknown"
    messages = get("messages")
    tools, documents, schema = get("tools"), get("documents"), get("response_format")
    cap = get("max_tokens")
    if (
        type(messages) is list
        and tools in _ABSENT
        and documents in _ABSENT
        and schema in _ABSENT
        and get("inputs") is None
        and get("images") is None
    ):
        # Plain text messages: no image (_images counts none), and
        # _list_bytes([messages])'s count: 1 for the outer list, 1 per message,
        # per message 2 per key and the bytes of its keys and values.
        size = 1 + len(messages)
        for message in messages:
            if type(message) is not dict:
                break
            try:
                text = "".join(message) + "".join(message.values())
            except TypeError:  # content blocks, tool calls: the general rules below
                break
            size += 2 * len(message) + (len(text) if text.isascii() else len(text.encode()))
        else:
            request = (
                "chat",
                model,
                [messages],
                len(messages),
                cap if type(cap) is int else None,
                True,  # clampable: max_tokens
                1,
                method in _STREAMS,
                0,
                None,
                None,
                True,
                True,
            )
            return _request_of(Request, request), size
    parts = []
    for part in (messages, tools, documents, schema):
        if part is not None and part is not ...:
            parts.append(part)
    extra = 0
    if type(messages) is list and get("inputs") is None and get("images") is None:
        n_messages = len(messages)
        for message in messages:  # a text message (a str content) shows no image
            if type(message) is not dict or type(message.get("content")) is not str:
                extra = _images(raw) * _IMAGE_TOKENS
                break
    else:
        history = get("chat_history")
        n_messages = (
            len(messages)
            if type(messages) is list
            else (len(history) + 1 if type(history) is list else 1)
        )
        extra = _images(raw) * _IMAGE_TOKENS
    request = (
        "chat",
        model,
        parts,
        n_messages,
        cap if type(cap) is int else None,
        True,  # clampable: max_tokens
        1,
        method in _STREAMS,
        extra,
        None,
        None,
        True,
        True,
    )
    return _request_of(Request, request), -1


class _CohereAdapter(ProviderAdapter):
    provider = "cohere"
    read_plain = staticmethod(read_plain)
    # ``request()``'s reply, an ``httpx.Response`` (filled as the hooks go on, by
    # _request_lane): read and settled as it returns, in the shared lane's frame.
    whole_replies: ClassVar[Collection[type]] = _WHOLE

    def read_request(
        self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], method: str
    ) -> Request | None:
        return read_plain(self, args, kwargs, method)[0]

    def rewrite(
        self,
        instance: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        cap: int | None,
        model: str | None,
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        body = kwargs.get("json")
        route = _route(args[0] if args else kwargs.get("path"))
        if type(body) is not dict or route is None:
            return args, kwargs
        body = dict(body)  # the caller's (and the retry's) dict stays as it was
        if cap is not None and route.cap is not None:
            body[route.cap] = cap
        if model is not None:
            body["model"] = model
        return args, {**kwargs, "json": body}

    def wrap_stream(self, call: ContainedCall, reply: Any, is_async: bool) -> Any:
        return StreamContext(reply, call, _read_event)

    def read_reply(self, call: ContainedCall, reply: Any) -> None:
        status = reply.status_code
        if status >= 400:  # the SDK raises its error once we return it
            call.finish(HTTPErrorReply(status), billed=False)
            return
        try:  # the body as the API sends it (UTF-8 JSON), without httpx's frames
            data = loads(reply.content.decode("utf-8"))
        except UnicodeDecodeError:
            data = reply.json()
        if type(data) is dict:
            # v2's billed units, both counts plain and each in set_usage's range
            # (their sum within it: stricter; a negative one makes ``inp | out``
            # negative): set as ContainedCall.set_usage sets them (its rule,
            # copied); anything else reads by _read_usage.
            try:
                counts = data["usage"]["billed_units"]
                inp, out = counts["input_tokens"], counts["output_tokens"]
            except (KeyError, TypeError):  # not there, or not a dict
                inp = out = None
            if (
                type(inp) is int is type(out)
                and (inp | out) >= 0
                and inp + out <= MAX_COUNT
                and type(call) is ContainedCall
            ):
                call.cached_tokens = call.cache_write_tokens = call.reasoning_tokens = 0
                call.input_tokens, call.output_tokens, call.usage_seen = inp, out, True
            else:
                _read_usage(call, data)
            attributes = call.pending_attributes
            if attributes is not None:
                _attributes(attributes, data)
        # Decoded once: the SDK's own ``reply.json()``, its next step, takes ours. A
        # reply without an instance dict (or whose ``json`` is a property) decodes again.
        # (A weak reference back: no cycle keeps a reply the SDK never decodes.)
        try:
            held = reply.__dict__
        except AttributeError:  # no instance dict (slots): decoded again
            held = {}
        held["json"] = partial(_decoded, ref(reply), data)


def _decoded(reply_ref: ref[Any], data: Any, **kwargs: Any) -> Any:
    """A reply's ``json()`` from the body read_reply decoded, once: a later call (the
    caller's, on a raw response) decodes afresh, and so does one with ``json.loads``
    arguments."""
    reply = reply_ref()
    if reply is None:  # cannot be: the SDK calls it on the reply
        return data
    del reply.json  # the instance's: the class's json() again
    return reply.json(**kwargs) if kwargs else data


def _read_usage(call: ContainedCall, holder: dict[str, Any]) -> None:
    """Usage from a reply or a final event: ``usage`` (v2) or ``meta`` (v1), billed units first."""
    usage = holder.get("usage") or holder.get("meta")
    if type(usage) is not dict:
        return
    counts = usage.get("billed_units") or usage.get("tokens")
    if type(counts) is not dict:
        return
    inp, out = counts.get("input_tokens"), counts.get("output_tokens")
    operation = call.request.operation
    if out is None and operation in _NO_OUTPUT:
        out = 0
    if inp is None and "search_units" in counts:  # rerank: billed per search, not per token
        inp = out = 0
    call.set_usage(inp, out)


def _attributes(attributes: dict[str, Any], data: dict[str, Any]) -> None:
    identity = data.get("id", data.get("response_id", data.get("generation_id")))
    if type(identity) is str and identity:
        attributes[GEN_AI_RESPONSE_ID] = identity
    reason = data.get("finish_reason")
    if type(reason) is str:
        attributes[GEN_AI_RESPONSE_FINISH_REASONS] = [reason]


def _read_event(call: ContainedCall, payload: bytes) -> None:
    """One stream event: v2 server-sent events, v1 JSON lines."""
    try:
        event = json.loads(payload)
    except ValueError:
        return
    if type(event) is not dict:
        return
    kind = event.get("type", event.get("event_type"))
    if kind == "content-delta":
        delta = event.get("delta")
        message = delta.get("message") if type(delta) is dict else None
        content = message.get("content") if type(message) is dict else None
        if type(content) is dict and type(text := content.get("text")) is str:
            call.add_text(text)
    elif kind == "text-generation":
        if type(text := event.get("text")) is str:
            call.add_text(text)
    elif kind in ("message-end", "stream-end"):
        final = event.get("delta") if kind == "message-end" else event.get("response")
        if type(final) is dict:
            _read_usage(call, final)
            attributes = call.pending_attributes
            if attributes is not None:
                _attributes(attributes, {**final, **event})
    elif kind == "message-start" and (attributes := call.pending_attributes) is not None:
        _attributes(attributes, event)


class _CohereStreams(_CohereAdapter):
    """The ``stream`` hooks' adapter: no shared lane (its reader reads ``request``'s
    calls), no whole reply (a stream's context manager)."""

    read_plain = None  # type: ignore[assignment]
    whole_replies = ()


_ADAPTER, _STREAMS_ADAPTER = _CohereAdapter(), _CohereStreams()
_request = wrapper(_ADAPTER, "request")
_shared_lane: Callable[[], Callable[..., Any]] | None = getattr(_request, "veronica_lane", None)


def _request_lane() -> Callable[..., Any]:
    """The shared lane ``_hooks`` puts over ``request()``, with its reply type known whole."""
    import httpx  # the SDK's HTTP library, imported with it

    _WHOLE.add(httpx.Response)
    return _shared_lane()  # type: ignore[misc]


if _shared_lane is not None:
    _request.veronica_lane = _request_lane  # type: ignore[attr-defined]
_SIGNATURE = (("path",), ("method", "json"))
_PATCHES = (
    Hook("HttpClient", "request", _request, *_SIGNATURE),
    Hook(
        "AsyncHttpClient",
        "request",
        wrapper(_ADAPTER, "arequest", is_async=True),
        *_SIGNATURE,
        True,
    ),
    Hook("HttpClient", "stream", wrapper(_STREAMS_ADAPTER, "stream"), *_SIGNATURE),
    Hook("AsyncHttpClient", "stream", wrapper(_STREAMS_ADAPTER, "astream"), *_SIGNATURE),
)
_GUARDS = (
    ("HttpClient", ("request",)),
    ("AsyncHttpClient", ("request",)),
    ("HttpClient", ("stream",)),
    ("AsyncHttpClient", ("stream",)),
)
_HOOKS = SDKHooks(_instruments[0], "cohere.core.http_client", _PATCHES, _GUARDS)


class CohereInstrumentor(GuardedInstrumentor):
    """Contains every HTTP API call of the ``cohere`` SDK in the active chain.

    ``instrument()`` raises :class:`~veronica_otel.instrumentors.InstrumentationError`
    when the installed ``cohere`` is outside the tested range or a hook
    changed; nothing is patched and calls in a chain are refused (fail closed).
    """

    _hooks = _HOOKS
    reports_attempts = True

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments
