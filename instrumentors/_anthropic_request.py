"""Reading and rewriting an ``anthropic`` request: whether it is a
``messages.create`` call, what it asks for (a :class:`~._adapter.Request`),
and the clamp and fallback put into a copy of it."""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

from ._adapter import Request
from ._admit import input_bound
from ._common import not_none
from ._hidden_input import anthropic_hidden, hidden_input_tokens

# The logger users filter on, as before this module was split out of anthropic.py.
_logger = logging.getLogger(__name__.rpartition(".")[0] + ".anthropic")
PROVIDER = "anthropic"
_CREATE = "anthropic.messages.create"
_INPUT_KEYS = ("system", "messages", "tools")


def _is_messages_call(options: Any) -> bool:
    name = getattr(options, "span_name", None)
    if name is not None:
        return bool(name == _CREATE)
    # No span name (e.g. a raw ``client.post``): fall back to the route.
    if str(getattr(options, "method", "")).lower() != "post":
        return False
    return str(getattr(options, "url", "")).split("?", 1)[0].endswith("/v1/messages")


def messages_body(options: Any) -> Mapping[str, Any] | None:
    """The body of a ``messages.create`` call (None: another call, passed through)."""
    try:
        body = options.json_data if _is_messages_call(options) else None
    except Exception:
        _logger.exception("classifying an anthropic request failed; it is not contained")
        return None
    return body if type(body) is dict or isinstance(body, Mapping) else None


# A Request from its fields without NamedTuple's Python-level __new__ (once per call).
_request_of = tuple.__new__  # every Request field, in order (a new field goes here too)
# What a body may hold that the plain lane of read_call does not read (tools,
# server-side input, cache marks): any of them, the general reading.
_GENERAL_KEYS = frozenset(("tools", "container", "mcp_servers", "cache_control"))


def read_call(
    adapter: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], method: str
) -> Request | None:
    """The ``messages.create`` call a ``request(cast_to, options)`` sends (None:
    another call, passed through). ``adapter``'s ``read_request``."""
    return read_plain(adapter, args, kwargs)[0]


def read_plain(
    adapter: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Request | None, int]:
    """:func:`read_call`'s request, in one frame for a plain body (text messages,
    each a dict of strings, a text system prompt, no tools, nothing hidden), and
    the UTF-8 bytes of its input (the input bound's walk,
    ``_utf8_bytes(request.input_parts)``, in this frame); -1 for any other
    body. ``adapter``'s ``read_plain``: the shared lane's reader (``_adapter``)."""
    try:  # the SDK passes both positionally
        options: Any = args[1]
    except IndexError:
        options = kwargs.get("options")
    try:  # messages_body's first test, without its frames
        body = options.json_data if options.span_name == _CREATE else None
    except Exception:
        body = None
    if type(body) is not dict:
        body = messages_body(options)  # no span name, another body: the general test
        return (None if body is None else read_request(body)), -1
    system = body.get("system")
    messages = body.get("messages")
    if (
        type(messages) is not list
        or (system is not None and type(system) is not str)
        or not _GENERAL_KEYS.isdisjoint(body)
    ):
        return read_request(body), -1
    # _utf8_bytes(parts): 1 per part, the system prompt's bytes, 1 for each
    # message and, per message, 2 per key and the bytes of its keys and values.
    # A message that is not a dict of strings (content blocks, a value of
    # another type: a join's TypeError) is read and walked the general way
    # (anthropic_hidden finds nothing here unless a message's content is blocks).
    size = 1 + len(messages)
    if system is not None:
        size += 1 + (len(system) if system.isascii() else len(system.encode()))
    for message in messages:
        if type(message) is not dict or type(message.get("content")) is not str:
            return read_request(body), -1
        try:
            text = "".join(message) + "".join(message.values())
        except TypeError:
            return read_request(body), -1
        size += 2 * len(message) + (len(text) if text.isascii() else len(text.encode()))
    model = body.get("model")
    if type(model) is not str or not model:
        model = str(model or "unknown")
    cap = body.get("max_tokens")
    request = _request_of(
        Request,
        (
            "chat",
            model,
            [messages] if system is None else [system, messages],
            len(messages),
            cap if type(cap) is int else _cap(cap),
            True,
            1,
            body.get("stream") is True,
            0,  # hidden input
            None,  # attributes
            None,  # provider: the adapter's
            True,  # priced
            False,  # cache_writes: nothing marked to cache
        ),
    )
    return request, size


def _cap(cap: object) -> int | None:
    return cap if isinstance(cap, int) and type(cap) is not bool else None


def read_request(body: Mapping[str, Any]) -> Request:
    """The call a ``messages.create`` body describes."""
    model = str(body.get("model") or "unknown")
    messages = body.get("messages")
    parts = list(filter(not_none, map(body.get, _INPUT_KEYS)))  # no comprehension frame
    n_messages = len(messages) if isinstance(messages, list) else 1
    cap = body.get("max_tokens")
    # What the bytes do not show (images, server-side input); cache-write prices
    # only where the request marks blocks to cache.
    extra, server_side, cache_writes = anthropic_hidden(body)
    hidden = 0
    if extra or server_side:
        hidden = hidden_input_tokens(
            PROVIDER, model, input_bound(parts, n_messages), extra, server_side
        )
    return _request_of(
        Request,
        (
            "chat",
            model,
            parts,
            n_messages,
            cap if type(cap) is int else _cap(cap),
            True,
            1,
            body.get("stream") is True,
            hidden,
            None,  # attributes
            None,  # provider: the adapter's
            True,  # priced
            cache_writes,
        ),
    )


def rewritten(options: Any, clamp: int | None, fallback: str | None) -> Any:
    """A copy of ``options`` with the clamp and the fallback model in its body."""
    changes: dict[str, object] = {}
    if clamp is not None:
        changes["max_tokens"] = clamp
    if fallback is not None:
        changes["model"] = fallback
    if not changes:
        return options
    # Every attempt shares the body through shallow copies: a new one, in a copy.
    body = options.json_data
    options = copy.copy(options)
    options.json_data = {**body, **changes}
    return options
