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
            cap if type(cap) is int or (isinstance(cap, int) and type(cap) is not bool) else None,
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
