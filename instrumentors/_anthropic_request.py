"""Reading and rewriting an ``anthropic`` request: whether it is a
``messages.create`` call, the call described once for the kernel, its span,
and the clamp and fallback put into its body."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.trace import Span

from veronica_otel._agents import current_agent
from veronica_otel._context import ExecutionContext
from veronica_otel._propagation import default_context

from ._adapter import admitted_above
from ._admit import CallSpec, aadmit, admit, input_bound
from ._anthropic_attributes import request_attributes
from ._common import UNTRACED_SPAN, ContainedCall, start_span
from ._hidden_input import anthropic_hidden, widened

# The logger users filter on, as before this module was split out of anthropic.py.
_logger = logging.getLogger(__name__.rpartition(".")[0] + ".anthropic")
PROVIDER = "anthropic"
_CREATE = "anthropic.messages.create"
_INPUT_KEYS = ("system", "messages", "tools")


class _CallState:
    """One contained API call and what its attempts and events reported so far."""

    __slots__ = (
        "attempts",
        "cache_read",
        "cache_write",
        "call",
        "input",
        "noted",
        "output",
        "replied",
        "retries",
        "thinking",
    )

    def __init__(self, call: ContainedCall) -> None:
        self.call = call
        self.retries = 0  # highest retries_taken already drawn from the chain
        self.attempts = 0  # HTTP attempts that passed our checks and went to the SDK
        self.replied = False  # an HTTP reply came back (any status)
        self.noted: BaseException | None = None  # the last attempt error already counted
        # The last usage report's raw values, read as counts once the final one is in.
        self.input: object = None  # Anthropic's input_tokens: without cache reads and writes
        self.cache_read: object = 0
        self.cache_write: object = 0
        self.output: object = None  # cumulative in a stream: final in message_delta
        self.thinking: object = 0


def _is_messages_call(options: Any) -> bool:
    name = getattr(options, "span_name", None)
    if name is not None:
        return bool(name == _CREATE)
    # No span name (e.g. a raw ``client.post``): fall back to the route.
    if str(getattr(options, "method", "")).lower() != "post":
        return False
    return str(getattr(options, "url", "")).split("?", 1)[0].endswith("/v1/messages")


def _begin(options: Any, sdk_call: Any, client: Any = None) -> _CallState | None:
    """Admit a ``messages.create`` call; None when it is not ours to contain."""
    request = _describe(options, sdk_call)
    if request is None:
        return None
    ctx, spec, span, owns, body = request
    with _scope(span, owns):
        call, clamp, fallback = admit(ctx, span, owns, spec)
    _rewrite(options, body, clamp, fallback)
    if call.pending_attributes is not None:  # our own span records
        request_attributes(call.pending_attributes, body, client)
    return _CallState(call)


async def _abegin(options: Any, sdk_call: Any, client: Any = None) -> _CallState | None:
    """:func:`_begin` for the async client: a shared store is awaited (``aadmit``)."""
    request = _describe(options, sdk_call)
    if request is None:
        return None
    ctx, spec, span, owns, body = request
    with _scope(span, owns):
        call, clamp, fallback = await aadmit(ctx, span, owns, spec)
    _rewrite(options, body, clamp, fallback)
    if call.pending_attributes is not None:  # our own span records
        request_attributes(call.pending_attributes, body, client)
    return _CallState(call)


def _describe(
    options: Any, sdk_call: Any
) -> tuple[ExecutionContext, CallSpec, Span, bool, Mapping[str, Any]] | None:
    """The call described once (for the kernel), its span; None when it is not ours."""
    if admitted_above():
        return None  # an adapter above (litellm) admitted this call: counted there (G13)
    try:
        body = options.json_data if _is_messages_call(options) else None
    except Exception:
        _logger.exception("classifying an anthropic request failed; it is not contained")
        return None
    if not isinstance(body, Mapping):
        return None
    ctx = default_context()
    if ctx is None:
        return None
    model = str(body.get("model") or "unknown")
    messages = body.get("messages")
    n_messages = len(messages) if isinstance(messages, list) else 1
    parts = [body[key] for key in _INPUT_KEYS if body.get(key) is not None]
    cap = body.get("max_tokens")
    requested = cap if isinstance(cap, int) and not isinstance(cap, bool) else None
    agent = current_agent() if ctx.names_agents else None
    # What the bytes do not show (images, server-side input); cache-write prices
    # only where the request marks blocks to cache.
    extra, server_side, cache_writes = anthropic_hidden(body)
    bound = input_bound(parts, n_messages)
    if extra or server_side:
        bound = widened(ctx, PROVIDER, model, bound, extra, server_side)
    spec = CallSpec(
        PROVIDER,
        "chat",
        model,
        bound,
        requested,
        True,
        1,
        body.get("stream") is True,
        agent,
        parts,
        cache_writes,
    )
    span: Span | None = getattr(sdk_call, "span", None) if sdk_call is not None else None
    owns = span is None
    if span is None:
        # The SDK's tracing is off: our own span. Suppression hides it, never the check.
        span = start_span("chat", PROVIDER, model, agent) if is_instrumentation_enabled() else None
        span = span if span is not None else trace.INVALID_SPAN
    # Else the SDK's span is already current: no second span, our attributes go on it.
    return ctx, spec, span, owns, body


def _scope(span: Span, owns: bool) -> contextlib.AbstractContextManager[Any]:
    if owns and span is not UNTRACED_SPAN:
        return trace.use_span(
            span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        )
    return contextlib.nullcontext()


def _rewrite(
    options: Any, body: Mapping[str, Any], clamp: int | None, fallback: str | None
) -> None:
    changes: dict[str, object] = {}
    if clamp is not None:
        changes["max_tokens"] = clamp
    if fallback is not None:
        changes["model"] = fallback
    if changes:
        # Every attempt shares this dict through shallow copies: replace it.
        options.json_data = {**body, **changes}
