"""The GenAI span attributes of an ``anthropic`` call, for the span we open ourselves.

With its tracing on, ``anthropic`` describes the call on its own span and we
add only ``veronica.*``. With it off, our ``chat {model}`` span stands in for
it and carries the GenAI semantic conventions' Recommended attributes: the
request parameters, ``server.*``, and the response's id, model and finish
reasons. Written into the call's pending attributes (set when the span ends).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from veronica_otel._attributes import (
    GEN_AI_REQUEST_STOP_SEQUENCES,
    GEN_AI_REQUEST_TEMPERATURE,
    GEN_AI_REQUEST_TOP_K,
    GEN_AI_REQUEST_TOP_P,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_RESPONSE_ID,
    GEN_AI_RESPONSE_MODEL,
)

from ._common import _SERVER, attribute_value, client_attributes

__all__ = ["call_attributes", "response_attributes"]

_PLAIN = {
    "temperature": GEN_AI_REQUEST_TEMPERATURE,
    "top_p": GEN_AI_REQUEST_TOP_P,
    "top_k": GEN_AI_REQUEST_TOP_K,
    "stop_sequences": GEN_AI_REQUEST_STOP_SEQUENCES,
}
_KEYS = frozenset(_PLAIN)


def call_attributes(
    adapter: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], request: Any
) -> dict[str, Any]:
    """What a ``request(cast_to, options)`` says on the span (its sampling
    parameters and the server it goes to): ``adapter``'s ``request_attributes``."""
    options: Any = args[1] if len(args) > 1 else kwargs.get("options")
    body = options.json_data
    attributes: dict[str, Any] = {}
    if not _KEYS.isdisjoint(body):  # usually none of them
        for key in _KEYS.intersection(body):
            value = attribute_value(body[key])
            if value is not None:
                attributes[_PLAIN[key]] = value
    base_url, last = getattr(instance, "_base_url", None), _SERVER[0]
    if base_url is not None and last[0] is base_url:  # client_attributes' hit, inline
        attributes.update(last[1])
    else:
        client_attributes(attributes, instance)
    return attributes


def response_attributes(attributes: dict[str, Any], kind: object, data: Mapping[str, Any]) -> None:
    """Add what one payload says: a whole message, ``message_start`` or ``message_delta``."""
    message: object = data
    if kind == "message_start":
        message = data.get("message")
    elif kind == "message_delta":
        message = data.get("delta")
    if type(message) is not dict and not isinstance(message, Mapping):  # no ABC frame
        return
    if type(value := message.get("id")) is str and value:
        attributes[GEN_AI_RESPONSE_ID] = value
    if type(value := message.get("model")) is str and value:
        attributes[GEN_AI_RESPONSE_MODEL] = value
    if type(value := message.get("stop_reason")) is str and value:
        attributes[GEN_AI_RESPONSE_FINISH_REASONS] = [value]
