"""How a Bedrock API call's request reads (``bedrock.py`` hooks it).

Converse and ConverseStream share one request shape (``messages``,
``system``, ``toolConfig``, ``inferenceConfig.maxTokens``). InvokeModel and
its response stream carry the model's own JSON ``body``, whose shape depends
on the model family: the output cap is read from the family's field
(:data:`CAP_FIELDS`), else the model's largest output is reserved. Both are
rewritten on a copy of ``api_params`` (a clamp, a fallback model), never in
the caller's dict.

Endpoints whose bill the request cannot bound (batch and evaluation jobs,
async invocations, agents, flows, guardrails, provisioned throughput: see
:data:`REFUSED`) are described as an unpriced pseudo-model
(``"<service>:<Operation>"``) with :data:`UNBOUNDED_OUTPUT` output tokens, so
any cost or token ceiling denies them before sending, naming them (an
explicit price for the pseudo-model, ``[prices."bedrock:CreateModelInvocationJob"]``,
lets them through); with no such ceiling they pass, counted as a step, their
spend (made later, inside AWS) not metered.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import partial
from operator import is_not
from typing import Any

from veronica_otel._attributes import BEDROCK_OPERATION
from veronica_otel._pricing import (
    DEFAULT_MAX_OUTPUT_TOKENS,
    canonical_model_name,
    max_output_tokens,
)

from ._adapter import Request
from ._hidden_input import ANTHROPIC_IMAGE_TOKENS, anthropic_hidden

__all__ = [
    "CAP_FIELDS",
    "FREE",
    "REFUSED",
    "UNBOUNDED_OUTPUT",
    "arguments",
    "converse_request",
    "family",
    "invoke_request",
    "output_limit",
    "read_converse",
    "refused_request",
    "rewrite_converse",
    "rewrite_invoke",
]

#: Output tokens reserved for an endpoint whose bill cannot be bounded: more than
#: any budget affords at any price, yet exact in every ledger (< 2**53 nano-USD).
UNBOUNDED_OUTPUT = 1_000_000_000

# Per service: operations that bill and cannot be bounded from the request.
REFUSED: Mapping[str, frozenset[str]] = {
    "bedrock-runtime": frozenset(
        (
            "ApplyGuardrail",  # priced per text unit, not per token
            "InvokeGuardrailChecks",
            "StartAsyncInvoke",  # video/long jobs, output to S3
            "InvokeModelWithBidirectionalStream",  # speech-to-speech sessions
        )
    ),
    "bedrock": frozenset(
        (
            "CreateModelInvocationJob",  # batch inference over S3 input
            "CreateEvaluationJob",
            "CreateModelCustomizationJob",
            "CreateProvisionedModelThroughput",
            "UpdateProvisionedModelThroughput",
            "CreateAdvancedPromptOptimizationJob",
        )
    ),
    "bedrock-agent-runtime": frozenset(
        (
            "AgenticRetrieveStream",
            "GenerateQuery",
            "InvokeAgent",
            "InvokeFlow",
            "InvokeInlineAgent",
            "OptimizePrompt",
            "Rerank",
            "Retrieve",
            "RetrieveAndGenerate",
            "RetrieveAndGenerateStream",
            "StartFlowExecution",
        )
    ),
    "bedrock-agentcore": frozenset(
        ("Evaluate", "InvokeAgentRuntime", "InvokeHarness", "StartBatchEvaluation")
    ),
    "bedrock-data-automation-runtime": frozenset(
        ("InvokeDataAutomation", "InvokeDataAutomationAsync")
    ),
}

# bedrock-runtime operations that bill nothing (any other one is refused under
# a ceiling: a new billable operation must not pass uncounted).
FREE = frozenset(("CountTokens", "GetAsyncInvoke", "ListAsyncInvokes"))

# InvokeModel: where each family's body puts its output cap (read and written).
CAP_FIELDS: Mapping[str, tuple[str, ...]] = {
    "anthropic": ("max_tokens",),
    "amazon.nova": ("inferenceConfig", "max_new_tokens"),
    "amazon.titan": ("textGenerationConfig", "maxTokenCount"),
    "meta": ("max_gen_len",),
    "mistral": ("max_tokens",),
    "cohere": ("max_tokens",),
    "ai21": ("max_tokens",),
    "deepseek": ("max_tokens",),
    "writer": ("max_tokens",),
    "qwen": ("max_tokens",),
    "openai": ("max_completion_tokens",),
}

# The largest output Bedrock accepts per call for families whose limit is
# below the kernel's default (a clamp above it is a ValidationException),
# by canonical-name prefix; from the Bedrock model parameter pages.
_BEDROCK_OUTPUT_LIMITS: tuple[tuple[str, int], ...] = (
    ("llama", 2_048),
    ("titan-text-lite", 4_096),
    ("titan-text-premier", 3_072),
    ("titan-text", 8_192),
    ("nova-micro", 10_000),
    ("nova-lite", 10_000),
    ("nova-pro", 10_000),
)
_REGIONS = frozenset(("us", "us-gov", "eu", "apac", "global", "jp", "au", "ca", "regional"))
# S3-held content (images, documents, video) the request does not carry: its
# tokens are bounded by the model's context window; this when that is unknown.
_S3_INPUT_BOUND = 1_000_000
_PRESENT = partial(is_not, None)  # filter's test, in C: the value is not None
# A Request from its fields without NamedTuple's Python-level __new__ (once per call).
_request_of = tuple.__new__  # every Request field, in order (a new field goes here too)
# The Bedrock client seen last (bedrock.py's routing keeps it): a weak reference to
# its ``meta`` and its service. The shared lane's reader reads a Converse call of it.
LAST: list[tuple[Callable[[], Any], str]] = [(lambda: None, "")]
# Converse document formats that are plain text: their bytes bound their tokens.
_TEXT_DOCUMENTS = frozenset(("txt", "md", "csv", "html"))
# An image for a family other than Anthropic's (whose most is ANTHROPIC_IMAGE_TOKENS):
# Llama 3.2 Vision's four 560 px tiles of 1,601 tokens, the most we know of on Bedrock.
_IMAGE_TOKENS = 4 * 1_601


def family(model: str) -> str:
    """The model family of a Bedrock model id (``"anthropic"``, ``"amazon.nova"``, ...)."""
    parts = model.rsplit("/", 1)[-1].lower().split(".")
    if len(parts) > 2 and parts[0] in _REGIONS:
        parts = parts[1:]
    if len(parts) < 2:
        return ""
    if parts[0] == "amazon":
        rest = parts[1]
        if rest.startswith("nova"):
            return "amazon.nova"
        if rest.startswith(("titan-embed", "titan-text")):
            return "amazon.titan"
        return "amazon"
    return parts[0]


def output_limit(model: str) -> int:
    """The most output tokens ``model`` returns per call (reserved when uncapped)."""
    name = canonical_model_name(model)
    for prefix, limit in _BEDROCK_OUTPUT_LIMITS:
        if name.startswith(prefix):
            return limit
    return max_output_tokens(name) or DEFAULT_MAX_OUTPUT_TOKENS


def refused_request(service: str, operation: str, params: Mapping[str, Any]) -> Request:
    """An endpoint whose bill the request cannot bound: denied under any ceiling."""
    return Request(
        operation=_OPERATIONS.get(operation, "invoke_agent"),
        model=f"{service}:{operation}",
        input_parts=params,
        cap=UNBOUNDED_OUTPUT,
        attributes={BEDROCK_OPERATION: operation},
    )


_OPERATIONS = {
    "StartAsyncInvoke": "generate_content",
    "InvokeModelWithBidirectionalStream": "chat",
    "ApplyGuardrail": "apply_guardrail",
    "InvokeGuardrailChecks": "apply_guardrail",
    "CreateModelInvocationJob": "batch",
    "CreateEvaluationJob": "batch",
    "CreateModelCustomizationJob": "fine_tuning",
    "CreateProvisionedModelThroughput": "provisioned_throughput",
    "UpdateProvisionedModelThroughput": "provisioned_throughput",
    "Rerank": "rerank",
    "Retrieve": "retrieve",
}


# -- Converse ------------------------------------------------------------------------


def converse_request(params: Mapping[str, Any], stream: bool) -> Request:
    """Converse / ConverseStream: the input, the cap, whether it can be clamped."""
    return read_converse(None, None, ("", params), {}, _STREAMS[stream])


_STREAMS = ("Converse", "ConverseStream")


def arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``_make_api_call``'s operation name and parameters."""
    if len(args) >= 2:
        return args[0], args[1]
    return kwargs.get("operation_name", args[0] if args else ""), kwargs.get("api_params", {})


def read_converse(
    adapter: object, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], method: str
) -> Request:
    """The Converse adapter's ``read_request``: :func:`read_plain`'s request, its
    input's bytes not counted."""
    return read_plain(adapter, args, kwargs, None, method, sized=False)[0]  # type: ignore[return-value]


def read_plain(
    adapter: object,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    instance: Any = None,
    method: str = "Converse",
    sized: bool = True,
) -> tuple[Request | None, int]:
    """A ``_make_api_call`` of ``Converse`` (unless ``method`` says), read in one frame
    (:func:`converse_request`'s), and the UTF-8 bytes of its input
    (``_utf8_bytes(request.input_parts)``, as ``_describe`` walks it) when it is
    plain: messages only, each a role and text blocks; -1 for any other (and
    when not ``sized``). The shared lane's reader (``ProviderAdapter.read_plain``)
    over every AWS call of ``instance`` (a client): only a ``bedrock-runtime``
    ``Converse`` of the client seen last (:data:`LAST`, botocore passing both
    arguments by position) is read; any other, none (``None, -1``: the hook's
    routing sends it)."""
    if instance is not None:
        last, service = LAST[0]
        if (
            len(args) != 2
            or args[0] != "Converse"
            or service != "bedrock-runtime"
            or last() is not instance.meta
        ):
            return None, -1
    params = args[1] if len(args) >= 2 else arguments(args, kwargs)[1]
    get = params.get
    model = get("modelId")
    model = model if isinstance(model, str) and model else "unknown"
    messages = get("messages")
    system = get("system")
    tools = get("toolConfig")
    more, variables = get("additionalModelRequestFields"), get("promptVariables")
    # What is sent as input (a field left out is not).
    if system is None and tools is None and more is None and variables is None:
        parts: list[object] = [] if messages is None else [messages]
    else:
        parts = list(filter(_PRESENT, (system, messages, tools, more, variables)))
    config = get("inferenceConfig")
    cap = (
        config.get("maxTokens")
        if type(config) is dict or (config is not None and isinstance(config, Mapping))
        else None
    )
    cap = cap if type(cap) is int and cap >= 0 else None
    # _list_bytes([messages])'s count while parts is that: 1 for the outer list,
    # 1 per message; per message of a role and content blocks, 2 per key and the
    # bytes of its keys ("rolecontent") and its role, and 1 per block; per text
    # block, 2 for its key and the bytes of "text" and its text. Anything else: -1.
    size = 1 + len(messages) if sized and type(messages) is list and len(parts) == 1 else -1
    if type(messages) is list:
        n_messages = len(messages)
        # _unseen's common case, inline: text blocks only (it skips them), so
        # nothing unseen and no cache point among the messages.
        plain = True
        for message in messages:
            content = message.get("content") if type(message) is dict else ()
            if type(content) is list:
                for block in content:
                    if type(block) is not dict or "text" not in block:
                        plain = False
                        break
                    if size >= 0:
                        text = block["text"]
                        size = (
                            size + 6 + (len(text) if text.isascii() else len(text.encode()))
                            if len(block) == 1 and type(text) is str
                            else -1
                        )
                if size >= 0:
                    role = message.get("role")
                    size = (
                        size
                        + 15
                        + len(content)
                        + (len(role) if role.isascii() else len(role.encode()))
                        if len(message) == 2 and type(role) is str
                        else -1
                    )
            elif type(message) is not dict:
                plain = False
            else:
                size = -1
            if not plain:
                break
        extra, cache_writes, size = (0, False, size) if plain else (*_unseen(messages, model), -1)
    else:
        n_messages = len(messages) if isinstance(messages, list) else 1
        extra, cache_writes = _unseen(messages, model)
    if system:
        n_messages += 1
    if not cache_writes and (system is not None or tools is not None):
        # a cache point in the system prompt or the tools
        cache_writes = _cache_point(system) or _cache_point(
            tools.get("tools") if isinstance(tools, Mapping) else None
        )
    request = (
        "chat",
        model,
        parts,
        n_messages,
        cap,
        cap is None,  # clampable
        1,
        method == "ConverseStream",
        extra,
        None,
        None,
        True,
        cache_writes,
    )
    return _request_of(Request, request), size


def _unseen(messages: object, model: str) -> tuple[int, bool]:
    """Input the byte walk cannot see, and whether a block is marked to cache.

    An image adds its family's most tokens (its bytes may be fewer: a PNG of
    one colour is small at any size). Input held in S3, a document that is
    not plain text (a PDF's compressed text outgrows its bytes) or a video:
    the model's context window, at most.
    """
    if not isinstance(messages, list):
        return 0, False
    images = 0
    cache = False
    for message in messages:
        content = (
            message.get("content")
            if (type(message) is dict or isinstance(message, Mapping))
            else None
        )
        for block in content if isinstance(content, list) else ():
            if type(block) is dict:
                if "text" in block:
                    continue  # a text block carries nothing else
            elif not isinstance(block, Mapping):
                continue
            if "cachePoint" in block:
                cache = True
            if "image" in block:
                images += 1
            if "video" in block:
                return _context_window(model), cache or _cache_point(messages)
            document = block.get("document")
            if isinstance(document, Mapping) and document.get("format") not in _TEXT_DOCUMENTS:
                return _context_window(model), cache or _cache_point(messages)
            for media in block.values():
                source = (
                    media.get("source")
                    if (type(media) is dict or isinstance(media, Mapping))
                    else None
                )
                if (type(source) is dict or isinstance(source, Mapping)) and "s3Location" in source:
                    return _context_window(model), cache or _cache_point(messages)
    if not images:
        return 0, cache
    per_image = ANTHROPIC_IMAGE_TOKENS if family(model) == "anthropic" else _IMAGE_TOKENS
    return images * per_image, cache


def _cache_point(blocks: object) -> bool:
    """Whether a Converse block list (or a message list) holds a ``cachePoint``."""
    for block in blocks if isinstance(blocks, list) else ():
        if isinstance(block, Mapping):
            if "cachePoint" in block:
                return True
            if _cache_point(block.get("content")):
                return True
    return False


def _context_window(model: str) -> int:
    from veronica_otel._pricing import default_price_table

    prices = default_price_table().lookup("aws.bedrock", model)
    window = None if prices is None else prices.context_window
    return window or _S3_INPUT_BOUND


def rewrite_converse(
    params: Mapping[str, Any], cap: int | None, model: str | None
) -> dict[str, Any]:
    """``params`` (a copy) with the output cap and the model set."""
    sent = dict(params)
    if cap is not None:
        config = params.get("inferenceConfig")
        limit = output_limit(str(params.get("modelId", "")))
        sent["inferenceConfig"] = {
            **(config if isinstance(config, Mapping) else {}),
            "maxTokens": min(cap, limit),
        }
    if model is not None:
        sent["modelId"] = model
    return sent


# -- InvokeModel ------------------------------------------------------------------------


def _body(params: Mapping[str, Any]) -> dict[str, Any] | None:
    """The request body as JSON, or None (not JSON, or a stream we must not consume)."""
    raw = params.get("body")
    if isinstance(raw, (bytes, bytearray, str)):
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return None
        return body if isinstance(body, dict) else None
    return None


def _field(body: Mapping[str, Any], path: tuple[str, ...]) -> object:
    value: object = body
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def invoke_request(params: Mapping[str, Any], stream: bool) -> Request:
    """InvokeModel / InvokeModelWithResponseStream, read per model family."""
    model = params.get("modelId")
    model = model if isinstance(model, str) and model else "unknown"
    kind = family(model)
    body = _body(params)
    embeddings = "embed" in model.lower()
    operation = "embeddings" if embeddings else "chat"
    if body is None:  # unreadable (a file object, not JSON): its size, the model's output
        raw = params.get("body")
        size = len(raw) if isinstance(raw, (bytes, bytearray, str)) else 0
        extra = 0 if size else _context_window(model)
        limit = 0 if embeddings else output_limit(model)
        return Request(operation, model, raw if size else "", 1, limit, False, 1, stream, extra)
    if embeddings:
        return Request(operation, model, body, 1, 0, False, 1, stream)
    fields = CAP_FIELDS.get(kind)
    found: object = None
    if fields is not None:
        found = _field(body, fields)
        if found is None and kind == "openai":
            found = body.get("max_tokens")
    else:  # a family we do not know: any cap it names, else the model's largest output
        found = body.get("max_tokens")
    cap = found if type(found) is int and found >= 0 else None
    messages = body.get("messages")
    n_messages = len(messages) if isinstance(messages, list) else 1
    extra, cache_writes = 0, True
    if kind == "anthropic":  # the Messages API body: images, documents, cache marks
        extra, server_side, cache_writes = anthropic_hidden(body)
        if server_side:
            extra += _context_window(model)
    if cap is None and fields is None:
        cap = output_limit(model)
        return Request(operation, model, body, n_messages, cap, False, 1, stream, extra)
    return Request(
        operation,
        model,
        body,
        n_messages,
        cap,
        cap is None,
        1,
        stream,
        extra,
        cache_writes=cache_writes,
    )


def rewrite_invoke(params: Mapping[str, Any], cap: int | None, model: str | None) -> dict[str, Any]:
    """``params`` (a copy) with the family's cap field and the model set.

    A fallback model replaces ``modelId`` only: the body keeps its family's
    shape, so a fallback must be a model of the same family.
    """
    sent = dict(params)
    current = str(params.get("modelId", ""))
    if cap is not None:
        body = _body(params)
        fields = CAP_FIELDS.get(family(current))
        if body is not None and fields is not None:
            target: dict[str, Any] = body
            for key in fields[:-1]:
                inner = target.get(key)
                inner = dict(inner) if isinstance(inner, Mapping) else {}
                target[key] = inner
                target = inner
            target[fields[-1]] = min(cap, output_limit(current))
            sent["body"] = json.dumps(body).encode("utf-8")
    if model is not None:
        sent["modelId"] = model
    return sent
