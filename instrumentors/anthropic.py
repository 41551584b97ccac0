"""Containment for the ``anthropic`` SDK (0.70 and later: 0.x, 1.x, 2.x).

Usage::

    from veronica_otel.instrumentors.anthropic import AnthropicInstrumentor

    AnthropicInstrumentor().instrument()
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)):
        client.messages.create(...)   # raises BudgetExceededError when over

Configuration: limits come from the active :class:`ExecutionContext`, else the
process default chain (zero-code: ``VERONICA_*`` variables). With neither,
calls pass through untouched. ``anthropic`` opens its own CLIENT span per API
call; the ``veronica.*`` attributes go on that span. With its tracing off
(``ANTHROPIC_OPEN_TELEMETRY=false`` or ``Anthropic(open_telemetry=False)``)
a GenAI ``chat {model}`` span is opened instead.

Where it hooks (``create``, ``stream``, ``parse`` and their ``beta`` twins all
pass through these). The base client changed shape across releases; the
first of these that the installed release fits is wrapped (probed first):

- its own spans (1.x with ``_request``, 2.x): ``_request`` and ``_attempt_request``;
- per-attempt middleware (late 0.x, early 1.x): ``request`` and ``_attempt_request``
  (the SDK opens no span: ours is a GenAI ``chat {model}`` span);
- the retry loop in ``request`` (0.70 to the middle of 0.x, the releases agent
  frameworks pin): ``request`` and ``_sleep_for_retry``, as the ``openai`` SDK.

In detail (``_request`` stands for ``request`` where there is none):

- ``SyncAPIClient._request`` / ``AsyncAPIClient._request``: once per API call,
  through the shared adapter wrapper (:mod:`._adapter`), inside the SDK's span
  (kwarg ``call``, None when its tracing is off), with ``extra_body`` already
  merged into the body. Runs the pre-call check (``messages.create`` only;
  ``count_tokens`` and the rest pass through), clamps, swaps in a fallback
  model (in a copy of the request options), settles the call; our
  ``veronica.*`` baggage is not in the context the SDK injects into the
  request headers. The check lives here, not in a span processor, because the
  SDK swallows errors raised while its span starts.
  Untraced, a plain request (text messages, a text system prompt, nothing
  hidden: ``read_plain``) runs its common call in one frame
  (:func:`~._adapter._lane`).
- ``SyncAPIClient._attempt_request`` / ``AsyncAPIClient._attempt_request``:
  once per attempt, each ``call_next`` of a middleware included. Every
  attempt after the first (an SDK retry, or a middleware sending again) is a
  retry drawn on ``max_retries_total``; the deadline and trips are re-checked.
- ``SyncAPIClient._sleep_for_retry`` / ``AsyncAPIClient._sleep_for_retry``
  (releases without ``_attempt_request``): before every SDK-internal retry;
  draws the retry, re-checks the deadline and sticky trips before and after
  the backoff (the openai SDK's hook, :mod:`._stainless`).
- ``BaseClient._process_response_data``: every parsed payload, stream events
  included. Records usage, keeps streamed text, and cuts a stream at the next
  event once the chain trips or its deadline passes. A whole message settles
  its call here (the SDK ends its span right after), or, with no span at all,
  as ``_request`` returns (the lane's commit).

Every HTTP send is also reported by the transport hooks (:mod:`._attempts`),
as for every adapter: a resend the SDK's hooks never see (a custom transport
sending again) is a retry too; each retry is drawn once, whichever layer sees
it first. Counted once (DESIGN G13): a call an adapter above already admitted
(litellm) passes through; while ours runs it is :data:`~._adapter.ADMITTED`,
so the HTTP layer below reports its attempts instead of admitting it again.

Denials are raised without a ``__cause__``: the SDK retries any error whose
cause chain holds one of its connection or status errors.

What a call that did not end well costs (DESIGN G10): the shared table
(:func:`~._adapter._fail`), from what the transport saw of each attempt (a
reply, a connection never made, or an error once the send began, which may
have reached the provider and costs the reservation); a 2xx reply a
middleware dropped after sending again was billed too, and costs the
reservation. A stream or raw response that arrives with neither the attempt
hook nor the transport having seen a send came from a client middleware:
released (a parsed message costs what its payload said, as any). Usage
counts only from the final report (``message_delta`` or a whole message): a
stream cut before it costs the reservation.

Layout: this module is what is patched, the adapter and the per-attempt and
payload hooks; ``_anthropic_request`` reads and rewrites a request (is it a
``messages.create`` call, what it asks for); ``_anthropic_response`` reads a
reply, stream events and usage, and holds a reply read later.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from types import FunctionType
from typing import Any

from opentelemetry.trace import NonRecordingSpan

from veronica_otel._errors import BudgetExceededError

from ._adapter import ADMITTED, Request
from ._anthropic_attributes import call_attributes
from ._anthropic_request import PROVIDER, read_call, read_plain, rewritten
from ._anthropic_response import account, hold, payload_lane
from ._common import ContainedCall
from ._endpoints import ANTHROPIC as ANTHROPIC_ENDPOINTS
from ._endpoints import routed
from ._hooks import GuardedInstrumentor, Hook, HookSet, SDKHooks
from ._http_libs import bound_call
from ._openai_response import _MODEL_TYPES, BOUND
from ._stainless import StainlessAdapter, _options, in_flight, retry_wrappers, with_options

__all__ = ["AnthropicInstrumentor"]

_logger = logging.getLogger(__name__)
_instruments = ("anthropic >= 0.70, < 3",)
_MODULE = "anthropic._base_client"


class _AnthropicAdapter(StainlessAdapter):
    """``messages.create`` calls; ``tried``: the base client's shape has a
    per-attempt hook (``_attempt_request``), so a call it never saw and the
    transport never saw sent nothing (a middleware answered)."""

    provider = PROVIDER
    package = "anthropic"
    _sending = frozenset(("_attempt_request", "_process_response"))

    def __init__(self, tried: bool) -> None:
        self.tried = tried

    # Parsed messages: once settled (their payload read), nothing is left to read.
    whole_replies = _MODEL_TYPES
    # request(cast_to, options) read in one frame (the adapter is its first argument)
    read_request = read_call
    read_plain = read_plain  # the shared plain lane's reader (_adapter._lane)

    def call_span(
        self,
        instance: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        request: Request,
        agent: str | None,
        current: Any,
    ) -> Any:
        sdk_call = kwargs.get("call")  # the SDK's own span, current already (None: off)
        if sdk_call is None:
            return None
        span = getattr(sdk_call, "span", None)
        # One that does not record is none (the plain lane takes no span where
        # one is current: _adapter.ProviderAdapter.read_plain).
        return None if type(span) is NonRecordingSpan else span

    request_attributes = call_attributes

    def rewrite(
        self,
        instance: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        cap: int | None,
        model: str | None,
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return with_options(args, kwargs, rewritten(_options(args, kwargs), cap, model))

    def is_stream(self, reply: Any, request: Request) -> bool:
        return True  # every reply is held: a stream, a raw response, or read now

    # No read_reply: a parsed message (a whole reply) was read by the payload
    # hook as the SDK parsed it, and settled there, or, with no span to end
    # (untraced), its plain usage left to settle as request() returns (the
    # shared lane commits it in its frame: _adapter._lane); one whose usage was
    # not read settles at the reservation.

    def wrap_stream(self, call: ContainedCall, reply: Any, is_async: bool) -> Any:
        if self.tried and not call.tries and not call.attempts:
            call.finish(sent=False)  # a client middleware answered: nothing was sent
            return reply
        return hold(call, reply)


_ADAPTER = _AnthropicAdapter(tried=True)
_LOOP_ADAPTER = _AnthropicAdapter(tried=False)  # releases whose retry loop has no attempt hook


# -- attempts (once per HTTP send, releases with _attempt_request) ----------------


def _stops(retry: bool, denial: BudgetExceededError) -> bool:
    """Whether ``denial`` stops the attempt about to be sent.

    A retry (the SDK's, or a middleware's second send) is a new dispatch: any
    trip stops it. The first attempt was checked at admission: since then only
    the deadline or a cancellation stops it; a limit another call reached (that
    call's denial tripped the chain) does not take back a call already
    admitted, whose step and reservation were counted within the limit.
    """
    return retry or denial.reason == "timeout"


def _retries_taken(kwargs: dict[str, Any]) -> int:
    taken = kwargs.get("retries_taken", 0)
    return taken if type(taken) is int else 0


def _attempt_lane() -> Any:
    """``_attempt_request``'s hook as one plain function (``_hooks._plain``): the
    attempt checked, then sent, in this frame."""

    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = ADMITTED.get()  # in_flight(_ADAPTER), inline: every attempt passes here
        if call is not None and call.adapter is _ADAPTER:
            # Raised without a __cause__: the SDK does not retry it; nothing is sent.
            taken = kwargs.get("retries_taken", 0)
            if type(taken) is int and taken == 0 and not call.tries:
                call.tries = 1  # begin_try's first attempt (nothing to draw), without its frame
                retry = False
            else:
                retry = call.begin_try(taken if type(taken) is int else 0)
            # check_alive's ctx.ensure_active(poll=not call._async_stream), inline:
            # every attempt passes here (a keyword call and a frame less).
            polling = call.ctx._polling
            try:
                if polling.due() and not call._async_stream:
                    polling.read_store()
            except BudgetExceededError as exc:
                if _stops(retry, exc):
                    raise
        method = hooked.__wrapped__  # type: ignore[attr-defined]
        if type(method) is FunctionType:  # the SDK's own method: no binding
            return method(self, *args, **kwargs)
        return method.__get__(self, type(self))(*args, **kwargs)

    return hooked


def _send(bound: Any, *args: Any, **kwargs: Any) -> Any:
    return bound(*args, **kwargs)


# The plain function over a bound method: ``self`` is what it sends through.
_ATTEMPT = _attempt_lane()
_ATTEMPT.__wrapped__ = _send


def _attempt(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``_attempt_request``'s ``wrapt`` wrapper (a method another wrapper holds):
    :func:`_attempt_lane`'s check, then ``wrapped``."""
    return _ATTEMPT(wrapped, *args, **kwargs)


_attempt.veronica_lane = _attempt_lane  # type: ignore[attr-defined]


async def _aattempt(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    call = in_flight(_ADAPTER)
    if call is not None:
        retry = await call.abegin_try(_retries_taken(kwargs))
        try:
            await call.ctx.aensure_active()  # a store poll awaited
        except BudgetExceededError as exc:
            if _stops(retry, exc):
                raise
    return await wrapped(*args, **kwargs)


# -- payloads (every parsed body and stream event) -------------------------------


def _payload_wrapper(adapter: _AnthropicAdapter) -> Any:
    def process_response_data(
        wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        # A body read after request() returned (a stream, a raw response), or
        # one parsed inside it: the call in flight's.
        call = bound_call(kwargs.get("response")) if BOUND[0] else None  # none ever bound: none is
        if call is None:  # in_flight(adapter), inline
            call = ADMITTED.get()
            if call is not None and call.adapter is not adapter:
                call = None
        if call is not None and not call.done:
            try:
                account(call, kwargs.get("data"))
            except BudgetExceededError as exc:
                # Settle before the SDK ends its span on the error we raise.
                call.finish(exc)
                raise
            except Exception:
                _logger.exception("reading usage from an anthropic payload failed")
        return wrapped(*args, **kwargs)

    # Over a plain method (_hooks._plain): a whole message's plain usage read in one frame.
    process_response_data.veronica_lane = lambda: payload_lane(adapter, process_response_data)  # type: ignore[attr-defined]
    return process_response_data


# -- the instrumentor -------------------------------------------------------------

# Each hook and the parameters our wrapper reads (checked before any is wrapped).
# Messages calls through the adapter; every other billable endpoint through the table.
_REQUEST = routed(_ADAPTER, ANTHROPIC_ENDPOINTS)
_AREQUEST = routed(_ADAPTER, ANTHROPIC_ENDPOINTS, is_async=True)
_ATTEMPTS = (
    Hook("SyncAPIClient", "_attempt_request", _attempt, ("options",), ("retries_taken",)),
    Hook("AsyncAPIClient", "_attempt_request", _aattempt, ("options",), ("retries_taken",), True),
    Hook(
        "BaseClient",
        "_process_response_data",
        _payload_wrapper(_ADAPTER),
        (),
        ("data", "response"),
    ),
)
_SLEEP, _ASLEEP = retry_wrappers(_LOOP_ADAPTER)
_PATCHES = (
    # Its own spans: once per API call inside the SDK's span (kwarg ``call``).
    HookSet(
        "anthropic >= 1.0, < 3",
        (
            Hook("SyncAPIClient", "_request", _REQUEST, ("cast_to", "options"), ("call",)),
            Hook("AsyncAPIClient", "_request", _AREQUEST, ("cast_to", "options"), ("call",), True),
            *_ATTEMPTS,
        ),
    ),
    # Per-attempt middleware, no spans of its own.
    HookSet(
        "anthropic >= 0.70, < 2",
        (
            Hook("SyncAPIClient", "request", _REQUEST, ("cast_to", "options")),
            Hook("AsyncAPIClient", "request", _AREQUEST, ("cast_to", "options"), (), True),
            *_ATTEMPTS,
        ),
    ),
    # The retry loop in request(), as the openai SDK's.
    HookSet(
        "anthropic >= 0.70, < 1",
        (
            Hook(
                "SyncAPIClient",
                "request",
                routed(_LOOP_ADAPTER, ANTHROPIC_ENDPOINTS),
                ("cast_to", "options"),
            ),
            Hook(
                "AsyncAPIClient",
                "request",
                routed(_LOOP_ADAPTER, ANTHROPIC_ENDPOINTS, is_async=True),
                ("cast_to", "options"),
                (),
                True,
            ),
            Hook("SyncAPIClient", "_sleep_for_retry", _SLEEP, (), ("retries_taken",)),
            Hook("AsyncAPIClient", "_sleep_for_retry", _ASLEEP, (), ("retries_taken",), True),
            Hook(
                "BaseClient",
                "_process_response_data",
                _payload_wrapper(_LOOP_ADAPTER),
                (),
                ("data", "response"),
            ),
        ),
    ),
)
# Where calls are refused when the hooks do not fit: public, every API call passes.
_GUARDS = (("SyncAPIClient", ("request", "post")), ("AsyncAPIClient", ("request", "post")))
_HOOKS = SDKHooks(_instruments[0], _MODULE, _PATCHES, _GUARDS)


class AnthropicInstrumentor(GuardedInstrumentor):
    """Contains every ``messages.create`` call of the ``anthropic`` SDK in the active chain.

    ``instrument()`` raises :class:`~veronica_otel.instrumentors.InstrumentationError`
    when the installed ``anthropic`` is outside the tested range or a hook changed;
    nothing is patched and calls in a chain are refused (fail closed).
    """

    _hooks = _HOOKS
    reports_attempts = True

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments
