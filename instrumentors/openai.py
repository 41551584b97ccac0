"""Containment for the ``openai`` SDK (3.x).

Usage::

    from veronica_otel.instrumentors.openai import OpenAIInstrumentor

    OpenAIInstrumentor().instrument()
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)):
        client.chat.completions.create(...)   # raises BudgetExceededError when over

Configuration: limits come from the active :class:`ExecutionContext`, else the
process default chain (zero-code: ``VERONICA_*`` variables). With neither,
calls pass through untouched.

Where it hooks (every HTTP API call of the SDK passes through these, including
``parse`` helpers that bypass ``create``):

- ``SyncAPIClient.request`` / ``AsyncAPIClient.request``: once per API call.
  Opens the GenAI span, runs the pre-call check, clamps the output cap when
  the request sets none, swaps in a fallback model, settles the call.
- ``SyncAPIClient._sleep_for_retry`` / ``AsyncAPIClient._sleep_for_retry``:
  the SDK's request loop calls it before every internal retry and nowhere
  else. A retry over ``max_retries_total`` is refused before its backoff is
  slept, and the deadline and sticky trips are re-checked after it, so a retry
  never leaves after the chain stopped. The first attempt was checked at
  admission, so the success path pays no per-attempt hook.
- ``BaseClient._process_response_data``: every parsed payload, stream events
  included. Records usage, keeps streamed text, and cuts a stream at the next
  chunk once the chain trips or its deadline passes. A payload parsed inside
  ``request()`` belongs to the call in flight; a stream or raw response read
  later finds its call on its HTTP request (bound when ``request()`` returns).

A streamed call is settled when its HTTP response closes, whoever closes it:
the end of the stream, a cut, ``close()``, or the ``stream()`` helpers, which
close the response directly.

What a call that did not end well costs (DESIGN G10) is read without a hook
on the success path: the retry hook sees each retried attempt's error (an
HTTP reply, or the transport error being handled) and the last attempt is
read from how ``request()`` ended. A connection never made (``ConnectError``,
``ConnectTimeout``, ``PoolTimeout``) was not sent; an ``APIStatusError`` is a
reply, billed nothing; anything else once the send began (a timeout, a lost
connection, a cancellation, KeyboardInterrupt) may have reached the provider
and costs the reservation. An interrupt or cancellation is placed by its
traceback: raised inside ``_send_request`` or ``_process_response`` means
after the request may have left, anywhere else means before.

Layout (as contrib's ``openai_v2``): this module is what is patched and the
wrappers; ``_openai_request`` reads and rewrites a request (route, body, cap,
the call described for the kernel, its span); ``_openai_response`` reads how
a call ended (reply, stream events, usage, error) and settles it.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from collections.abc import Collection
from typing import Any

from opentelemetry import context as otel_context

from veronica_otel._errors import BudgetExceededError

from ._common import settle_failed, strip_veronica_baggage
from ._hooks import GuardedInstrumentor, Hook, SDKHooks
from ._openai_request import PROVIDER, _aprepare, _CallState, _prepare
from ._openai_response import _CALL_KEY, _account, _fail, _note_attempt, _settle

__all__ = ["OpenAIInstrumentor"]

_logger = logging.getLogger(__name__)
_instruments = ("openai >= 3.0, < 4",)

_ACTIVE: contextvars.ContextVar[_CallState | None] = contextvars.ContextVar(
    "veronica_openai_call", default=None
)


# -- wrappers ------------------------------------------------------------------------


def _request(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    options = args[1] if len(args) > 1 else kwargs.get("options")
    state = _prepare(options, bool(kwargs.get("stream")), instance)
    if state is None:
        return wrapped(*args, **kwargs)
    active = _ACTIVE.set(state)
    stripped = strip_veronica_baggage(state.baggage)
    try:
        result = wrapped(*args, **kwargs)
    except BaseException as exc:
        _fail(state, exc)
        raise
    finally:
        if stripped is not None:
            otel_context.detach(stripped)  # type: ignore[arg-type]
        _ACTIVE.reset(active)
        if state.span_token is not None:
            otel_context.detach(state.span_token)  # type: ignore[arg-type]
    try:
        return _settle(state, result)
    except Exception:
        return settle_failed(state.call, result, _logger, PROVIDER)


async def _arequest(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    options = args[1] if len(args) > 1 else kwargs.get("options")
    state = await _aprepare(options, bool(kwargs.get("stream")), instance)
    if state is None:
        return await wrapped(*args, **kwargs)
    active = _ACTIVE.set(state)
    stripped = strip_veronica_baggage(state.baggage)
    call = state.call
    try:
        result = await wrapped(*args, **kwargs)
    except BaseException as exc:
        call.defer_settlement()  # decided by the sync code, then awaited
        try:
            _fail(state, exc)
        finally:
            await call.settle_deferred()
        raise
    finally:
        if stripped is not None:
            otel_context.detach(stripped)  # type: ignore[arg-type]
        _ACTIVE.reset(active)
        if state.span_token is not None:
            otel_context.detach(state.span_token)  # type: ignore[arg-type]
    call.defer_settlement()
    try:
        result = _settle(state, result)
    except Exception:
        result = settle_failed(state.call, result, _logger, PROVIDER)
    finally:
        await call.settle_deferred()
    return result


def _draw_retry(state: _CallState, attempt: int) -> None:
    """Draw the retry that makes attempt ``attempt`` from ``max_retries_total``."""
    call = state.call
    while state.retries < attempt:
        call.ctx.consume_retry()  # raises BudgetExceededError: the SDK loop stops
        state.retries += 1
    if call.span.is_recording():
        call.span.set_attribute("veronica.retries", state.retries)


def _retry_state(kwargs: dict[str, Any]) -> _CallState | None:
    """Note the failed attempt, then draw the coming retry from the chain.

    The SDK calls its retry sleep inside the ``except`` for a timeout or a
    connection error (``response=None``; the error is the one being handled),
    or after an HTTP error reply (``response=`` that reply).
    """
    state = _ACTIVE.get()
    if state is not None:
        _note_retry(state, kwargs)
        _draw_retry(state, int(kwargs.get("retries_taken", 0)) + 1)
        state.call.check_alive()  # a retry is a new dispatch: any trip stops it
    return state


def _note_retry(state: _CallState, kwargs: dict[str, Any]) -> None:
    if kwargs.get("response") is not None:
        state.replied = True
    else:
        _note_attempt(state, sys.exc_info()[1])


def _sleep_for_retry(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    state = _retry_state(kwargs)
    result = wrapped(*args, **kwargs)
    if state is not None:
        state.call.check_alive()  # the deadline may have passed while backing off
    return result


async def _asleep_for_retry(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    state = _ACTIVE.get()
    if state is not None:
        # As _retry_state, the retries drawn with the store awaited.
        _note_retry(state, kwargs)
        attempt = int(kwargs.get("retries_taken", 0)) + 1
        while state.retries < attempt:
            await state.call.ctx.aconsume_retry()
            state.retries += 1
        _draw_retry(state, attempt)  # drawn already: the count goes on the span
        await state.call.ctx.aensure_active()
    result = await wrapped(*args, **kwargs)
    if state is not None:
        await state.call.ctx.aensure_active()
    return result


def _process_response_data(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    try:  # the call _bind put on a response read after request() returned
        state = kwargs["response"].request.extensions.get(_CALL_KEY)
    except (KeyError, AttributeError, RuntimeError):
        state = None
    later = type(state) is _CallState  # bound by _settle: read after request() returned
    if not later:
        state = _ACTIVE.get()  # parsed inside request(): the call in flight
    if state is not None and not state.call.done:
        try:
            _account(state, kwargs.get("data"))
        except BudgetExceededError:
            raise  # cuts the stream: its generator closes the response
        except Exception:
            _logger.exception("reading usage from an openai payload failed")
        call = state.call
        if later and call.usage_seen and not state.streamed:
            call.finish()  # a raw response parsed after request() returned
    return wrapped(*args, **kwargs)


# Each hook and the parameters our wrapper reads (checked before any is wrapped).
_PATCHES = (
    Hook("SyncAPIClient", "request", _request, ("cast_to", "options"), ("stream",)),
    Hook("AsyncAPIClient", "request", _arequest, ("cast_to", "options"), ("stream",), True),
    Hook("SyncAPIClient", "_sleep_for_retry", _sleep_for_retry, (), ("retries_taken",)),
    Hook("AsyncAPIClient", "_sleep_for_retry", _asleep_for_retry, (), ("retries_taken",), True),
    Hook("BaseClient", "_process_response_data", _process_response_data, (), ("data", "response")),
)
# Where calls are refused when the hooks do not fit: public, every API call passes.
_GUARDS = (("SyncAPIClient", ("request", "post")), ("AsyncAPIClient", ("request", "post")))
_HOOKS = SDKHooks(_instruments[0], "openai._base_client", _PATCHES, _GUARDS)


class OpenAIInstrumentor(GuardedInstrumentor):
    """Contains every HTTP API call of the ``openai`` SDK in the active chain.

    ``instrument()`` raises :class:`~veronica_otel.instrumentors.InstrumentationError`
    when the installed ``openai`` is outside the tested range or a hook changed;
    nothing is patched and calls in a chain are refused (fail closed).
    """

    _hooks = _HOOKS

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments
