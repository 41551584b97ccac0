"""Containment for the ``ollama`` SDK (0.4 and later 0.x).

Usage::

    from veronica_otel.instrumentors.ollama import OllamaInstrumentor

    OllamaInstrumentor().instrument()
    with ExecutionContext(ExecutionConfig(max_steps=20, max_tokens=50_000)):
        ollama.chat(model="llama3.2", messages=[...])   # raises BudgetExceededError when over

Configuration: limits come from the active :class:`ExecutionContext`, else the
process default chain (zero-code: ``VERONICA_*`` variables). With neither,
calls pass through untouched.

Prices: a local Ollama model costs no money, but its calls still count as
steps, tokens and time. Under a cost ceiling a model with no known price is
denied (DESIGN, Cost), so say that local models are free, once for all of
them, in the policy file or the :class:`~veronica_otel._pricing.PriceTable`::

    [prices."ollama:*"]
    input = 0
    output = 0

Calls to Ollama's hosted models are not local: those sent to ``ollama.com``
and those whose tag says ``cloud`` (``gpt-oss:120b-cloud``,
``glm-4.6:cloud``, relayed by a signed-in local server) are priced under the
provider ``ollama.cloud``, which ``ollama:*`` does not match: price them
(``[prices."ollama.cloud:gpt-oss:120b-cloud"]``, ``"ollama.cloud:*"``) or
they are denied under a cost ceiling.

Where it hooks: ``Client._request`` and ``AsyncClient._request``, through
which every model call of the SDK passes, streamed or not (the public
``chat``, ``generate``, ``embed``, ``embeddings`` and ``systemone``, and the
module-level functions bound to the default client). ``_request_raw`` is not
enough: streams open ``httpx``'s ``stream()`` directly. A streamed call is a
generator that sends its request at the first ``next()``; it is held so
each chunk is read and a trip cuts it. Model management (``list``, ``show``,
``pull``, ``push``, ``create``, ``copy``, ``delete``, ``ps``) is not billed
and passes; a path this module does not know is contained as a call of the
model its body names (denied under a cost ceiling unless priced).
``web_search`` and ``web_fetch`` (ollama.com's tools) are contained as tool
calls (``execute_tool web_search``): a step each, priced by
``[tools."web_search"] cost_usd`` if set.

The request as read, per route (the JSON body the SDK built):

- ``/api/chat``: ``messages``, ``tools``, ``format``; ``/api/generate``:
  ``prompt``, ``suffix``, ``system``, ``template``, plus ``len(context)``
  tokens (a previous reply's context, sent back as token ids);
  ``/api/embed``: ``input``; ``/api/embeddings``: ``prompt``.
- Images (base64, in ``images``) are left out of the byte walk and count
  :data:`IMAGE_TOKENS` each.
- Output cap: ``options.num_predict``. Absent, ``-1`` (unbounded) or ``-2``
  (fill the context): no cap, and the call is clamped to what the chain has
  left, at most the model's largest output
  (:data:`~veronica_otel._pricing.DEFAULT_MAX_OUTPUT_TOKENS` for a model
  with no known limit), by rewriting a copy of ``options``.

Usage is ``prompt_eval_count`` (input) and ``eval_count`` (output), on the
reply or on a stream's last chunk (``done: true``). ``/api/embeddings``
reports none: its reservation (the input bound) is committed.

Ollama's SDK does not retry. A call that failed is settled by the G10 table
in :mod:`~veronica_otel.instrumentors._adapter` with the attempts the
``httpx`` transport hook saw: connection refused (``ConnectionError``)
releases it, an HTTP error reply (``ResponseError`` with its status) costs
nothing but the step, a timeout after the send costs the reservation, and an
``{"error": ...}`` line inside a stream (no HTTP status) costs the
reservation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from typing import Any, ClassVar

from veronica_otel._attributes import (
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_FREQUENCY_PENALTY,
    GEN_AI_REQUEST_PRESENCE_PENALTY,
    GEN_AI_REQUEST_SEED,
    GEN_AI_REQUEST_TEMPERATURE,
    GEN_AI_REQUEST_TOP_K,
    GEN_AI_REQUEST_TOP_P,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_RESPONSE_MODEL,
)
from veronica_otel._pricing import DEFAULT_MAX_OUTPUT_TOKENS
from veronica_otel._propagation import default_context
from veronica_otel._tools import ToolCall
from veronica_otel._units import MAX_COUNT

from ._adapter import ADMITTED, ProviderAdapter, Request, wrapper
from ._common import ContainedCall, attribute_value, server_attributes
from ._hooks import GuardedInstrumentor, Hook, SDKHooks

__all__ = ["IMAGE_TOKENS", "OllamaInstrumentor"]

_instruments = ("ollama >= 0.4, < 1",)
PROVIDER = "ollama"
CLOUD_PROVIDER = "ollama.cloud"

IMAGE_TOKENS = 16_384
"""Input tokens one image may cost. Vision models turn an image into a
number of tokens set by its resolution, not its bytes; the largest we know
of is a dynamic-resolution encoder (Qwen-VL) at its pixel ceiling, 16,384."""

# Path -> (gen_ai.operation.name, body keys that are input text).
_ROUTES: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "/api/chat": ("chat", ("messages", "tools", "format")),
    "/api/generate": ("text_completion", ("prompt", "suffix", "system", "template")),
    "/api/embed": ("embeddings", ("input",)),
    "/api/embeddings": ("embeddings", ("prompt",)),
    "/v1/systemone": ("generate_content", ("state", "questions")),
}
# Not billed: model management and status.
_FREE = frozenset(
    (
        "/api/tags",
        "/api/show",
        "/api/pull",
        "/api/push",
        "/api/create",
        "/api/copy",
        "/api/delete",
        "/api/ps",
        "/api/version",
    )
)
_TOOLS = {"/api/web_search": "web_search", "/api/web_fetch": "web_fetch"}
_OPTIONS = {
    "temperature": GEN_AI_REQUEST_TEMPERATURE,
    "top_p": GEN_AI_REQUEST_TOP_P,
    "top_k": GEN_AI_REQUEST_TOP_K,
    "seed": GEN_AI_REQUEST_SEED,
    "presence_penalty": GEN_AI_REQUEST_PRESENCE_PENALTY,
    "frequency_penalty": GEN_AI_REQUEST_FREQUENCY_PENALTY,
}
_CLOUD_HOSTS: list[tuple[object, bool]] = [(None, False)]
_MISSING = object()  # no ``options`` dict: _cap reads what there is
_WHOLE: set[type] = set()  # OllamaAdapter.whole_replies, filled by _lane
# The keys of the SDK's chat body read_plain reads plain (the SDK drops what is None).
_CHAT_PATH = ("/api/chat",)  # ``_request``'s url, as the SDK's chat() passes it
_PLAIN_CHAT = frozenset(("model", "messages", "tools", "stream", "options", "keep_alive", "think"))
# A Request from its fields without NamedTuple's Python-level __new__ (once per call).
_request_of = tuple.__new__  # every Request field, in order (a new field goes here too)


def _path(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """The request's path (``_request(cls, method, url, ...)``), without host or query."""
    url = args[2] if len(args) > 2 else kwargs.get("url", "")
    url = url if type(url) is str else str(url)
    if "://" in url:
        url = "/" + url.split("://", 1)[1].partition("/")[2]
    return url.partition("?")[0]


def _base_url(instance: Any) -> object:
    """The base URL of a client's ``httpx`` client (None: none)."""
    client = getattr(instance, "_client", None)
    # httpx keeps it in ``_base_url``: its ``base_url`` property's frame, skipped.
    base_url = getattr(client, "_base_url", _MISSING)
    return getattr(client, "base_url", None) if base_url is _MISSING else base_url


def _cloud_host(base_url: object) -> bool:
    """Whether a base URL is ollama.com or one of its hosts (the last URL's answer kept)."""
    last = _CLOUD_HOSTS[0]
    if last[0] is base_url:
        return last[1]
    host = getattr(base_url, "host", None)
    cloud = type(host) is str and (host == "ollama.com" or host.endswith(".ollama.com"))
    _CLOUD_HOSTS[0] = (base_url, cloud)
    return cloud


def _cap(options: object) -> tuple[int | None, bool]:
    """The output cap ``options.num_predict`` sets, and whether it can be rewritten."""
    value: object = None
    if type(options) is dict or isinstance(options, Mapping):  # the SDK's: a dict
        value = options.get("num_predict")
    if value is None or type(value) is int:
        return (value if value is not None and value > 0 else None), True
    if type(value) is float and math.isfinite(value):
        return (math.ceil(value) if value > 0 else None), True  # Ollama truncates it
    # Something Ollama will reject or we cannot read: reserve the most, keep it.
    return DEFAULT_MAX_OUTPUT_TOKENS, False


def _uncontained(path: str, url: object) -> bool:
    """Whether a path no route names passes uncontained: model management, blobs,
    and ollama.com's tools named by full URL (:func:`_tool_call` contains those)."""
    return (
        path in _FREE
        or path.startswith("/api/blobs/")
        or (path in _TOOLS and type(url) is str and "://" in url)
    )


def _parts(body: dict[str, Any], operation: str, keys: tuple[str, ...]) -> tuple[list[object], int]:
    """The input of a route other than chat, and its number of messages."""
    parts = [body[key] for key in keys if body.get(key)]
    inputs = body.get("input")
    return parts, len(inputs) if operation == "embeddings" and type(inputs) is list else 1


def _without_images(messages: list[object]) -> list[object]:
    """The messages with their images left out (read_request counted them)."""
    return [
        {k: v for k, v in m.items() if k != "images"} if isinstance(m, Mapping) else m
        for m in messages
    ]


def _read_request(
    instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], url: object
) -> Request | None:
    """Any request but the SDK's chat (:meth:`OllamaAdapter.read_request`'s lane)."""
    # The SDK's own calls name a bare path (``"/api/generate"``): one dict read, no parsing.
    route = _ROUTES.get(url) if type(url) is str else None
    if route is not None:
        path: str = url  # type: ignore[assignment]
    else:
        path = _path(args, kwargs)
        route = _ROUTES.get(path)
        if route is None and _uncontained(path, url):
            return None
    body = kwargs.get("json")
    if type(body) is not dict:
        body = dict(body) if isinstance(body, Mapping) else {}
    operation, keys = route if route is not None else (path.rpartition("/")[2], ())
    if operation == "chat":  # _chat reads it (a full URL, a body not a dict)
        chat = _chat(instance, body, kwargs)
        if route is None:  # a path no route names: the whole body, no cap
            chat = chat._replace(input_parts=[body], cap=DEFAULT_MAX_OUTPUT_TOKENS, clampable=False)
        return chat
    model = named if type(named := body.get("model")) is str and named else "unknown"
    parts, n_messages = _parts(body, operation, keys)
    images = len(body["images"]) if body.get("images") else 0
    context = body.get("context")  # token ids: exactly their number
    extra = len(context) if type(context) is list else 0
    if route is None or path == "/v1/systemone":
        # No cap in the request, nothing to clamp: the most a model may produce.
        cap, clampable = (DEFAULT_MAX_OUTPUT_TOKENS, False)
        if route is None:
            parts = [body]
    elif operation == "embeddings":
        cap, clampable = None, False  # no output tokens
    else:
        cap, clampable = _cap(body.get("options"))
    return Request(
        operation,
        model,
        parts,
        n_messages,
        cap,
        clampable,
        stream=bool(kwargs.get("stream")),
        extra_input_tokens=extra + images * IMAGE_TOKENS,
        provider=CLOUD_PROVIDER if _hosted(instance, model) else None,
        cache_writes=False,  # Ollama bills no cache writes
    )


def _hosted(instance: Any, model: str) -> bool:
    """Whether a call goes to Ollama's hosted models: a cloud tag, else the client's
    host is ollama.com (the last answer kept)."""
    if ":" in model and model.rpartition(":")[2].endswith("cloud"):
        return True
    last = _CLOUD_HOSTS[0]
    base = getattr(getattr(instance, "_client", None), "_base_url", None)  # httpx's
    return last[1] if last[0] is base and base is not None else _cloud_host(_base_url(instance))


def read_plain(
    adapter: Any, args: tuple[Any, ...], kwargs: dict[str, Any], instance: Any
) -> tuple[Request | None, int]:
    """The request of a ``Client._request(cls, method, url, ...)`` call on ``instance``
    (the client, whose host says whether the call is hosted), and the UTF-8 bytes
    of its input (``_utf8_bytes(request.input_parts)``, as ``_describe`` walks it)
    when it is a plain chat: the SDK's own (a bare path, a dict body) with messages
    of strings only, no tools, format, images or context, a cap, and a local model;
    -1 for any other. The shared lane's reader (``ProviderAdapter.read_plain``, given
    the client) and read_request's."""
    body = kwargs.get("json")
    if args[2:3] != _CHAT_PATH or type(body) is not dict:  # not the SDK's chat
        return _read_request(instance, args, kwargs, args[2] if len(args) > 2 else None), -1
    messages = body.get("messages")
    if type(messages) is not list or not messages or not body.keys() <= _PLAIN_CHAT:
        return _chat(instance, body, kwargs), -1
    # The plain chat: _chat's rules for it (_cap's common case and _hosted
    # inline), and _list_bytes([messages])'s count: 1 for the outer list, 1 per
    # message, per message 2 per key and the bytes of its keys and values. A
    # message with images, tools or anything but a string is read by _chat.
    size = 1 + len(messages)
    for message in messages:
        if type(message) is not dict or "images" in message:
            return _chat(instance, body, kwargs), -1
        try:
            text = "".join(message) + "".join(message.values())
        except TypeError:  # a value that is not a str (tool calls)
            return _chat(instance, body, kwargs), -1
        size += 2 * len(message) + (len(text) if text.isascii() else len(text.encode()))
    model = body.get("model")
    if type(model) is not str or not model:
        model = "unknown"
    options = body.get("options")
    cap = options.get("num_predict") if type(options) is dict else None
    if type(cap) is not int or body.get("tools"):
        return _chat(instance, body, kwargs), -1
    # _hosted's rules: the client's host (the last answer kept), then the tag.
    try:
        base = instance._client._base_url
    except AttributeError:
        base = None
    last = _CLOUD_HOSTS[0]
    if (last[1] if last[0] is base and base is not None else _cloud_host(_base_url(instance))) or (
        ":" in model and model.rpartition(":")[2].endswith("cloud")
    ):
        return _chat(instance, body, kwargs), -1  # hosted: priced under ollama.cloud
    return _request_of(
        Request,
        (
            "chat",
            model,
            [messages],
            len(messages),
            cap if cap > 0 else None,
            True,  # clampable: options.num_predict
            1,
            bool(kwargs.get("stream")),
            0,
            None,
            None,
            True,  # priced
            False,  # cache_writes: Ollama bills no cache writes
        ),
    ), size


def _chat(instance: Any, body: dict[str, Any], kwargs: dict[str, Any]) -> Request:
    """The SDK's chat (a dict body) read_plain does not read plain (_cap and
    _hosted inline, their rules copied); _read_request hands every other chat here."""
    model = body.get("model")
    if type(model) is not str or not model:
        model = "unknown"
    messages = body.get("messages")
    n_messages, images = 1, 0
    if messages:
        if type(messages) is list:
            for message in messages:
                if type(message) is dict and message.get("images"):
                    images += len(message["images"])
            if images:
                messages = _without_images(messages)
            n_messages = len(messages)
        parts: list[object] = [messages]
    else:
        parts = []
    if tools := body.get("tools"):
        parts.append(tools)
    if schema := body.get("format"):
        parts.append(schema)
    if body.get("images"):
        images += len(body["images"])
    context = body.get("context")
    options = body.get("options")
    value = options.get("num_predict") if type(options) is dict else _MISSING
    if type(value) is int:
        cap, clampable = (value if value > 0 else None), True
    else:
        cap, clampable = _cap(options)
    try:
        base = instance._client._base_url
    except AttributeError:
        base = None
    hosted = (":" in model and model.rpartition(":")[2].endswith("cloud")) or (
        last[1]
        if (last := _CLOUD_HOSTS[0])[0] is base and base is not None
        else _cloud_host(_base_url(instance))
    )
    return _request_of(
        Request,
        (
            "chat",
            model,
            parts,
            n_messages,
            cap,
            clampable,
            1,
            bool(kwargs.get("stream")),
            (len(context) if type(context) is list else 0) + images * IMAGE_TOKENS,
            None,
            CLOUD_PROVIDER if hosted else None,
            True,  # priced
            False,  # cache_writes: Ollama bills no cache writes
        ),
    )


def _read_usage(call: ContainedCall, reply: Any) -> None:
    """Usage and response attributes of a reply or a stream's last chunk."""
    # The counts first: a model reply has them as fields, while asking it for
    # ``usage`` (only /v1/systemone's reply has one) raises inside pydantic.
    try:  # ChatResponse and GenerateResponse fields (None: Ollama omits a count that is 0)
        inp, out = reply.prompt_eval_count, reply.eval_count
    except AttributeError:
        inp = getattr(reply, "prompt_eval_count", None)
        out = getattr(reply, "eval_count", None)
    # Two plain counts, each in set_usage's range (their sum within it: stricter,
    # and a negative one makes ``inp | out`` negative).
    if type(inp) is int is type(out) and (inp | out) >= 0 and inp + out <= MAX_COUNT:
        if type(call) is ContainedCall:  # ContainedCall.set_usage(inp, out)'s rule, copied
            call.cached_tokens = call.cache_write_tokens = call.reasoning_tokens = 0
            call.input_tokens, call.output_tokens, call.usage_seen = inp, out, True
        else:
            call.set_usage(inp, out)
    elif inp is not None or out is not None:
        call.set_usage(inp or 0, out or 0)
    else:
        usage = getattr(reply, "usage", None)  # /v1/systemone: input_tokens, output_tokens
        if usage is not None:
            call.set_usage(
                getattr(usage, "input_tokens", None), getattr(usage, "output_tokens", None)
            )
    attributes = call.pending_attributes
    if attributes is not None:
        model = getattr(reply, "model", None)
        if type(model) is str:
            attributes[GEN_AI_RESPONSE_MODEL] = model
        reason = getattr(reply, "done_reason", None)
        if type(reason) is str:
            attributes[GEN_AI_RESPONSE_FINISH_REASONS] = [reason]


class OllamaAdapter(ProviderAdapter):
    """How ``ollama`` calls read; see the module docs."""

    provider = PROVIDER
    # The SDK's replies of a call not streamed (filled as its hooks go on, by
    # _lane): read and settled as they return, in the shared lane's frame.
    whole_replies: ClassVar[Collection[type]] = _WHOLE
    # The shared lane's reader, given the client (its host says hosted or local).
    read_plain = staticmethod(read_plain)
    plain_reads_instance = True
    # The reply read without a frame of its own (once per call).
    read_reply = staticmethod(_read_usage)

    def read_request(
        self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], method: str
    ) -> Request | None:
        return read_plain(self, args, kwargs, instance)[0]

    def request_attributes(
        self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], request: Request
    ) -> dict[str, Any]:
        attributes: dict[str, Any] = {}
        server_attributes(attributes, getattr(getattr(instance, "_client", None), "base_url", None))
        body = kwargs.get("json")
        options = body.get("options") if type(body) is dict else None
        if type(options) is dict:  # the SDK dumps Options to a dict
            for key in _OPTIONS.keys() & options.keys():
                value = attribute_value(options[key])
                if value is not None:
                    attributes[_OPTIONS[key]] = value
        return attributes

    def rewrite(
        self,
        instance: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        cap: int | None,
        model: str | None,
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        body = dict(kwargs.get("json") or {})
        if cap is not None:
            options = body.get("options")
            body["options"] = {
                **(options if isinstance(options, Mapping) else {}),
                "num_predict": cap,
            }
        if model is not None:
            body["model"] = model
        return args, {**kwargs, "json": body}

    def read_item(self, call: ContainedCall, item: Any) -> None:
        message = getattr(item, "message", None)
        text = getattr(message, "content", None) if message is not None else None
        if text is None:
            text = getattr(item, "response", None)
        if type(text) is str and text:
            call.add_text(text)
        if getattr(item, "done", False):
            _read_usage(call, item)


def _tool(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ToolCall | None:
    """A ``web_search`` / ``web_fetch`` call as a contained tool call (None: not one).

    Asked only for a full URL: the tools name ollama.com in full, model calls
    a path."""
    name = _TOOLS.get(_path(args, kwargs))
    if name is None or ADMITTED.get() is not None:
        return None
    ctx = default_context()
    if ctx is None:
        return None
    return ToolCall(
        name, kwargs.get("json"), attributes={GEN_AI_PROVIDER_NAME: PROVIDER}, context=ctx
    )


def _tool_call(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A call the adapter does not admit (read_request passes the tools): a tool call, or sent."""
    url = args[2] if len(args) > 2 else None
    tool = _tool(instance, args, kwargs) if type(url) is str and "://" in url else None
    if tool is None:
        return wrapped(*args, **kwargs)
    with tool:
        return wrapped(*args, **kwargs)


async def _atool_call(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    url = args[2] if len(args) > 2 else None
    tool = _tool(instance, args, kwargs) if type(url) is str and "://" in url else None
    if tool is None:
        return await wrapped(*args, **kwargs)
    async with tool:
        return await wrapped(*args, **kwargs)


_ADAPTER = OllamaAdapter()
# Model calls go straight to the contained wrapper; what it does not admit, to the tools.
_request = wrapper(_ADAPTER, "_request", otherwise=_tool_call)
_arequest = wrapper(_ADAPTER, "_request", is_async=True, otherwise=_atool_call)
_shared_lane: Callable[[], Callable[..., Any]] | None = getattr(_request, "veronica_lane", None)


def _lane() -> Callable[..., Any]:
    """The shared lane ``_hooks`` puts over ``_request`` (its ``veronica_lane``),
    with the SDK's whole replies known (a type this version lacks is left out: its
    replies settle the general way, by ``_settle``)."""
    from ollama import _types  # imported with the client this hooks

    for name in ("ChatResponse", "GenerateResponse", "EmbedResponse", "EmbeddingsResponse"):
        found = getattr(_types, name, None)
        if isinstance(found, type):
            _WHOLE.add(found)
    return _shared_lane()  # type: ignore[misc]


if _shared_lane is not None:
    _request.veronica_lane = _lane  # type: ignore[attr-defined]


_PATCHES = (
    Hook("Client", "_request", _request, ("cls",), ("stream",)),
    Hook("AsyncClient", "_request", _arequest, ("cls",), ("stream",), True),
)
_GUARDS = (("Client", ("_request", "_request_raw")), ("AsyncClient", ("_request", "_request_raw")))
_HOOKS = SDKHooks(_instruments[0], "ollama._client", _PATCHES, _GUARDS)


class OllamaInstrumentor(GuardedInstrumentor):
    """Contains every model call of the ``ollama`` SDK in the active chain.

    ``instrument()`` raises :class:`~veronica_otel.instrumentors.InstrumentationError`
    when the installed ``ollama`` is outside the tested range or a hook changed;
    nothing is patched and calls in a chain are refused (fail closed).
    """

    _hooks = _HOOKS
    reports_attempts = True

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments
