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
  inside the SDK's span (kwarg ``call``, None when its tracing is off), with
  ``extra_body`` already merged into the body. Runs the pre-call check
  (``messages.create`` only; ``count_tokens`` and the rest pass through),
  swaps in a fallback model, settles the call. The check lives here, not in a
  span processor, because the SDK swallows errors raised while its span starts.
- ``SyncAPIClient._attempt_request`` / ``AsyncAPIClient._attempt_request``:
  once per HTTP send. Every SDK-internal retry draws on ``max_retries_total``;
  the deadline and sticky trips are re-checked; our ``veronica.*`` baggage is
  removed from the context the SDK injects into the request headers.
- ``SyncAPIClient._sleep_for_retry`` / ``AsyncAPIClient._sleep_for_retry``
  (releases without ``_attempt_request``): before every SDK-internal retry;
  notes what the failed attempt said, draws the retry, re-checks the deadline
  and sticky trips before and after the backoff.
- ``BaseClient._process_response_data``: every parsed payload, stream events
  included. Records usage, keeps streamed text, and cuts a stream at the next
  event once the chain trips or its deadline passes.

Counted once (DESIGN G13): a call an adapter above already admitted (litellm)
passes through; while ours runs it is :data:`~._adapter.ADMITTED`, so the
HTTP layer below does not admit it again (the SDK's retries are counted here).

Denials are raised without a ``__cause__``: the SDK retries any error whose
cause chain holds one of its connection or status errors.

What a call that did not end well costs (DESIGN G10): the attempt hook notes
each attempt's outcome (a reply, a connection never made, or an error once
the send began, which may have reached the provider and costs the
reservation). A reply, or an ``APIStatusError``, that arrives without the
attempt hook having run is still sent: only a client middleware answering
without any attempt is released. Usage counts only from the final report
(``message_delta`` or a whole message): a stream cut before it costs the
reservation.

Layout (as contrib's ``openai_v2``): this module is what is patched and the
wrappers; ``_anthropic_request`` reads and rewrites a request (is it a
``messages.create`` call, the call described for the kernel, its span);
``_anthropic_response`` reads how a call ended (reply, stream events, usage,
error) and settles it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sys
import time
from collections.abc import Collection
from typing import Any

from opentelemetry import context as otel_context

from veronica_otel._errors import BudgetExceededError

from ._adapter import ADMITTED
from ._anthropic_request import PROVIDER, _abegin, _begin, _CallState
from ._anthropic_response import (
    _account,
    _fail,
    _note_attempt,
    _note_failure,
    _settle,
    _state_of,
    _tag,
)
from ._common import make_current, settle_failed, strip_veronica_baggage
from ._endpoints import ANTHROPIC as ANTHROPIC_ENDPOINTS
from ._endpoints import endpoint_call
from ._hooks import GuardedInstrumentor, Hook, HookSet, SDKHooks

__all__ = ["AnthropicInstrumentor"]

_logger = logging.getLogger(__name__)
_instruments = ("anthropic >= 0.70, < 3",)
_MODULE = "anthropic._base_client"

_ENDPOINTS = endpoint_call(ANTHROPIC_ENDPOINTS, PROVIDER)
_ACTIVE: contextvars.ContextVar[_CallState | None] = contextvars.ContextVar(
    "veronica_anthropic_call", default=None
)


# -- calls (once per API call) ---------------------------------------------------


def _request(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    options = args[1] if len(args) > 1 else kwargs.get("options")
    state = _begin(options, kwargs.get("call"), instance)
    active = _ACTIVE.set(state)  # None for calls we do not contain: no stale parent
    if state is None:
        try:  # not a messages call: a billable endpoint of another kind, or free
            return _ENDPOINTS[0](wrapped, instance, args, kwargs)
        finally:
            _ACTIVE.reset(active)
    call = state.call
    span_token = make_current(call.span, None) if call.owns_span else None
    mark = ADMITTED.set(call)
    try:
        delay_ms = call.handle.decision.rate_limit_ms
        if delay_ms:
            time.sleep(delay_ms / 1000)
        result = wrapped(*args, **kwargs)
    except BaseException as exc:
        _fail(state, exc)
        raise
    finally:
        ADMITTED.reset(mark)
        if span_token is not None:
            otel_context.detach(span_token)
        _ACTIVE.reset(active)
    try:
        return _settle(state, result, instance)
    except Exception:
        return settle_failed(state.call, result, _logger, PROVIDER)


async def _arequest(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    options = args[1] if len(args) > 1 else kwargs.get("options")
    state = await _abegin(options, kwargs.get("call"), instance)
    active = _ACTIVE.set(state)
    if state is None:
        try:
            return await _ENDPOINTS[1](wrapped, instance, args, kwargs)
        finally:
            _ACTIVE.reset(active)
    call = state.call
    span_token = make_current(call.span, None) if call.owns_span else None
    mark = ADMITTED.set(call)
    try:
        delay_ms = call.handle.decision.rate_limit_ms
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        result = await wrapped(*args, **kwargs)
    except BaseException as exc:
        call.defer_settlement()  # decided by the sync code, then awaited
        try:
            _fail(state, exc)
        finally:
            await call.settle_deferred()
        raise
    finally:
        ADMITTED.reset(mark)
        if span_token is not None:
            otel_context.detach(span_token)
        _ACTIVE.reset(active)
    call.defer_settlement()
    try:
        result = _settle(state, result, instance)
    except Exception:
        result = settle_failed(state.call, result, _logger, PROVIDER)
    finally:
        await call.settle_deferred()
    return result


# -- attempts (once per HTTP send) ---------------------------------------------


def _before_send(state: _CallState, retries_taken: object, drawn: bool = False) -> None:
    call = state.call
    if isinstance(retries_taken, int) and retries_taken > state.retries:
        # An SDK-internal retry is about to be sent: it draws on the chain's
        # retry budget. Raising here (no __cause__) stops the SDK loop unsent.
        state.retries = retries_taken
        if not drawn:  # the async hook drew it already, awaiting the store
            call.ctx.consume_retry()
        if call.span.is_recording():
            call.span.set_attribute("veronica.retries", retries_taken)
    try:
        call.check_alive()
    except BudgetExceededError as exc:
        if _stops(state, exc):
            raise
    state.attempts += 1


def _stops(state: _CallState, denial: BudgetExceededError) -> bool:
    """Whether ``denial`` stops the attempt about to be sent.

    A retry is a new dispatch: any trip stops it. The first attempt was
    checked at admission: since then only the deadline or a cancellation
    stops it; a limit another call reached (that call's denial tripped the
    chain) does not take back a call already admitted, whose step and
    reservation were counted within the limit (as the openai hooks do).
    """
    return state.attempts > 0 or state.retries > 0 or denial.reason == "timeout"


def _attempt(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    state = _ACTIVE.get()
    if state is not None:
        _before_send(state, kwargs.get("retries_taken", 0))
    stripped = strip_veronica_baggage()  # the SDK injects all current baggage
    try:
        result = wrapped(*args, **kwargs)
    except BaseException as exc:
        if state is not None:
            _note_attempt(state, exc)
        raise
    finally:
        if stripped is not None:
            otel_context.detach(stripped)  # type: ignore[arg-type]
    if state is not None:
        state.replied = True
        _tag(result, state)
    return result


async def _aattempt(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    state = _ACTIVE.get()
    if state is not None:
        retries_taken = kwargs.get("retries_taken", 0)
        if isinstance(retries_taken, int) and retries_taken > state.retries:
            await state.call.ctx.aconsume_retry()
        try:
            await state.call.ctx.aensure_active()  # a store poll awaited; then the same checks
        except BudgetExceededError as exc:
            if _stops(state, exc) or (isinstance(retries_taken, int) and retries_taken > 0):
                raise
        _before_send(state, retries_taken, drawn=True)
    stripped = strip_veronica_baggage()
    try:
        result = await wrapped(*args, **kwargs)
    except BaseException as exc:
        if state is not None:
            _note_attempt(state, exc)
        raise
    finally:
        if stripped is not None:
            otel_context.detach(stripped)  # type: ignore[arg-type]
    if state is not None:
        state.replied = True
        _tag(result, state)
    return result


# -- retries (releases whose retry loop has no per-attempt hook) ----------------


def _note_retried(state: _CallState, kwargs: dict[str, Any]) -> None:
    """Note the failed attempt the SDK is about to retry: an HTTP error reply
    (``response=``), else the error being handled (None: assume it was lost)."""
    if kwargs.get("response") is not None:
        state.replied = True
        return
    error = sys.exc_info()[1]
    if error is None:
        state.call.lost_attempts += 1
    else:
        _note_failure(state, error)


def _sleep_for_retry(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    state = _ACTIVE.get()
    if state is not None:
        _note_retried(state, kwargs)
        _before_send(state, int(kwargs.get("retries_taken", 0)) + 1)
    result = wrapped(*args, **kwargs)
    if state is not None:
        state.call.check_alive()  # the deadline may have passed while backing off
    return result


async def _asleep_for_retry(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    state = _ACTIVE.get()
    if state is not None:
        _note_retried(state, kwargs)
        retries_taken = int(kwargs.get("retries_taken", 0)) + 1
        if retries_taken > state.retries:
            await state.call.ctx.aconsume_retry()
        await state.call.ctx.aensure_active()
        _before_send(state, retries_taken, drawn=True)
    result = await wrapped(*args, **kwargs)
    if state is not None:
        await state.call.ctx.aensure_active()
    return result


# -- payloads (every parsed body and stream event) -------------------------------


def _process_response_data(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    _read_payload(_state_of(kwargs.get("response")), kwargs)
    return wrapped(*args, **kwargs)


def _process_untagged_data(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """As :func:`_process_response_data` where no attempt hook tags the response:
    a payload parsed inside ``request()`` is the call in flight's."""
    state = _state_of(kwargs.get("response"))
    _read_payload(state if state is not None else _ACTIVE.get(), kwargs)
    return wrapped(*args, **kwargs)


def _read_payload(state: _CallState | None, kwargs: dict[str, Any]) -> None:
    if state is not None and not state.call.done:
        try:
            _account(state, kwargs.get("data"))
        except BudgetExceededError as exc:
            # Settle before the SDK ends its span on the error we raise.
            state.call.finish(exc)
            raise
        except Exception:
            _logger.exception("reading usage from an anthropic payload failed")


# -- the instrumentor -------------------------------------------------------------

# Each hook and the parameters our wrapper reads (checked before any is wrapped).
_ATTEMPTS = (
    Hook("SyncAPIClient", "_attempt_request", _attempt, ("options",), ("retries_taken",)),
    Hook("AsyncAPIClient", "_attempt_request", _aattempt, ("options",), ("retries_taken",), True),
    Hook("BaseClient", "_process_response_data", _process_response_data, (), ("data", "response")),
)
_PATCHES = (
    # Its own spans: once per API call inside the SDK's span (kwarg ``call``).
    HookSet(
        "anthropic >= 1.0, < 3",
        (
            Hook("SyncAPIClient", "_request", _request, ("cast_to", "options"), ("call",)),
            Hook("AsyncAPIClient", "_request", _arequest, ("cast_to", "options"), ("call",), True),
            *_ATTEMPTS,
        ),
    ),
    # Per-attempt middleware, no spans of its own.
    HookSet(
        "anthropic >= 0.70, < 2",
        (
            Hook("SyncAPIClient", "request", _request, ("cast_to", "options")),
            Hook("AsyncAPIClient", "request", _arequest, ("cast_to", "options"), (), True),
            *_ATTEMPTS,
        ),
    ),
    # The retry loop in request(), as the openai SDK's.
    HookSet(
        "anthropic >= 0.70, < 1",
        (
            Hook("SyncAPIClient", "request", _request, ("cast_to", "options")),
            Hook("AsyncAPIClient", "request", _arequest, ("cast_to", "options"), (), True),
            Hook("SyncAPIClient", "_sleep_for_retry", _sleep_for_retry, (), ("retries_taken",)),
            Hook(
                "AsyncAPIClient",
                "_sleep_for_retry",
                _asleep_for_retry,
                (),
                ("retries_taken",),
                True,
            ),
            Hook(
                "BaseClient",
                "_process_response_data",
                _process_untagged_data,
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

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments
