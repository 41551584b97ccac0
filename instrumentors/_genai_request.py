"""Reading and rewriting one ``google-genai`` API request as ``BaseApiClient`` sends it.

Every REST call of the SDK reaches ``BaseApiClient.request*`` as
``(http_method, path, request_dict, http_options)``: the path names the
resource and the method (``models/gemini-2.5-flash:generateContent``,
``publishers/google/models/x:predict``, ``cachedContents``), the dict is the
REST body. So one reader classifies every endpoint, including ones added
after this was written:

- ``generateContent`` / ``streamGenerateContent``: priced; the output cap is
  ``generationConfig.maxOutputTokens`` (thinking counts against it), times
  ``candidateCount``; clampable.
- ``embedContent`` / ``batchEmbedContents`` / ``predict`` of embedding
  instances: priced by input.
- free: reads (``GET``), ``DELETE``, ``countTokens``, ``computeTokens``,
  cancels, operation polls, file and store metadata, ephemeral tokens.
- anything else that writes (images, videos, batches, tuning, caches, file
  search indexing, and any endpoint added later): ``priced=False``, refused
  under a cost ceiling (``_adapter``). So is generation with a grounding tool
  billed per request (Google Search, Maps, enterprise web search).

Input the byte walk cannot see: each inline image adds
:data:`IMAGE_TOKENS` (its bytes are counted too); a ``fileData`` part or a
``cachedContent`` reference is server-side content, bounded by the model's
context window (:data:`CONTEXT_WINDOW` when the price table does not know it).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from operator import is_not
from typing import Any

from veronica_otel._attributes import (
    GEN_AI_REQUEST_CHOICE_COUNT,
    GEN_AI_REQUEST_FREQUENCY_PENALTY,
    GEN_AI_REQUEST_PRESENCE_PENALTY,
    GEN_AI_REQUEST_SEED,
    GEN_AI_REQUEST_STOP_SEQUENCES,
    GEN_AI_REQUEST_TEMPERATURE,
    GEN_AI_REQUEST_TOP_K,
    GEN_AI_REQUEST_TOP_P,
)
from veronica_otel._pricing import default_price_table

from ._adapter import Request

__all__ = ["CONTEXT_WINDOW", "IMAGE_TOKENS", "read", "rewrite"]

#: Most tokens one image is billed (Gemini 3 ``media_resolution`` high: 1,120;
#: Gemini 2.x: 258 per 768-pixel tile, whose base64 bytes bound it anyway).
IMAGE_TOKENS = 1_120
#: The largest Gemini context window (2,097,152 tokens, Gemini 1.5 Pro).
CONTEXT_WINDOW = 2_097_152

_GENERATE = frozenset(("generateContent", "streamGenerateContent"))
_EMBED = frozenset(("embedContent", "batchEmbedContents"))
_FREE_VERBS = frozenset(
    ("countTokens", "computeTokens", "cancel", "fetchPredictOperation", "download", "register")
)
# Collections whose create is free (metadata only): the last path part, no verb.
_FREE_CREATES = frozenset(("files", "fileSearchStores", "auth_tokens", "documents"))
_BILLED_TOOLS = ("googleSearch", "googleSearchRetrieval", "googleMaps", "enterpriseWebSearch")
_INPUT_KEYS = ("systemInstruction", "contents", "tools", "toolConfig")
_NO_CONFIG: Mapping[str, Any] = {}  # shared, never written
_PRESENT = partial(is_not, None)  # filter's test, in C: the value is not None
# A Request from its fields without NamedTuple's Python-level __new__ (once per call).
_request_of = tuple.__new__  # every Request field, in order (a new field goes here too)
_PLAIN = {
    "temperature": GEN_AI_REQUEST_TEMPERATURE,
    "topP": GEN_AI_REQUEST_TOP_P,
    "topK": GEN_AI_REQUEST_TOP_K,
    "stopSequences": GEN_AI_REQUEST_STOP_SEQUENCES,
    "seed": GEN_AI_REQUEST_SEED,
    "presencePenalty": GEN_AI_REQUEST_PRESENCE_PENALTY,
    "frequencyPenalty": GEN_AI_REQUEST_FREQUENCY_PENALTY,
}


def _split(path: str) -> tuple[str, str, str]:
    """``(prefix, name, verb)`` of a path: ``models/x:generateContent?alt=sse``
    -> ``("models/", "x", "generateContent")``."""
    path = path.split("?", 1)[0]
    prefix, _, last = path.rpartition("/")
    name, _, verb = last.partition(":")
    return (prefix + "/" if prefix else ""), name, verb


def read(
    http_method: str, path: str, body: Any, server: dict[str, Any] | None = None
) -> Request | None:
    """The request one ``BaseApiClient.request*`` call sends; None when it is free.

    ``server``: span attributes of the client's endpoint, for a priced call.
    """
    method = http_method.lower()
    if method in ("get", "delete") or (type(body) is not dict and not isinstance(body, Mapping)):
        return None
    name, _, verb = path.partition("?")[0].rpartition("/")[2].partition(":")  # _split's
    if verb in _GENERATE:
        return _generate(name, verb, body, server)
    if verb in _EMBED or (verb == "predict" and _embedding_instances(body)):
        return _embed(name, verb, body, server)
    if verb in _FREE_VERBS or (not verb and method == "post" and name in _FREE_CREATES):
        return None
    if method == "patch":
        if "cachedContents/" not in path:
            return None  # a model's or a store's metadata (a cache's TTL is billed storage)
        name = "cachedContents"
    model = name if verb else str(body.get("model") or body.get("baseModel") or "unknown")
    return Request(verb or name, model.rpartition("/")[2], body, attributes=server, priced=False)


def _embedding_instances(body: Mapping[str, Any]) -> bool:
    instances = body.get("instances")
    return (
        isinstance(instances, list)
        and bool(instances)
        and all(isinstance(i, Mapping) and "content" in i and "prompt" not in i for i in instances)
    )


def _embed(
    model: str, verb: str, body: Mapping[str, Any], server: dict[str, Any] | None
) -> Request:
    if verb == "batchEmbedContents":
        parts: Any = body.get("requests") or []
    elif verb == "predict":
        parts = body.get("instances") or []
    else:
        parts = [body.get("content")]
    n = len(parts) if isinstance(parts, list) else 1
    return Request("embeddings", model, parts, n, None, False, 1, False, 0, server)


def _generate(
    model: str, verb: str, body: Mapping[str, Any], server: dict[str, Any] | None
) -> Request:
    get = body.get
    config = get("generationConfig")
    if type(config) is not dict and (config is None or not isinstance(config, Mapping)):
        config = _NO_CONFIG
    cap = config.get("maxOutputTokens")
    cap = cap if type(cap) is int and cap >= 0 else None
    choices = config.get("candidateCount")
    choices = choices if type(choices) is int and choices > 1 else 1
    contents = get("contents")
    parts = list(filter(_PRESENT, map(get, _INPUT_KEYS)))  # the inputs sent, in C
    attributes = server
    if len(config) > (cap is not None):  # more than the cap: sampling parameters
        found = _attributes(config)
        if found:
            attributes = found if server is None else {**server, **found}
    tools = get("tools")
    priced = not (tools and isinstance(tools, list) and any(_billed_tool(t) for t in tools))
    return _request_of(
        Request,
        (
            "generate_content",
            model,
            parts,
            len(contents) if isinstance(contents, list) else 1,
            cap,
            True,
            choices,
            verb == "streamGenerateContent",
            _unseen_input(model, body),
            attributes,
            None,
            priced,
            True,
        ),
    )


def _billed_tool(tool: object) -> bool:
    return isinstance(tool, Mapping) and any(key in tool for key in _BILLED_TOOLS)


def _unseen_input(model: str, body: Mapping[str, Any]) -> int:
    """Tokens of input the byte walk cannot see (see the module docs)."""
    images = 0
    server_side = body.get("cachedContent") is not None
    contents = body.get("contents") or ()
    system = body.get("systemInstruction")
    if system is not None:
        contents = (system, *contents)
    for content in contents:
        if type(content) is dict or (content is not None and isinstance(content, Mapping)):
            parts = content.get("parts")
        else:
            continue
        for part in parts if type(parts) is list or isinstance(parts, list) else ():
            if type(part) is dict:
                if "text" in part:
                    continue  # a text part carries nothing else
            elif not isinstance(part, Mapping):
                continue
            if "fileData" in part:
                server_side = True
            inline = part.get("inlineData")
            if (type(inline) is dict or isinstance(inline, Mapping)) and str(
                inline.get("mimeType", "")
            ).startswith("image/"):
                images += 1
    extra = images * IMAGE_TOKENS
    if server_side:
        prices = default_price_table().lookup(None, model)
        window = prices.context_window if prices is not None else None
        extra += window or CONTEXT_WINDOW
    return extra


def _attributes(config: Mapping[str, Any]) -> dict[str, Any] | None:
    found = {_PLAIN[key]: config[key] for key in _PLAIN.keys() & config.keys()}
    if "candidateCount" in config:
        found[GEN_AI_REQUEST_CHOICE_COUNT] = config["candidateCount"]
    return found or None


def rewrite(
    path: str, body: Mapping[str, Any], cap: int | None, model: str | None
) -> tuple[str, dict[str, Any]]:
    """``path`` and a copy of ``body`` with the output cap and the model replaced."""
    new = dict(body)
    if cap is not None:
        config = new.get("generationConfig")
        config = config if isinstance(config, Mapping) else {}
        new["generationConfig"] = {**config, "maxOutputTokens": cap}
    if model is not None:
        prefix, _, verb = _split(path)
        query = path.partition("?")[2]
        path = f"{prefix}{model}:{verb}" + (f"?{query}" if query else "")
        requests = new.get("requests")
        if isinstance(requests, list):  # batchEmbedContents names the model in each
            new["requests"] = [
                {**r, "model": f"models/{model}"} if isinstance(r, Mapping) else r for r in requests
            ]
    return path, new
