"""Reading and rewriting an ``openai`` request (or one of an SDK generated the
same way and speaking its wire format, such as ``groq``): its route, body,
output cap and choices, the call described once for the kernel, and the span
it goes on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span

from veronica_otel._agents import current_agent
from veronica_otel._context import ExecutionContext
from veronica_otel._propagation import default_context

from ._adapter import admitted_above
from ._admit import CallSpec, aadmit, admit, input_bound
from ._common import ContainedCall, make_current, start_span
from ._hidden_input import openai_hidden, widened
from ._openai_attributes import request_attributes

PROVIDER = "openai"


class Stainless(NamedTuple):
    """A Stainless-generated SDK speaking the OpenAI wire format.

    Attributes:
        package: Its import name (``"openai"``, ``"groq"``): where its
            ``Stream``, ``AsyncStream`` and error classes are found.
        provider: ``gen_ai.provider.name`` of its calls, the provider they are priced under.
    """

    package: str
    provider: str


OPENAI = Stainless("openai", PROVIDER)

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


class _CallState:
    """One contained API call, as the per-attempt and per-payload hooks see it."""

    __slots__ = ("baggage", "call", "replied", "retries", "sdk", "span_token", "streamed")

    def __init__(
        self, call: ContainedCall, streamed: bool, span_token: object, sdk: Stainless = OPENAI
    ) -> None:
        self.call = call
        self.sdk = sdk
        self.streamed = streamed
        self.retries = 0  # highest retries_taken already drawn from the chain
        self.span_token = span_token  # our span is current from admission to return
        # What earlier attempts did, as the retry hook saw them (attempts lost
        # unanswered are counted on the call): nothing is tracked on the success
        # path, the last attempt is read from how the call ended.
        self.replied = False  # an HTTP reply came back (an error status: retried)
        self.baggage: otel_context.Context | None = None  # where to look for ours to strip


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


def _prepare(
    options: Any, stream_kwarg: bool, client: Any, sdk: Stainless = OPENAI
) -> _CallState | None:
    """Admit the call described by ``options``; None when it is not ours to contain."""
    request = _describe(options, stream_kwarg, sdk)
    if request is None:
        return None
    # Current from here until the request returns (one attach for both): a
    # denial's trip event lands on this span, and HTTP spans nest under it.
    span_token = make_current(request.span, request.current)
    try:
        admitted = admit(request.ctx, request.span, request.owns, request.spec)
        return _prepared(options, client, request, admitted, span_token)
    except BaseException:
        if span_token is not None:
            otel_context.detach(span_token)
        raise


async def _aprepare(
    options: Any, stream_kwarg: bool, client: Any, sdk: Stainless = OPENAI
) -> _CallState | None:
    """:func:`_prepare` for the async client: a shared store is awaited (``aadmit``)."""
    request = _describe(options, stream_kwarg, sdk)
    if request is None:
        return None
    span_token = make_current(request.span, request.current)
    try:
        admitted = await aadmit(request.ctx, request.span, request.owns, request.spec)
        return _prepared(options, client, request, admitted, span_token)
    except BaseException:
        if span_token is not None:
            otel_context.detach(span_token)
        raise


def _prepared(
    options: Any,
    client: Any,
    request: _Request,
    admitted: tuple[ContainedCall, int | None, str | None],
    span_token: object,
) -> _CallState:
    """Put the clamp and fallback into the request; the call's state."""
    call, clamp, fallback = admitted
    body = request.body
    _rewrite(options, request.cap_keys, body, clamp, fallback)
    if call.pending_attributes is not None:  # our own span records
        request_attributes(call.pending_attributes, body, client)
    state = _CallState(call, request.spec.stream, span_token, request.sdk)
    state.baggage = request.current
    return state


class _Request(NamedTuple):
    """A call described once: the kernel's description of it (``spec``), its
    span, and what rewriting the request needs."""

    ctx: ExecutionContext
    spec: CallSpec
    span: Span
    owns: bool  # our span (False: a peer instrumentor's span carries ours)
    cap_keys: tuple[str, ...]
    body: dict[str, Any]
    current: otel_context.Context  # the OpenTelemetry context, read once
    sdk: Stainless


def _describe(options: Any, stream_kwarg: bool, sdk: Stainless) -> _Request | None:
    """What admitting the call needs, and its span (not yet current); None: not ours."""
    if admitted_above():
        return None  # an adapter above (litellm) admitted this call: counted there (G13)
    route = _route(options)
    if route is None:
        return None
    # The OpenTelemetry context, read once: the chain, the current span,
    # suppression and baggage all come from it.
    current = otel_context.get_current()
    ctx = default_context(current)
    if ctx is None:
        return None
    operation, input_keys, cap_keys = route
    body = _body(options)
    model = body.get("model")
    if type(model) is not str or not model:
        model = str(model or "unknown")
    parts = [part for part in map(body.get, input_keys) if part is not None]
    messages = body.get("messages")
    agent = current_agent() if ctx.names_agents else None
    bound = input_bound(parts, len(messages) if type(messages) is list else 1)
    choices = _choices(body, operation)
    if operation != "embeddings":  # what the bytes do not show: images, server-side input
        extra, server_side = openai_hidden(body, model)
        if extra or server_side:
            bound = widened(ctx, sdk.provider, model, bound, extra, server_side)
        if operation == "text_completion":  # each prompt of a list is a completion of its own
            choices *= _prompts(body.get("prompt"))
    spec = CallSpec(
        sdk.provider,
        operation,
        model,
        bound,
        _requested_cap(body, cap_keys)[0],
        bool(cap_keys),
        choices,
        stream_kwarg or body.get("stream") is True,
        agent,
        parts,
    )
    peer = _peer_span(operation, agent, current)
    span = peer if peer is not None else start_span(operation, sdk.provider, model, agent, current)
    return _Request(ctx, spec, span, peer is None, cap_keys, body, current, sdk)


def _rewrite(
    options: Any,
    cap_keys: tuple[str, ...],
    body: Mapping[str, Any],
    clamp: int | None,
    fallback: str | None,
) -> None:
    """Put the clamp and the fallback model into the request."""
    if clamp is not None:
        # Into the key the caller used (chat has two names for it): never add the other.
        _set_body(options, _requested_cap(body, cap_keys)[1], clamp)
    if fallback is not None:
        _set_body(options, "model", fallback)


def _peer_span(operation: str, agent: str | None, current: otel_context.Context) -> Any:
    """A peer GenAI instrumentor's span for this very call, when one is current.

    The official ``opentelemetry-instrumentation-openai-v2``, OpenLLMetry and
    openlit wrap ``create()``, above our hook: their CLIENT span for the same
    operation is current here. Our attributes go on it and it stays theirs
    to end, so the call is described once. Anything else (no span, another
    operation, a span already used for one of our calls): None, our own span.
    """
    span = trace.get_current_span(current)
    if not span.is_recording() or getattr(span, "kind", None) is not trace.SpanKind.CLIENT:
        return None
    attributes = getattr(span, "attributes", None) or {}
    if "veronica.chain.id" in attributes:
        return None
    scope = getattr(span, "instrumentation_scope", None)
    if scope is not None and scope.name.startswith("veronica_otel"):
        return None
    if attributes.get("gen_ai.operation.name", attributes.get("llm.request.type")) != operation:
        return None
    if agent is not None:
        span.set_attribute("gen_ai.agent.name", agent)
    return span


def _is_mapping(value: object) -> bool:
    # Payloads are plain dicts: skip the ABC check (slow next to the rest).
    return type(value) is dict or isinstance(value, Mapping)
