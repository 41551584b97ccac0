"""The hooks of a Stainless-generated SDK that speaks the OpenAI wire format.

``openai`` (2.x and 3.x) and ``groq`` share one generated base client
(``<package>._base_client``): the same request loop, retry sleep and payload
parsing. :func:`stainless_hooks` builds the wrappers for one of them
(:class:`~._openai_request.Stainless`: its package and provider name); the
instrumentor module of each SDK declares its supported range and holds the
hooks. What each hook does is documented in
:mod:`veronica_otel.instrumentors.openai`.

Counted once (DESIGN G13): a call an outer adapter already admitted (litellm
over the ``openai`` SDK) passes through; while a call we admitted runs, it is
:data:`~._adapter.ADMITTED`, so the HTTP layer under the SDK does not admit
it again. These SDKs report their own retries (``_sleep_for_retry``), so the
call leaves ``http_attempts`` False: its attempts are not counted twice.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context

from veronica_otel._errors import BudgetExceededError

from ._adapter import ADMITTED
from ._common import settle_failed, strip_veronica_baggage
from ._endpoints import OPENAI as OPENAI_ENDPOINTS
from ._endpoints import endpoint_call
from ._hooks import Hook
from ._openai_request import Stainless, _aprepare, _CallState, _prepare
from ._openai_response import _CALL_KEY, _account, _fail, _note_attempt, _settle

__all__ = ["stainless_hooks"]

_logger = logging.getLogger(__name__.rpartition(".")[0] + ".openai")


def _draw_retry(state: _CallState, attempt: int) -> None:
    """Draw the retry that makes attempt ``attempt`` from ``max_retries_total``."""
    call = state.call
    while state.retries < attempt:
        call.ctx.consume_retry()  # raises BudgetExceededError: the SDK loop stops
        state.retries += 1
    if call.span.is_recording():
        call.span.set_attribute("veronica.retries", state.retries)


def _note_retry(state: _CallState, kwargs: dict[str, Any]) -> None:
    """Note the failed attempt the SDK is about to retry.

    The SDK calls its retry sleep inside the ``except`` for a timeout or a
    connection error (``response=None``; the error is the one being handled),
    or after an HTTP error reply (``response=`` that reply).
    """
    if kwargs.get("response") is not None:
        state.replied = True
    else:
        _note_attempt(state, sys.exc_info()[1])


_Active = contextvars.ContextVar[_CallState | None]
_Wrapper = Callable[..., Any]


def stainless_hooks(sdk: Stainless) -> tuple[Hook, ...]:
    """The hooks of ``sdk``'s base client, each with the parameters its wrapper reads."""
    # The call in flight inside request(), for the per-attempt and payload hooks.
    active: _Active = contextvars.ContextVar(f"veronica_{sdk.package}_call", default=None)
    request, arequest = _sync_request(sdk, active), _async_request(sdk, active)
    sleep_for_retry, asleep_for_retry = _retry_wrappers(active)
    return (
        Hook("SyncAPIClient", "request", request, ("cast_to", "options"), ("stream",)),
        Hook("AsyncAPIClient", "request", arequest, ("cast_to", "options"), ("stream",), True),
        Hook("SyncAPIClient", "_sleep_for_retry", sleep_for_retry, (), ("retries_taken",)),
        Hook("AsyncAPIClient", "_sleep_for_retry", asleep_for_retry, (), ("retries_taken",), True),
        Hook(
            "BaseClient",
            "_process_response_data",
            _payload_wrapper(sdk, active),
            (),
            ("data", "response"),
        ),
    )


def _sync_request(sdk: Stainless, active: _Active) -> _Wrapper:
    """``request`` (once per API call): admission, the marks, settlement."""
    endpoint = endpoint_call(OPENAI_ENDPOINTS, sdk.provider)[0]

    def request(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        options = args[1] if len(args) > 1 else kwargs.get("options")
        state = _prepare(options, bool(kwargs.get("stream")), instance, sdk)
        if state is None:  # not a token call: a billable endpoint of another kind, or free
            return endpoint(wrapped, instance, args, kwargs)
        token = active.set(state)
        mark = ADMITTED.set(state.call)
        stripped = strip_veronica_baggage(state.baggage)
        try:
            result = wrapped(*args, **kwargs)
        except BaseException as exc:
            _fail(state, exc)
            raise
        finally:
            if stripped is not None:
                otel_context.detach(stripped)  # type: ignore[arg-type]
            ADMITTED.reset(mark)
            active.reset(token)
            if state.span_token is not None:
                otel_context.detach(state.span_token)  # type: ignore[arg-type]
        try:
            return _settle(state, result)
        except Exception:
            return settle_failed(state.call, result, _logger, sdk.provider)

    return request


def _async_request(sdk: Stainless, active: _Active) -> _Wrapper:
    """The async client's ``request``."""
    aendpoint = endpoint_call(OPENAI_ENDPOINTS, sdk.provider)[1]

    async def arequest(
        wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        options = args[1] if len(args) > 1 else kwargs.get("options")
        state = await _aprepare(options, bool(kwargs.get("stream")), instance, sdk)
        if state is None:
            return await aendpoint(wrapped, instance, args, kwargs)
        token = active.set(state)
        mark = ADMITTED.set(state.call)
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
            ADMITTED.reset(mark)
            active.reset(token)
            if state.span_token is not None:
                otel_context.detach(state.span_token)  # type: ignore[arg-type]
        call.defer_settlement()
        try:
            result = _settle(state, result)
        except Exception:
            result = settle_failed(state.call, result, _logger, sdk.provider)
        finally:
            await call.settle_deferred()
        return result

    return arequest


def _retry_wrappers(active: _Active) -> tuple[_Wrapper, _Wrapper]:
    """``_sleep_for_retry`` (before each SDK retry): the retry drawn, trips re-checked."""

    def sleep_for_retry(
        wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        state = active.get()
        if state is not None:
            _note_retry(state, kwargs)
            _draw_retry(state, int(kwargs.get("retries_taken", 0)) + 1)
            state.call.check_alive()  # a retry is a new dispatch: any trip stops it
        result = wrapped(*args, **kwargs)
        if state is not None:
            state.call.check_alive()  # the deadline may have passed while backing off
        return result

    async def asleep_for_retry(
        wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        state = active.get()
        if state is not None:
            # As sleep_for_retry, the retries drawn with the store awaited.
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

    return sleep_for_retry, asleep_for_retry


def _payload_wrapper(sdk: Stainless, active: _Active) -> _Wrapper:
    """``_process_response_data`` (every payload, stream events included): usage read."""

    def process_response_data(
        wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        try:  # the call _bind put on a response read after request() returned
            state = kwargs["response"].request.extensions.get(_CALL_KEY)
        except (KeyError, AttributeError, RuntimeError):
            state = None
        later = type(state) is _CallState  # bound by _settle: read after request() returned
        if not later:
            state = active.get()  # parsed inside request(): the call in flight
        if state is not None and not state.call.done:
            try:
                _account(state, kwargs.get("data"))
            except BudgetExceededError:
                raise  # cuts the stream: its generator closes the response
            except Exception:
                _logger.exception("reading usage from a %s payload failed", sdk.package)
            call = state.call
            if later and call.usage_seen and not state.streamed:
                call.finish()  # a raw response parsed after request() returned
        return wrapped(*args, **kwargs)

    return process_response_data


# Where calls are refused when the hooks do not fit: public, every API call passes.
GUARDS = (("SyncAPIClient", ("request", "post")), ("AsyncAPIClient", ("request", "post")))
