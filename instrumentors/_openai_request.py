"""Reading and rewriting an ``openai`` request (or one of an SDK generated the
same way and speaking its wire format, such as ``groq``): its route, body,
output cap and choices, read into a :class:`~._adapter.Request`, the clamp and
fallback written into a copy of it, and a peer instrumentor's span for it."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation import _SPAN_KEY

from veronica_otel._attributes import (
    CHAIN_ID,
    GEN_AI_AGENT_NAME,
    GEN_AI_OPERATION_NAME,
    LLM_REQUEST_TYPE,
)

from ._adapter import Request
from ._admit import input_bound
from ._common import not_none
from ._hidden_input import hidden_input_tokens, openai_hidden

# path suffix -> (GenAI operation, input keys, output-cap keys, the first is the one we
# set). Tool definitions are rendered into the prompt and billed as input tokens.
_ROUTES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "/chat/completions": (
        "chat",
        ("messages", "tools", "functions"),
        ("max_completion_tokens", "max_tokens"),
    ),
    "/responses": ("chat", ("instructions", "input", "tools"), ("max_output_tokens",)),
    "/completions": ("text_completion", ("prompt", "suffix"), ("max_tokens",)),
    "/embeddings": ("embeddings", ("input",), ()),
}


_Route = tuple[str, tuple[str, ...], tuple[str, ...]]
_ROUTE_CACHE: dict[str, _Route | None] = {}
_ROUTE_CACHE_MAX = 256  # URLs are the SDK's paths; a bound in case a caller builds many


def _route(options: Any) -> _Route | None:
    method = options.method
    if method != "post" and str(method).lower() != "post":
        return None
    url = options.url
    try:
        return _ROUTE_CACHE[url]
    except (KeyError, TypeError):  # new, or not a str
        pass
    path = str(url).split("?", 1)[0]
    found: _Route | None = None
    for suffix, route in _ROUTES.items():  # "/chat/completions" is tried first
        if path.endswith(suffix):
            found = route
            break
    if type(url) is str:
        if len(_ROUTE_CACHE) >= _ROUTE_CACHE_MAX:
            _ROUTE_CACHE.clear()
        _ROUTE_CACHE[url] = found
    return found


def _body(options: Any) -> dict[str, Any]:
    # What goes on the wire: the user's extra_body is merged over the body.
    json_data = options.json_data
    extra = options.extra_json
    if type(json_data) is dict and extra is None:
        return json_data  # the common case: read-only here, so no copy
    json_data = json_data if _is_mapping(json_data) else {}
    extra = extra if _is_mapping(extra) else {}
    return {**json_data, **extra}


def _set_body(options: Any, key: str, value: object) -> None:
    # The SDK shares one json_data dict across attempts and merges the user's
    # extra_body over it: replace both, never mutate the caller's dicts.
    if isinstance(options.json_data, Mapping):
        options.json_data = {**options.json_data, key: value}
    if isinstance(options.extra_json, Mapping) and key in options.extra_json:
        options.extra_json = {**options.extra_json, key: value}


def _requested_cap(body: Mapping[str, Any], cap_keys: tuple[str, ...]) -> tuple[int | None, str]:
    """The output cap the request sets and the key it sets it under."""
    for key in cap_keys:
        value = body.get(key)
        if value is not None and (
            type(value) is int or (isinstance(value, int) and not isinstance(value, bool))
        ):
            return value, key
    return None, cap_keys[0] if cap_keys else ""


def _choices(body: Mapping[str, Any], operation: str) -> int:
    if ("n" not in body and "best_of" not in body) or operation == "embeddings":
        return 1
    # Legacy completions generate ``best_of`` candidates server-side and bill them all.
    most = 1
    for key in ("n", "best_of"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > most:
            most = value
    return most


def _prompts(prompt: object) -> int:
    """Completions a legacy ``prompt`` asks for: one per string or token list of a list."""
    if type(prompt) is not list or not prompt:
        return 1
    if all(type(item) is int for item in prompt):
        return 1  # one prompt, as tokens
    return len(prompt)


# A Request from its fields without NamedTuple's Python-level __new__ (once per call).
_request_of = tuple.__new__  # every Request field, in order (a new field goes here too)


# What a chat body may hold that the plain chat lane of read_request does not
# read (tools, choices, a prompt, server-side input): any of them, the general lane.
_GENERAL_KEYS = frozenset(
    (
        *("tools", "functions", "n", "best_of"),
        *("prompt", "input", "previous_response_id", "conversation"),
    )
)
_CHAT = _ROUTES["/chat/completions"]
_UNSEEN = object()


def read_request(
    adapter: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], method: str
) -> Request | None:
    """The call a Stainless ``request(cast_to, options, stream=...)`` describes (the
    SDK's ``FinalRequestOptions``); None when it is not a billable call of a route
    we know (passed through). ``adapter``'s ``read_request``."""
    return read_plain(adapter, args, kwargs)[0]


def read_plain(
    adapter: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Request | None, int]:
    """:func:`read_request`'s request, and the UTF-8 bytes of its input when it is a
    plain chat (messages only, each a dict of strings, one choice: the input
    bound's walk, ``_utf8_bytes(request.input_parts)``, in this frame); -1 for
    any other. ``adapter``'s ``read_plain``: the shared lane's reader (``_adapter``)."""
    options: Any = args[1] if len(args) > 1 else kwargs.get("options")
    url = options.url
    route: Any
    if options.method == "post" and type(url) is str:  # _route's cache hit, without its frame
        route = _ROUTE_CACHE.get(url, _UNSEEN)
        if route is _UNSEEN:
            route = _route(options)
    else:
        route = _route(options)
    if route is None:
        return None, -1
    body = options.json_data
    if type(body) is not dict or options.extra_json is not None:
        body = _body(options)
    model = body.get("model")
    if type(model) is not str or not model:
        model = str(model or "unknown")
    stream = True if kwargs.get("stream") else body.get("stream") is True
    if route is not _CHAT or not _GENERAL_KEYS.isdisjoint(body):
        return _general(adapter.provider, route, body, model, stream), -1
    # A plain chat: messages only, one choice. Its hidden input (openai_hidden)
    # can only be in a message whose content is not a string.
    messages = body.get("messages")
    n_messages = 1
    size = -1
    if type(messages) is list:
        n_messages = len(messages)
        # _utf8_bytes([messages]): 1 for the outer list, 1 per message, and per
        # message 2 per key and the bytes of its keys and values; a value that
        # is not a str (a join's TypeError) leaves the walk to the general way.
        size = 1 + n_messages
        for message in messages:
            if type(message) is not dict or type(message.get("content")) is not str:
                return _general(adapter.provider, route, body, model, stream), -1
            if size >= 0:
                try:
                    text = "".join(message) + "".join(message.values())
                except TypeError:
                    size = -1
                    continue
                size += 2 * len(message) + (len(text) if text.isascii() else len(text.encode()))
    cap = body.get("max_completion_tokens")
    if cap is None:
        cap = body.get("max_tokens")
    if cap is not None and type(cap) is not int:
        cap = _requested_cap(body, _CHAT[2])[0]
    request = _request_of(
        Request,
        (
            "chat",
            model,
            [] if messages is None else [messages],
            n_messages,
            cap,
            True,  # clampable
            1,  # choices
            stream,
            0,  # hidden input
            None,  # attributes
            None,  # provider: the adapter's
            True,  # priced
            True,  # cache_writes
        ),
    )
    return request, size


def _general(
    provider: str, route: _Route, body: dict[str, Any], model: str, stream: bool
) -> Request:
    """:func:`read_request` for any body of a known route."""
    operation, input_keys, cap_keys = route
    parts = list(filter(not_none, map(body.get, input_keys)))  # no comprehension frame
    messages = body.get("messages")
    n_messages = len(messages) if type(messages) is list else 1
    choices = _choices(body, operation) if "n" in body or "best_of" in body else 1
    hidden = 0
    if operation != "embeddings":  # what the bytes do not show: images, server-side input
        extra, server_side = openai_hidden(body, model)
        if extra or server_side:
            bound = input_bound(parts, n_messages)
            hidden = hidden_input_tokens(provider, model, bound, extra, server_side)
        if operation == "text_completion":  # each prompt of a list is a completion of its own
            choices *= _prompts(body.get("prompt"))
    cap = None
    if cap_keys:  # a plain int under one key, the first set: the common case
        cap = body.get(cap_keys[0])
        if cap is None and len(cap_keys) > 1:
            cap = body.get(cap_keys[1])
        if cap is not None and type(cap) is not int:
            cap = _requested_cap(body, cap_keys)[0]
    return _request_of(
        Request,
        (
            operation,
            model,
            parts,
            n_messages,
            cap,
            bool(cap_keys),
            choices,
            stream,
            hidden,
            None,  # attributes
            None,  # provider: the adapter's
            True,  # priced
            True,  # cache_writes
        ),
    )


def rewritten(options: Any, clamp: int | None, fallback: str | None) -> Any:
    """A copy of ``options`` with the clamp and the fallback model in its body."""
    route = _route(options)
    body = _body(options)
    options = copy.copy(options)  # the SDK's own object, shared with the caller's retries
    if clamp is not None and route is not None:
        # Into the key the caller used (chat has two names for it): never add the other.
        _set_body(options, _requested_cap(body, route[2])[1], clamp)
    if fallback is not None:
        _set_body(options, "model", fallback)
    return options


def _peer_span(operation: str, agent: str | None, current: otel_context.Context) -> Any:
    """A peer GenAI instrumentor's span for this very call, when one is current.

    The official ``opentelemetry-instrumentation-openai-v2``, OpenLLMetry and
    openlit wrap ``create()``, above our hook: their CLIENT span for the same
    operation is current here. Our attributes go on it and it stays theirs
    to end, so the call is described once. Anything else (no span, another
    operation, a span already used for one of our calls): None, our own span.
    """
    span: Any = current.get(_SPAN_KEY)  # trace.get_current_span(current), without its frames
    if span is None or span is _NOT_PEER[0]:
        return None
    if getattr(span, "kind", None) is not trace.SpanKind.CLIENT:
        _NOT_PEER[0] = span  # a span's kind never changes (a chain's span: every call)
        return None
    if not span.is_recording():
        return None
    attributes = getattr(span, "attributes", None) or {}
    if CHAIN_ID in attributes:
        return None
    scope = getattr(span, "instrumentation_scope", None)
    if scope is not None and scope.name.startswith("veronica_otel"):
        return None
    if attributes.get(GEN_AI_OPERATION_NAME, attributes.get(LLM_REQUEST_TYPE)) != operation:
        return None
    if agent is not None:
        span.set_attribute(GEN_AI_AGENT_NAME, agent)
    return span


# The last current span found not to be a CLIENT span: never a peer's (held, so
# its identity is not reused while it is remembered).
_NOT_PEER: list[object] = [None]


def _is_mapping(value: object) -> bool:
    # Payloads are plain dicts: skip the ABC check (slow next to the rest).
    return type(value) is dict or isinstance(value, Mapping)
