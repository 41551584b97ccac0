"""Reading a ``mistralai`` request from the wire: its route, body and worst case.

The adapter hooks ``BaseSDK.do_request``, below every endpoint of the SDK, so
what it sees is the ``httpx2.Request`` about to be sent: the operation comes
from the request path, the model, cap and input from the JSON body.

Every POST falls in one of three groups:

- token-priced (:data:`_PRICED`): chat, FIM, agents completions, embeddings,
  moderations and classifications, contained at their worst case;
- free (:data:`_FREE`): administration (files, agents and libraries set up,
  job cancellation, observability searches, workflow deployments and
  schedules): passed through;
- anything else (OCR, batch jobs, conversations, the Responses API, audio,
  workflow executions, and any endpoint a later SDK adds): its cost cannot be
  bounded from the request (pages, minutes, a server-side conversation or
  batch file), so it is admitted under a model name no price table knows
  (``"v1/ocr:mistral-ocr-latest"``): refused under a cost ceiling, naming the
  endpoint, counted as a step without one.

Input the body does not hold is added at its documented worst case: an
image at 4,160 tokens (mistral-common's image encoder: at most 1024 px in
16 px patches, 64 x 64 tokens plus one break token per row), a document, an
agent's server-side instructions or an unpriced endpoint's server-side
input at :data:`CONTEXT_BOUND`.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

__all__ = ["CONTEXT_BOUND", "Route", "body_of", "route_of", "unpriced_model"]

# The largest context window of Mistral's models (Codestral, Devstral: 256k):
# what server-side input (instructions, history, a document) can add at most.
CONTEXT_BOUND = 256_000
_IMAGE_TOKENS = 4_160
_DOCUMENT_KEYS = (b'"document_url"', b'"file_id"', b'"input_audio"')


class Route(NamedTuple):
    """How one endpoint's request reads.

    Attributes:
        operation: ``gen_ai.operation.name``.
        inputs: Body keys sent as input (their bytes bound the input tokens).
        cap: Body key of the output cap (None: the endpoint generates no text).
        model_key: Body key naming what is priced (``agent_id`` for agents).
        unpriced: Label of an endpoint whose cost the request cannot bound
            (None: token-priced).
        server_side: Input held by the server is added (an agent's instructions).
    """

    operation: str
    inputs: tuple[str, ...]
    cap: str | None = None
    model_key: str = "model"
    unpriced: str | None = None
    server_side: bool = False


_CHAT_INPUTS = ("messages", "tools", "prediction", "response_format")
_PRICED: dict[str, Route] = {
    "/v1/chat/completions": Route("chat", _CHAT_INPUTS, "max_tokens"),
    "/v1/fim/completions": Route("text_completion", ("prompt", "suffix"), "max_tokens"),
    "/v1/agents/completions": Route("chat", _CHAT_INPUTS, "max_tokens", "agent_id", None, True),
    "/v1/embeddings": Route("embeddings", ("input",)),
    "/v1/moderations": Route("moderation", ("input",)),
    "/v1/chat/moderations": Route("moderation", ("input",)),
    "/v1/classifications": Route("classification", ("input",)),
    "/v1/chat/classifications": Route("classification", ("input",)),
}
# Administration that bills nothing (searched at the end of the path).
_FREE = re.compile(
    r"/v1/(?:files|agents(?:/[^/]+(?:/.*)?)?|libraries|service-accounts|webhooks|triggers"
    r"|batch/jobs/[^/]+/cancel|fine_tuning/models/[^/]+/archive|connectors(?:/.*)?"
    r"|context/search-indexes|responses/input_tokens|workflows/[^/]+/tags"
    r"|observability/(?!.*live-judging).*"
    r"|workflows/(?:deployments|schedules)(?:/[^/]+(?:/(?:unharden|restart|start|stop|pause|resume))?)?"
    r"|workflows/executions(?:/[^/]+)?/(?:cancel|terminate))$"
    r"|/v2/(?:prompts|skills)(?:/.*)?$"
)
_VERSIONED = re.compile(r"/(v\d+)/([^/]+)")
_CACHE: dict[str, Route | None] = {}
_CACHE_MAX = 256  # paths carry ids: a bound, cleared when reached


def route_of(path: str) -> Route | None:
    """The route of a POST to ``path``; None when it bills nothing."""
    try:
        return _CACHE[path]
    except KeyError:
        pass
    route = _find(path)
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.clear()
    _CACHE[path] = route
    return route


def _find(path: str) -> Route | None:
    for suffix, route in _PRICED.items():
        if path.endswith(suffix):
            return route
    if _FREE.search(path):
        return None
    versioned = _VERSIONED.search(path)
    label = f"{versioned[1]}/{versioned[2]}" if versioned else "unknown"
    return Route(label.rsplit("/", 1)[-1], ("input", "inputs", "messages"), None, "model", label)


def body_of(request: Any) -> dict[str, Any]:
    """The request's JSON body ({} when it is not JSON: multipart, empty)."""
    if "json" not in request.headers.get("content-type", ""):
        return {}
    try:
        body = json.loads(request.content)
    except (ValueError, RuntimeError):  # not JSON, or a stream not read (httpx2's RequestNotRead)
        return {}
    return body if type(body) is dict else {}


def unpriced_model(route: Route, body: dict[str, Any]) -> str:
    """The name an unpriced endpoint is admitted under: no price table knows it."""
    model = body.get(route.model_key)
    return f"{route.unpriced}:{model}" if type(model) is str and model else str(route.unpriced)


def extra_input(route: Route, content: bytes) -> int:
    """Input tokens the body's bytes do not show (images, documents, server-side)."""
    extra = CONTEXT_BOUND if route.server_side or route.unpriced is not None else 0
    if route.cap is None:
        return extra
    images = content.count(b'"image_url"')
    if images:  # {"type": "image_url", "image_url": ...}: the key and the type
        extra += (images + 1) // 2 * _IMAGE_TOKENS
    if extra < CONTEXT_BOUND and any(key in content for key in _DOCUMENT_KEYS):
        extra += CONTEXT_BOUND
    return extra
