"""LLM providers' HTTP requests, read from the wire: which API a request calls, and what.

The vendor guard (:mod:`._vendor_guard`) sees raw HTTP requests, not SDK
calls. This module says what one asks for, whatever client sent it:

- :func:`maybe_api_path` and :func:`route_of`: whether a request path is one
  of a provider's APIs (OpenAI and the many servers that speak its format,
  Anthropic, Gemini and Vertex AI, Bedrock, Cohere, Ollama), and which;
- :func:`read_body`: the body as a :class:`~._adapter.Request` (model, input,
  output cap under any provider's key, choices, stream).

Replies are read by :mod:`._wire_reply`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, NamedTuple
from urllib.parse import unquote

from ._adapter import Request

__all__ = [
    "Route",
    "UNREADABLE",
    "decode_body",
    "maybe_api_path",
    "provider_of",
    "read_body",
    "route_of",
]


class Route(NamedTuple):
    """Which provider API a request path calls.

    Attributes:
        wire: The wire format (``"openai"``, ``"anthropic"``, ``"gemini"``,
            ``"bedrock"``, ``"cohere"``, ``"ollama"``).
        operation: ``gen_ai.operation.name``.
        model: The model the path names (Gemini, Vertex, Bedrock, an Azure
            deployment), else None (the body names it).
        stream: The path asks for a streamed reply.
        priced: Billed by the token, so priceable from the body; False for
            endpoints billed otherwise (images, audio, batches, rerank): those
            are refused under a cost ceiling.
    """

    wire: str
    operation: str
    model: str | None = None
    stream: bool = False
    priced: bool = True


# The last path segment of every API below: a request whose path ends in
# none of these is not one (the guard's cheap test; the regexes confirm).
_TAILS = frozenset(
    (
        "completions",
        "responses",
        "embeddings",
        "messages",
        "complete",
        "batches",
        "generations",
        "edits",
        "variations",
        "speech",
        "transcriptions",
        "translations",
        "videos",
        "converse",
        "converse-stream",
        "invoke",
        "invoke-with-response-stream",
        "chat",
        "generate",
        "embed",
        "rerank",
        "classify",
        "summarize",
    )
)
_GOOGLE_VERBS = {
    "generateContent": ("generate_content", False, True),
    "streamGenerateContent": ("generate_content", True, True),
    "embedContent": ("embeddings", False, True),
    "batchEmbedContents": ("embeddings", False, True),
    "rawPredict": ("chat", False, True),  # Vertex: a partner model's own format
    "streamRawPredict": ("chat", True, True),
    "predict": ("predict", False, False),
    "predictLongRunning": ("predict", False, False),
    "batchGenerateContent": ("generate_content", False, False),
}
_GOOGLE = re.compile(r".*?/(?:publishers/(?P<pub>[^/]+)/)?models/(?P<model>[^/:]+):(?P<verb>\w+)")
_BEDROCK = re.compile(
    r".*?/model/(?P<model>[^/]+)/(?P<verb>converse|converse-stream|invoke|invoke-with-response-stream)"
)
_AZURE = re.compile(r".*?/openai/deployments/(?P<model>[^/]+)/(?P<rest>.+)")
# (pattern, wire, operation, priced), tried in order after the above.
_PATHS: tuple[tuple[re.Pattern[str], str, str, bool], ...] = (
    (re.compile(r".*/chat/completions"), "openai", "chat", True),
    (re.compile(r".*/(?:fim|agents)/completions"), "openai", "chat", True),
    (re.compile(r"(?:.*/)?(?:v1|openai)/responses"), "openai", "chat", True),
    (re.compile(r"(?:.*/)?v1/completions"), "openai", "text_completion", True),
    (re.compile(r"(?:.*/)?v1/embeddings"), "openai", "embeddings", True),
    (re.compile(r"(?:.*/)?v1/messages"), "anthropic", "chat", True),
    (re.compile(r"(?:.*/)?v1/complete"), "anthropic", "text_completion", True),
    (re.compile(r"(?:.*/)?v1/messages/batches"), "anthropic", "batch", False),
    (
        re.compile(
            r"(?:.*/)?v1/(?:images/(?:generations|edits|variations)"
            r"|audio/(?:speech|transcriptions|translations)|videos|batches)"
        ),
        "openai",
        "generate",
        False,
    ),
    (re.compile(r"(?:.*/)?v[12]/chat"), "cohere", "chat", True),
    (re.compile(r"(?:.*/)?v1/generate"), "cohere", "text_completion", True),
    (re.compile(r"(?:.*/)?v[12]/embed"), "cohere", "embeddings", True),
    (re.compile(r"(?:.*/)?v[12]/(?:rerank|classify|summarize)"), "cohere", "rerank", False),
    (re.compile(r"(?:.*/)?api/(?:chat)"), "ollama", "chat", True),
    (re.compile(r"(?:.*/)?api/(?:generate)"), "ollama", "text_completion", True),
    (re.compile(r"(?:.*/)?api/(?:embed|embeddings)"), "ollama", "embeddings", True),
)
# Host (suffix) -> gen_ai.provider.name, for OpenAI-format APIs of other vendors.
_HOST_PROVIDERS = (
    (".openai.azure.com", "azure.ai.openai"),
    (".cognitiveservices.azure.com", "azure.ai.openai"),
    (".services.ai.azure.com", "azure.ai.inference"),
    (".models.ai.azure.com", "azure.ai.inference"),
    ("api.mistral.ai", "mistral_ai"),
    ("api.groq.com", "groq"),
    ("api.deepseek.com", "deepseek"),
    ("api.x.ai", "x_ai"),
    ("api.perplexity.ai", "perplexity"),
    ("api.together.xyz", "together_ai"),
    ("api.together.ai", "together_ai"),
    ("api.fireworks.ai", "fireworks_ai"),
    ("openrouter.ai", "openrouter"),
    ("huggingface.co", "huggingface"),
    ("aiplatform.googleapis.com", "gcp.vertex_ai"),
)
_WIRE_PROVIDERS = {
    "openai": "openai",
    "anthropic": "anthropic",
    "gemini": "gcp.gemini",
    "bedrock": "aws.bedrock",
    "cohere": "cohere",
    "ollama": "ollama",
}
# Output caps, under every provider's name for one (the largest found counts).
_CAP_KEYS = (
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "max_new_tokens",
    "max_gen_len",
    "maxTokens",
    "maxOutputTokens",
)
_NESTED_CAPS = (
    ("generationConfig", ("maxOutputTokens", "max_output_tokens")),
    ("generation_config", ("maxOutputTokens", "max_output_tokens")),
    ("inferenceConfig", ("maxTokens", "max_new_tokens")),
    ("textGenerationConfig", ("maxTokenCount",)),
    ("options", ("num_predict",)),
    ("parameters", ("max_new_tokens", "max_tokens")),
    ("config", ("maxOutputTokens", "max_output_tokens")),
)
_MESSAGE_KEYS = ("messages", "contents", "input", "chat_history")
# Input kept on the provider's side (a previous response, a conversation, a
# cache): not in the body, bounded by the model's context window.
SERVER_SIDE_KEYS = frozenset(
    ("previous_response_id", "conversation", "cachedContent", "cached_content", "container")
)

UNREADABLE: Any = object()
"""A body that cannot be read without consuming it (a generator, a file), or is not JSON."""


def maybe_api_path(path: str) -> bool:
    """The cheap test: could ``path`` be a provider API's? (:func:`route_of` confirms.)"""
    tail = path[path.rfind("/") + 1 :]
    if tail in _TAILS:
        return True
    return ":" in tail and tail[tail.rfind(":") + 1 :] in _GOOGLE_VERBS


def route_of(path: str) -> Route | None:
    """The provider API ``path`` (no query string) calls, or None."""
    tail = path[path.rfind("/") + 1 :]
    if ":" in tail:
        match = _GOOGLE.fullmatch(path)
        if match is None:
            return None
        verb = _GOOGLE_VERBS.get(match["verb"])
        if verb is None:
            return None
        operation, stream, priced = verb
        publisher = match["pub"]
        wire = "anthropic" if publisher == "anthropic" else "gemini"
        if match["verb"] in ("rawPredict", "streamRawPredict") and publisher != "anthropic":
            wire, priced = "openai", False  # another partner's own format: unread
        return Route(wire, operation, unquote(match["model"]), stream, priced)
    bedrock = _BEDROCK.fullmatch(path)
    if bedrock is not None:
        stream = bedrock["verb"].endswith("stream")
        return Route("bedrock", "chat", unquote(bedrock["model"]), stream)
    azure = _AZURE.fullmatch(path)
    model = unquote(azure["model"]) if azure is not None else None
    for pattern, wire, operation, priced in _PATHS:
        if pattern.fullmatch(path):
            return Route(wire, operation, model, False, priced)
    return None


def provider_of(host: str, route: Route | None) -> str:
    """``gen_ai.provider.name`` for a request to ``host`` on ``route``."""
    for suffix, provider in _HOST_PROVIDERS:
        if host == suffix.lstrip(".") or host.endswith(suffix):
            if provider == "gcp.vertex_ai" and route is not None and route.wire == "anthropic":
                return "anthropic"
            return provider
    if host.endswith(".anthropic.com"):
        return "anthropic"
    if host.startswith("bedrock") and host.endswith(".amazonaws.com"):
        return "aws.bedrock"
    if host == "generativelanguage.googleapis.com":
        return "gcp.gemini"
    if host.startswith("api.cohere."):
        return "cohere"
    return _WIRE_PROVIDERS.get(route.wire, "openai") if route is not None else "openai"


def decode_body(raw: object) -> Any:
    """A request body as JSON: a dict, None (no body), or :data:`UNREADABLE`."""
    if raw is None or raw in (b"", ""):
        return None
    if isinstance(raw, Mapping):
        return raw
    if isinstance(raw, (bytes, bytearray, memoryview, str)):
        try:
            value = json.loads(bytes(raw) if isinstance(raw, memoryview) else raw)
        except (ValueError, UnicodeDecodeError):
            return UNREADABLE
        return value if isinstance(value, dict) else UNREADABLE
    return UNREADABLE


def _count(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, float) and value >= 0 and value.is_integer():
        return int(value)
    return None


def output_cap(body: Mapping[str, Any]) -> int | None:
    """The output cap ``body`` sets under any provider's key (the largest), or None."""
    cap: int | None = None
    for key in _CAP_KEYS:
        if key in body:
            found = _count(body[key])
            if found is not None and (cap is None or found > cap):
                cap = found
    for holder, keys in _NESTED_CAPS:
        nested = body.get(holder)
        if isinstance(nested, Mapping):
            for key in keys:
                found = _count(nested.get(key))  # Ollama's -1 / -2 (no limit): None
                if found is not None and (cap is None or found > cap):
                    cap = found
    return cap


def _choices(body: Mapping[str, Any]) -> int:
    found = [_count(body.get("n")), _count(body.get("num_generations"))]
    config = body.get("generationConfig") or body.get("generation_config")
    if isinstance(config, Mapping):
        found.append(_count(config.get("candidateCount")))
    return max([1, *(n for n in found if n is not None)])


def _stream(route: Route, body: Mapping[str, Any]) -> bool:
    if route.stream:
        return True
    value = body.get("stream")
    if route.wire == "ollama" and route.operation != "embeddings":
        return value is not False  # Ollama streams unless told not to
    return value is True


def read_body(route: Route, body: Mapping[str, Any]) -> Request:
    """``body`` sent on ``route`` as the call it describes.

    The cap is None when the body sets none (the guard then reserves the
    model's largest output); embeddings produce no output (cap 0). The whole
    body is the input: its strings bound the input tokens (keys and numbers
    too, an over-count, never an under-count).
    """
    model = body.get("model")
    if not isinstance(model, str) or not model:
        model = route.model or "unknown"
    messages = 1
    for key in _MESSAGE_KEYS:
        value = body.get(key)
        if isinstance(value, list):
            messages = max(1, len(value))
            break
    embeds = route.operation == "embeddings"
    return Request(
        route.operation,
        model,
        body,
        messages,
        0 if embeds else output_cap(body),
        False,
        1 if embeds else _choices(body),
        _stream(route, body),
    )
