"""Admitting an LLM API call: describe it once, ask the kernel once.

An instrumentor reads its request into a :class:`~veronica_otel._call_spec.CallSpec`
(the input bound from :func:`input_bound`) and calls :func:`admit` (or
:func:`aadmit`), which asks ``ExecutionContext.admit_call`` once (breaker,
prices, clamp, policies, the reservation, the fallback) and turns the answer
into a :class:`~veronica_otel.instrumentors._common.ContainedCall` with the
call's span attributes. A denial or a failure marks the span, frees the
endpoint's half-open probe and holds nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from opentelemetry.trace import Span

from veronica_otel._admission import RoomBusy
from veronica_otel._attributes import (
    AGENT,
    CHAIN_ID,
    CLAMPED_MAX_TOKENS,
    DECISION,
    FALLBACK_MODEL,
    GEN_AI_REQUEST_MAX_TOKENS,
    GEN_AI_REQUEST_MODEL,
    POOL,
)
from veronica_otel._breaker import CircuitBreaker
from veronica_otel._call import CallHandle
from veronica_otel._call_spec import Admitted, CallSpec
from veronica_otel._context import ExecutionContext
from veronica_otel._errors import BudgetExceededError
from veronica_otel._pricing import TOKENS_PER_MESSAGE, TOKENS_PER_REQUEST

from ._breakers import _breakers as _BREAKERS  # read-only here: a dict hit, no call
from ._breakers import endpoint_breaker, forget_unused
from ._common import UNTRACED_SPAN, ContainedCall, _note_trip

__all__ = ["CallSpec", "aadmit", "admit", "input_bound"]

_new = object.__new__

_logger = logging.getLogger(__name__)


def input_bound(parts: object, n_messages: int) -> int:
    """A conservative bound on input tokens: UTF-8 bytes of every string in the input.

    Keys, roles and punctuation are counted too, so the sum is at least the
    bytes of the text the provider tokenises, and no byte-level BPE token is
    shorter than one byte. Walking the strings is linear in their number,
    not their size (``len`` of an ASCII str is O(1) and exact in bytes).
    """
    # The same sum as estimate_input_tokens_from_bytes, without re-validating
    # counts this module computed itself (it runs before every call).
    return _utf8_bytes(parts) + max(1, n_messages) * TOKENS_PER_MESSAGE + TOKENS_PER_REQUEST


def _utf8_bytes(value: object) -> int:
    # Exact-type paths for what JSON request bodies are made of (str, dict,
    # list, None), with no exception and no ABC check on the way: a list or a
    # dict handles its str, None, list and dict items inline, so a message
    # with a content-block list (Gemini ``contents[].parts[]``, Converse
    # ``content`` blocks) costs one frame per container. The count is the
    # general walk's, exactly; everything else takes it.
    kind = type(value)
    if kind is str:
        text: str = value  # type: ignore[assignment]
        return len(text) if text.isascii() else len(text.encode("utf-8"))
    if kind is list:
        return _list_bytes(value)  # type: ignore[arg-type]
    if kind is dict:
        return _dict_bytes(value)  # type: ignore[arg-type]
    if value is None:
        return 4  # len(str(None))
    return _utf8_bytes_any(value)


def _list_bytes(sequence: list[object]) -> int:
    total = len(sequence)  # 1 per item
    if total and type(sequence[-1]) is list:
        # A request's input parts, [messages] or [system, messages]: the last
        # list's items walked in this frame after the others, not in a frame
        # of their own (the same sum: 1 per item of each list, then its bytes).
        inner: list[object] = sequence[-1]
        sequence = inner if total == 1 else [*sequence[:-1], *inner]
        total += len(inner)
    for item in sequence:
        kind = type(item)
        if kind is dict:
            # _dict_bytes, inline for its common case (a message: string keys
            # and values), one frame less a message; any other value is walked
            # by _utf8_bytes, as _dict_bytes walks it.
            message: dict[str, object] = item  # type: ignore[assignment]
            try:
                keys = "".join(message)
            except TypeError:  # a key that is not a str
                total += _dict_bytes(item)  # type: ignore[arg-type]
                continue
            total += 2 * len(message) + (len(keys) if keys.isascii() else len(keys.encode("utf-8")))
            for value in message.values():
                if type(value) is str:
                    total += len(value) if value.isascii() else len(value.encode("utf-8"))
                else:
                    total += _utf8_bytes(value)
        elif kind is str:
            text: str = item  # type: ignore[assignment]
            total += len(text) if text.isascii() else len(text.encode("utf-8"))
        elif kind is list:
            total += _list_bytes(item)  # type: ignore[arg-type]
        elif item is None:
            total += 4
        else:
            total += _utf8_bytes_any(item)
    return total


def _dict_bytes(mapping: dict[object, object]) -> int:
    # The keys are strings in every request body: one C-level join measures them.
    try:
        keys = "".join(mapping)  # type: ignore[arg-type]
    except TypeError:  # a key that is not a str
        return sum(_utf8_bytes(k) + _utf8_bytes(v) + 2 for k, v in mapping.items())
    total = 2 * len(mapping) + (len(keys) if keys.isascii() else len(keys.encode("utf-8")))
    for item in mapping.values():
        kind = type(item)
        if kind is str:
            text: str = item  # type: ignore[assignment]
            total += len(text) if text.isascii() else len(text.encode("utf-8"))
        elif kind is list:
            total += _list_bytes(item)  # type: ignore[arg-type]
        elif kind is dict:
            total += _dict_bytes(item)  # type: ignore[arg-type]
        elif item is None:
            total += 4
        else:
            total += _utf8_bytes_any(item)
    return total


_SCALARS = frozenset((int, float, bool))


def _utf8_bytes_any(value: object) -> int:
    if type(value) in _SCALARS:  # exact: no ABC check for a number in a body
        return len(str(value))
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode("utf-8"))
    if isinstance(value, Mapping):
        return sum(_utf8_bytes(k) + _utf8_bytes(v) + 2 for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(_utf8_bytes(item) + 1 for item in value)
    if value is None or isinstance(value, (bool, int, float)):
        return len(str(value))
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    return len(str(value).encode("utf-8"))  # pydantic params and the like


def admit(
    ctx: ExecutionContext, span: Span, owns_span: bool, spec: CallSpec
) -> tuple[ContainedCall, int | None, str | None]:
    """Run the pre-call check for the call ``spec`` describes.

    Returns the call, the output cap to send (None: leave the request's own)
    and a fallback model to send instead (None: keep the model). Raises
    BudgetExceededError (after marking ``span``) when the call may not run.
    """
    provider, _, model, bound, _, _, _, _, _, _, _ = spec  # one read of its fields
    breaker = _BREAKERS.get((provider, model)) or endpoint_breaker(provider, model)
    probe = object()  # identifies this call if it becomes the half-open probe
    try:
        answer = ctx._admission.admit_call(spec, breaker, probe)  # ctx.admit_call's, one hop less
    except BaseException as exc:
        # Denied, or our own failure (a store down, an interrupt): nothing is
        # held, and the half-open probe must not stay taken.
        _abandon(breaker, probe, None, span, owns_span, ctx, exc)
        forget_unused(provider, model, breaker)  # a denial fills no table
        raise
    handle, cap, clamped, _, fallback, prices = answer
    try:
        # _contained, inline (once per sync call), with ContainedCall.__init__'s
        # stores, in its order, without its frame
        call = _new(ContainedCall)
        call.ctx = ctx
        call.handle = handle
        call.span = span
        call.owns_span = owns_span
        call.provider = provider
        call.model = model if fallback is None else fallback
        call.prices = prices
        call.input_bound = bound
        call.output_cap = cap
        call.breaker, call.probe = breaker, probe
        if span is not UNTRACED_SPAN and span.is_recording():  # no TracerProvider: no frame
            _record_admission(ctx, span, owns_span, call, answer)
    except BaseException as exc:
        _abandon(breaker, probe, handle, span, owns_span, ctx, exc)
        raise
    return call, clamped, fallback


async def aadmit(
    ctx: ExecutionContext, span: Span, owns_span: bool, spec: CallSpec
) -> tuple[ContainedCall, int | None, str | None]:
    """:func:`admit` for async calls: the store reads and the reservation are
    awaited (a shared store never blocks the event loop). Settle with ``afinish``."""
    breaker = _BREAKERS.get((spec.provider, spec.model)) or endpoint_breaker(
        spec.provider, spec.model
    )
    probe = object()
    local = not ctx.awaits_store
    try:
        if local:  # in process: nothing to await, unless the call must wait for room
            try:
                answer = ctx._admission.admit_call(spec, breaker, probe, True)
            except RoomBusy as busy:
                answer = await _room_freed(ctx, spec, breaker, probe, busy.until)
        else:
            answer = await ctx.aadmit_call(spec, breaker, probe)
    except BaseException as exc:  # denied, failed or cancelled: nothing is held
        _abandon(breaker, probe, None, span, owns_span, ctx, exc)
        forget_unused(spec.provider, spec.model, breaker)  # a denial fills no table
        raise
    try:
        return _contained(ctx, span, owns_span, spec, answer, breaker, probe)
    except BaseException as exc:
        if local:
            _abandon(breaker, probe, answer.handle, span, owns_span, ctx, exc)
        else:
            await _aabandon(breaker, probe, answer.handle, span, owns_span, ctx, exc)
        raise


async def _room_freed(
    ctx: ExecutionContext, spec: CallSpec, breaker: CircuitBreaker, probe: object, until: float
) -> Admitted:
    """Admit an async call refused only by in-flight reservations (in process)
    once they settle: asked again as the event loop runs them, until it fits,
    is refused on committed spend, or ``until``; then asked one last time,
    refused (and announced) as any call."""
    for pause in ctx._admission.room_polls(until):
        breaker.release_probe(probe)  # the next ask may take it again
        await asyncio.sleep(pause)
        try:
            return ctx.admit_call(spec, breaker, probe, True)
        except RoomBusy:
            continue
    breaker.release_probe(probe)
    return ctx.admit_call(spec, breaker, probe)  # on a loop: refused, not waiting


def _contained(
    ctx: ExecutionContext,
    span: Span,
    owns_span: bool,
    spec: CallSpec,
    answer: Admitted,
    breaker: CircuitBreaker,
    probe: object,
) -> tuple[ContainedCall, int | None, str | None]:
    """The admitted call, collecting its usage, with its admission on its span."""
    fallback = answer.fallback
    call = ContainedCall(
        ctx,
        answer.handle,
        span,
        owns_span,
        spec.provider,
        spec.model if fallback is None else fallback,
        answer.prices,
        spec.input_bound,
        answer.cap,
    )
    call.breaker, call.probe = breaker, probe
    if span is not UNTRACED_SPAN and span.is_recording():  # no TracerProvider: no frame
        _record_admission(ctx, span, owns_span, call, answer)
    return call, answer.clamped, fallback


def _record_admission(
    ctx: ExecutionContext,
    span: Span,
    owns_span: bool,
    call: ContainedCall,
    answer: Admitted,
) -> None:
    """The admission's attributes: on our span with the end's (one SDK call),
    at once on a span not ours (the SDK's own may end before us)."""
    attributes: dict[str, Any] = {
        CHAIN_ID: ctx.chain_id,
        DECISION: "ALLOW",
    }
    handle, cap, clamped, pool, fallback, _ = answer
    if cap is not None:
        attributes[GEN_AI_REQUEST_MAX_TOKENS] = cap
    if clamped is not None:
        attributes[CLAMPED_MAX_TOKENS] = clamped
        if pool is not None:  # a budget pool had less room than the chain
            attributes[POOL] = pool
    if fallback is not None:
        attributes[FALLBACK_MODEL] = fallback
        attributes[GEN_AI_REQUEST_MODEL] = fallback
    agents = handle.agents
    if agents is not None:  # an agent's own limits bound this call
        attributes[AGENT] = agents[1]
    if owns_span:
        call.pending_attributes = attributes
    else:
        _set_span_attributes(span, attributes)


def _abandon(
    breaker: CircuitBreaker,
    probe: object,
    handle: CallHandle | None,
    span: Span,
    owns_span: bool,
    ctx: ExecutionContext,
    error: BaseException,
) -> None:
    """Undo an admission that did not complete: nothing was sent."""
    try:
        breaker.release_probe(probe)
        if handle is not None:
            handle.finish(error, sent=False)
    except Exception:
        _logger.exception("releasing an abandoned admission failed")
    finally:
        _mark_denied(span, owns_span, ctx, error)


async def _aabandon(
    breaker: CircuitBreaker,
    probe: object,
    handle: CallHandle,
    span: Span,
    owns_span: bool,
    ctx: ExecutionContext,
    error: BaseException,
) -> None:
    """:func:`_abandon` of an async admission that holds a reservation."""
    try:
        breaker.release_probe(probe)
        await handle.afinish(error, sent=False)
    except Exception:
        _logger.exception("releasing an abandoned admission failed")
    finally:
        _mark_denied(span, owns_span, ctx, error)


def _set_span_attributes(span: Span, attributes: dict[str, Any]) -> None:
    try:
        span.set_attributes(attributes)
    except Exception:
        _logger.exception("recording the call on its span failed")


def _mark_denied(
    span: Span, owns_span: bool, ctx: ExecutionContext, error: BaseException | None = None
) -> None:
    try:
        if span.is_recording():
            span.set_attribute(CHAIN_ID, ctx.chain_id)
            span.set_attribute(DECISION, "HALT")
            span.set_attribute(
                "error.type",
                "BudgetExceededError" if error is None else type(error).__qualname__,
            )
            if isinstance(error, BudgetExceededError) and error.pool is not None:
                span.set_attribute(POOL, error.pool)
            if isinstance(error, BudgetExceededError) and error.agent is not None:
                span.set_attribute(AGENT, error.agent)
            _note_trip(span, error, ctx)
    except Exception:
        _logger.exception("recording the denial on its span failed")
    finally:
        if owns_span:
            span.end()
