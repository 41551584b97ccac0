"""How a ``litellm`` call reads: its request (which provider litellm routes it
to, the model without its ``provider/`` prefix, input, output cap, stream) and
its replies (``ModelResponse``, ``EmbeddingResponse``, Responses API objects,
stream chunks and events), for :mod:`veronica_otel.instrumentors.litellm`.

litellm answers in the OpenAI shape for every provider (``usage.prompt_tokens``
includes cached and cache-write tokens, as OpenAI's does), so one reader
serves Anthropic, Gemini, Bedrock and the rest.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from veronica_otel._attributes import (
    GEN_AI_REQUEST_MODEL,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_RESPONSE_ID,
    GEN_AI_RESPONSE_MODEL,
)
from veronica_otel._errors import BudgetExceededError

from ._adapter import ProviderAdapter, Request, http_status
from ._common import ContainedCall, attribute_value, get_field

__all__ = ["LiteLLMAdapter", "OPERATIONS", "semconv_provider"]

# litellm's provider names -> gen_ai.provider.name (semconv well-known values).
_SEMCONV = {
    "openai": "openai",
    "text-completion-openai": "openai",
    "anthropic": "anthropic",
    "anthropic_text": "anthropic",
    "gemini": "gcp.gemini",
    "vertex_ai": "gcp.vertex_ai",
    "vertex_ai_beta": "gcp.vertex_ai",
    "bedrock": "aws.bedrock",
    "bedrock_converse": "aws.bedrock",
    "azure": "azure.ai.openai",
    "azure_text": "azure.ai.openai",
    "azure_ai": "azure.ai.inference",
    "mistral": "mistral_ai",
    "codestral": "mistral_ai",
    "cohere": "cohere",
    "cohere_chat": "cohere",
    "groq": "groq",
    "deepseek": "deepseek",
    "xai": "x_ai",
    "perplexity": "perplexity",
    "watsonx": "ibm.watsonx.ai",
    "watsonx_text": "ibm.watsonx.ai",
}


def semconv_provider(litellm_provider: str) -> str:
    """``gen_ai.provider.name`` for a provider as litellm names it (others as is)."""
    return _SEMCONV.get(litellm_provider, litellm_provider)


class _Operation(NamedTuple):
    """One public litellm function, as its arguments read.

    Attributes:
        name: ``gen_ai.operation.name``.
        leading: Its leading positional parameters (the rest are read by name).
        inputs: Parameters sent as input (their bytes bound the input tokens).
        caps: Output-cap parameters, the first the one set when the request sets none.
        async_flag: The keyword that makes the sync function return a coroutine.
        priced: False: an endpoint not priced per token (images, audio, ...):
            refused under a cost ceiling, counted as a step without one.
    """

    name: str
    leading: tuple[str, ...]
    inputs: tuple[str, ...]
    caps: tuple[str, ...] = ()
    async_flag: str = ""
    priced: bool = True


_CHAT = _Operation(
    "chat",
    ("model", "messages"),
    ("messages", "tools", "functions"),
    ("max_completion_tokens", "max_tokens"),
    "acompletion",
)
_TEXT = _Operation(
    "text_completion", ("prompt", "model"), ("prompt", "suffix"), ("max_tokens",), "acompletion"
)
_EMBED = _Operation("embeddings", ("model", "input"), ("input",), (), "aembedding")
_RESPONSES = _Operation(
    "chat",
    ("input", "model"),
    ("input", "instructions", "tools"),
    ("max_output_tokens",),
    "aresponses",
)
_IMAGE = _Operation(
    "image_generation", ("prompt", "model"), ("prompt",), (), "aimg_generation", False
)

# hooked function name -> how it reads (async twins read as their sync function).
OPERATIONS: dict[str, _Operation] = {
    "completion": _CHAT,
    "acompletion": _CHAT,
    "text_completion": _TEXT,
    "atext_completion": _TEXT,
    "embedding": _EMBED,
    "aembedding": _EMBED,
    "responses": _RESPONSES,
    "aresponses": _RESPONSES,
    "image_generation": _IMAGE,
    "aimage_generation": _IMAGE,
}
# Billable functions whose price is not per token (or whose HTTP leaves from
# native code): refused under a cost ceiling, each a step without one.
for _name, _leading in (
    ("image_edit", ("image", "prompt", "model")),
    ("transcription", ("model", "file")),
    ("speech", ("model", "input")),
    ("rerank", ("model", "query", "documents")),
    ("ocr", ("model", "document")),
    ("video_generation", ("prompt", "model")),
    ("anthropic_messages", ("max_tokens", "messages", "model")),
    ("agenerate_content", ("model", "contents")),
):
    _op = _Operation(_name, _leading, (), (), "", False)
    OPERATIONS[_name] = _op
    if not _name.startswith("a"):
        OPERATIONS["a" + _name] = _op

_RESOLVED: dict[tuple[object, ...], tuple[str, str]] = {}
_RESOLVED_MAX = 512
_lock = threading.Lock()


def _resolve(model: str, kwargs: dict[str, Any]) -> tuple[str, str]:
    """(``gen_ai.provider.name``, model to price) for ``model`` as litellm routes it."""
    custom = kwargs.get("custom_llm_provider")
    base = kwargs.get("api_base") or kwargs.get("base_url")
    key = (model, custom, base)
    hit = _RESOLVED.get(key)
    if hit is not None:
        return hit
    try:
        from litellm import get_llm_provider

        name, provider, _, _ = get_llm_provider(
            model=model, custom_llm_provider=custom, api_base=base
        )
        hit = (semconv_provider(str(provider)), str(name))
    except Exception:  # litellm will refuse it too; priced (or denied) on the name as given
        hit = ("litellm", model)
    with _lock:
        if len(_RESOLVED) >= _RESOLVED_MAX:
            _RESOLVED.clear()
        _RESOLVED[key] = hit
    return hit


_NAMES: dict[str, tuple[str, ...]] = {}


def _parameter_names(function: Callable[..., Any]) -> tuple[str, ...]:
    """The parameters ``function`` takes by position (through its decorators)."""
    found = _NAMES.get(function.__qualname__)
    if found is None:
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        target = inspect.unwrap(function)
        found = tuple(
            p.name for p in inspect.signature(target).parameters.values() if p.kind in kinds
        )
        _NAMES[function.__qualname__] = found
    return found


def by_name(
    operation: _Operation,
    wrapped: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> dict[str, Any]:
    """Every argument by name (positional ones mapped through the signature)."""
    if not args:
        return kwargs
    names = operation.leading if len(args) <= len(operation.leading) else _parameter_names(wrapped)
    named = dict(zip(names, args, strict=False))
    named.update(kwargs)
    return named


def _cap(named: dict[str, Any], caps: tuple[str, ...]) -> tuple[int | None, str]:
    for key in caps:
        value = named.get(key)
        if type(value) is int:
            return value, key
    return None, caps[0] if caps else ""


def _choices(named: dict[str, Any]) -> int:
    most = 1
    for key in ("n", "best_of"):
        value = named.get(key)
        if type(value) is int and value > most:
            most = value
    return most


class LiteLLMAdapter(ProviderAdapter):
    """Reads one litellm function's calls (one adapter per :class:`_Operation`).

    The wrapper hands it the hooked function as ``instance`` (module functions
    have none), so positional arguments are read through its signature. The
    provider is the one litellm resolves the model to.
    """

    provider = "litellm"

    def __init__(
        self,
        operation: _Operation,
        resolve: Callable[[str, dict[str, Any]], tuple[str, str]] = _resolve,
    ) -> None:
        self.operation = operation
        self._resolve = resolve

    def read_request(
        self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], method: str
    ) -> Request | None:
        operation = self.operation
        named = by_name(operation, instance, args, kwargs)
        model = named.get("model") or named.get("engine")
        model = model if type(model) is str and model else "unknown"
        provider, priced_model = self._resolve(model, named)
        parts = [part for part in map(named.get, operation.inputs) if part is not None]
        if not operation.priced:
            # Priced per image, second or page, which the price table does not hold:
            # a name no table prices, so a cost ceiling refuses it, naming why.
            priced_model = f"{priced_model} ({operation.name}, not priced per token)"
        messages = named.get("messages")
        return Request(
            operation.name,
            priced_model,
            parts,
            len(messages) if type(messages) is list else 1,
            _cap(named, operation.caps)[0],
            bool(operation.caps),
            _choices(named) if operation.name != "embeddings" else 1,
            named.get("stream") is True,
            0,
            {GEN_AI_REQUEST_MODEL: model} if model != priced_model else None,
            provider,
        )

    def rewrite(
        self,
        instance: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        cap: int | None,
        model: str | None,
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        # Every argument by name, in a new dict: the caller's are untouched.
        named = dict(by_name(self.operation, instance, args, kwargs))
        if cap is not None:
            named[_cap(named, self.operation.caps)[1]] = cap
        if model is not None:  # keep litellm's routing prefix (``anthropic/``)
            current = named.get("model")
            prefix = (
                current.split("/", 1)[0] + "/" if type(current) is str and "/" in current else ""
            )
            named["model"] = prefix + model
        return (), named

    def read_reply(self, call: ContainedCall, reply: Any) -> None:
        _read_usage(call, get_field(reply, "usage"))
        if call.pending_attributes is not None:
            _reply_attributes(call.pending_attributes, reply)

    def read_item(self, call: ContainedCall, item: Any) -> None:
        kind = get_field(item, "type")
        if type(kind) is str:  # a Responses API stream event
            if kind == "response.output_text.delta":
                delta = get_field(item, "delta")
                if type(delta) is str:
                    call.add_text(delta)
            elif kind in ("response.completed", "response.incomplete", "response.failed"):
                response = get_field(item, "response")
                _read_usage(call, get_field(response, "usage"))
                if call.pending_attributes is not None:
                    _reply_attributes(call.pending_attributes, response)
            return
        usage = get_field(item, "usage")
        if usage is not None:
            _read_usage(call, usage)
        choices = get_field(item, "choices")
        if choices:
            delta = get_field(choices[0], "delta")
            text = (
                get_field(delta, "content") if delta is not None else get_field(choices[0], "text")
            )
            if type(text) is str:
                call.add_text(text)
        attributes = call.pending_attributes
        if attributes is not None and GEN_AI_RESPONSE_ID not in attributes:
            _reply_attributes(attributes, item)

    def billed_nothing(self, error: BaseException) -> bool:
        # litellm gives its timeouts (408) and connection errors (500) a status
        # too: neither is a reply, the request may have been billed.
        names = {kind.__name__ for kind in type(error).__mro__}
        if names & _NOT_REPLIES or isinstance(error, BudgetExceededError):
            return False
        status = http_status(error)
        return status is not None and status >= 400


_NOT_REPLIES = frozenset(("Timeout", "APITimeoutError", "APIConnectionError", "TimeoutException"))


def _read_usage(call: ContainedCall, usage: Any) -> bool:
    """Usage in the OpenAI chat shape or the Responses/embeddings shape; False: none."""
    if usage is None:
        return False
    inp = get_field(usage, "prompt_tokens")
    if inp is not None:
        out = get_field(usage, "completion_tokens") or 0
        details = get_field(usage, "prompt_tokens_details")
        out_details = get_field(usage, "completion_tokens_details")
    else:
        inp = get_field(usage, "input_tokens")
        if inp is None:
            return False
        out = get_field(usage, "output_tokens") or 0
        details = get_field(usage, "input_tokens_details")
        out_details = get_field(usage, "output_tokens_details")
    cached = (get_field(details, "cached_tokens") if details is not None else None) or 0
    reasoning = (
        get_field(out_details, "reasoning_tokens") if out_details is not None else None
    ) or 0
    write = get_field(usage, "cache_creation_input_tokens") or 0
    return call.set_usage(inp, out, cached, reasoning, write)


def _reply_attributes(attributes: dict[str, Any], reply: Any) -> None:
    for key, name in ((GEN_AI_RESPONSE_ID, "id"), (GEN_AI_RESPONSE_MODEL, "model")):
        value = attribute_value(get_field(reply, name))
        if value is not None and value != "":
            attributes[key] = value
    choices = get_field(reply, "choices")
    if choices:
        reasons = [get_field(choice, "finish_reason") for choice in choices]
        reasons = [reason for reason in reasons if type(reason) is str]
        if reasons:
            attributes[GEN_AI_RESPONSE_FINISH_REASONS] = reasons
    status = get_field(reply, "status")
    if type(status) is str and GEN_AI_RESPONSE_FINISH_REASONS not in attributes:
        attributes[GEN_AI_RESPONSE_FINISH_REASONS] = [status]
