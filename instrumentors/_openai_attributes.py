"""The GenAI span attributes of an ``openai`` call, read from its request and its payloads.

Our call span replaces the official contrib instrumentor's
(``opentelemetry-instrumentation-openai-v2``), so it carries every attribute
that one sets for the same call: the request parameters, ``server.*``, and
the response's id, model, finish reasons, service tier and fingerprint.
Everything here runs only when our own span records, and writes into the
call's pending attributes (set on the span in one SDK call when it ends).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from veronica_otel._attributes import (
    GEN_AI_EMBEDDINGS_DIMENSION_COUNT,
    GEN_AI_OUTPUT_TYPE,
    GEN_AI_REQUEST_CHOICE_COUNT,
    GEN_AI_REQUEST_ENCODING_FORMATS,
    GEN_AI_REQUEST_FREQUENCY_PENALTY,
    GEN_AI_REQUEST_PRESENCE_PENALTY,
    GEN_AI_REQUEST_SEED,
    GEN_AI_REQUEST_STOP_SEQUENCES,
    GEN_AI_REQUEST_TEMPERATURE,
    GEN_AI_REQUEST_TOP_P,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_RESPONSE_ID,
    GEN_AI_RESPONSE_MODEL,
)

from ._common import _SERVER, attribute_value, client_attributes
from ._openai_request import _body

__all__ = ["call_attributes", "response_attributes", "stream_attributes"]

# Body key -> attribute, copied as is when the value is a primitive.
_PLAIN = {
    "temperature": GEN_AI_REQUEST_TEMPERATURE,
    "top_p": GEN_AI_REQUEST_TOP_P,
    "presence_penalty": GEN_AI_REQUEST_PRESENCE_PENALTY,
    "frequency_penalty": GEN_AI_REQUEST_FREQUENCY_PENALTY,
    "seed": GEN_AI_REQUEST_SEED,
    "dimensions": GEN_AI_EMBEDDINGS_DIMENSION_COUNT,
}
_SPECIAL = frozenset(("stop", "n", "response_format", "service_tier", "encoding_format"))
_KEYS = frozenset(_PLAIN) | _SPECIAL


def call_attributes(
    adapter: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], request: Any
) -> dict[str, Any]:
    """What a Stainless ``request(cast_to, options)`` says on the span (its
    parameters and the server it goes to): ``adapter``'s ``request_attributes``."""
    attributes: dict[str, Any] = {}
    options: Any = args[1] if len(args) > 1 else kwargs.get("options")
    body = options.json_data
    if type(body) is not dict or options.extra_json is not None:
        body = _body(options)  # the user's extra_body merged over it
    if not _KEYS.isdisjoint(body):  # usually none of them
        _parameters(attributes, body)
    base_url, last = getattr(instance, "_base_url", None), _SERVER[0]
    if base_url is not None and last[0] is base_url:  # client_attributes' hit, inline
        attributes.update(last[1])
    else:
        client_attributes(attributes, instance)
    return attributes


def _parameters(attributes: dict[str, Any], body: Mapping[str, Any]) -> None:
    for key in _KEYS.intersection(body):
        value = body[key]
        if value is None:
            continue
        if key in _PLAIN:
            value = attribute_value(value)
            if value is not None:
                attributes[_PLAIN[key]] = value
        elif key == "stop":
            stop = [value] if type(value) is str else attribute_value(value)
            if stop is not None:
                attributes[GEN_AI_REQUEST_STOP_SEQUENCES] = stop
        elif key == "n":
            if type(value) is int and value != 1:
                attributes[GEN_AI_REQUEST_CHOICE_COUNT] = value
        elif key == "response_format":
            kind = value.get("type") if isinstance(value, Mapping) else value
            if type(kind) is str:
                attributes[GEN_AI_OUTPUT_TYPE] = "json" if kind.startswith("json") else kind
        elif key == "service_tier":
            if type(value) is str and value != "auto":
                attributes["openai.request.service_tier"] = value
        elif type(value) is str:  # encoding_format
            attributes[GEN_AI_REQUEST_ENCODING_FORMATS] = [value]


def response_attributes(
    attributes: dict[str, Any], data: Mapping[str, Any], whole: bool = True
) -> None:
    """Add what a whole reply says (chat, completions, embeddings, responses);
    ``whole`` False: only what names it (a stream's first chunk)."""
    # Four keys read one by one: a loop over pairs costs twice as much per call.
    get = data.get
    if type(value := get("id")) is str and value:
        attributes[GEN_AI_RESPONSE_ID] = value
    if type(value := get("model")) is str and value:
        attributes[GEN_AI_RESPONSE_MODEL] = value
    if type(value := get("service_tier")) is str and value:
        attributes["openai.response.service_tier"] = value
    if type(value := get("system_fingerprint")) is str and value:
        attributes["openai.response.system_fingerprint"] = value
    if not whole:
        return
    choices = get("choices")
    if type(choices) is list and choices:
        if len(choices) == 1:  # the common case, without a comprehension's frame
            choice = choices[0]
            reason = choice.get("finish_reason") if type(choice) is dict else None
            reasons = [reason] if type(reason) is str else _reasons(choices)
        else:
            reasons = _reasons(choices)
        if reasons:
            attributes[GEN_AI_RESPONSE_FINISH_REASONS] = reasons
    elif type(status := get("status")) is str and "output" in data:  # the Responses API
        attributes[GEN_AI_RESPONSE_FINISH_REASONS] = [status]
    elif type(items := get("data")) is list and items:  # embeddings
        dimensions = _dimensions(items[0])
        if dimensions:
            attributes[GEN_AI_EMBEDDINGS_DIMENSION_COUNT] = dimensions


def _reasons(choices: list[Any]) -> list[str]:
    return [
        reason
        for choice in choices
        if isinstance(choice, Mapping) and type(reason := choice.get("finish_reason")) is str
    ]


def _dimensions(item: object) -> int | None:
    """An embedding's length: a list of floats, or base64 of float32s (the SDK's default)."""
    vector = item.get("embedding") if isinstance(item, Mapping) else None
    if type(vector) is list:
        return len(vector)
    if type(vector) is str:
        padding = len(vector) - len(vector.rstrip("="))
        return (len(vector) * 3 // 4 - padding) // 4
    return None


def stream_attributes(attributes: dict[str, Any], data: Mapping[str, Any]) -> None:
    """Add what one stream chunk or event says (the first one names the reply)."""
    kind = data.get("type")
    if type(kind) is str:  # a Responses event: the final one carries the whole response
        response = data.get("response")
        if isinstance(response, Mapping) and kind.startswith("response.") and "id" in response:
            response_attributes(attributes, response)
        return
    if GEN_AI_RESPONSE_ID not in attributes:
        response_attributes(attributes, data, False)
    for choice in data.get("choices") or ():
        if isinstance(choice, Mapping) and type(reason := choice.get("finish_reason")) is str:
            reasons = attributes.setdefault(GEN_AI_RESPONSE_FINISH_REASONS, [])
            reasons.append(reason)
