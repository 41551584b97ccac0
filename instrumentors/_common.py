"""What every LLM instrumentor shares once a call is admitted (``_admit.py``).

:class:`ContainedCall` collects usage as it arrives and commits exactly once.
:class:`ContainedStream` and :class:`AsyncContainedStream` are ``wrapt``
proxies around SDK streams that cut the stream at the next chunk once the
chain trips or its deadline passes, keep the text received so far, and settle
the call on exhaustion, error, close or garbage collection.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import operator
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextvars import ContextVar, Token
from typing import Any

import wrapt
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY as _SUPPRESS_KEY
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation import _SPAN_KEY

from veronica_otel._attributes import (
    BAGGAGE_PREFIX,
    COST_USD,
    GEN_AI_AGENT_NAME,
    GEN_AI_OPERATION_NAME,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    RETRIES,
    TRIP_EVENT,
)
from veronica_otel._breaker import CircuitBreaker, CircuitState
from veronica_otel._chain_span import remaining_attributes
from veronica_otel._context import CallHandle, ExecutionContext
from veronica_otel._errors import BudgetExceededError
from veronica_otel._gc_safe import defer
from veronica_otel._pricing import UnitPrices
from veronica_otel._trips import trip_attributes
from veronica_otel._units import MAX_COUNT, NANO_PER_USD
from veronica_otel._version import __version__

from ._breakers import classify_outcome

__all__ = [
    "AsyncContainedStream",
    "ContainedCall",
    "ContainedStream",
    "attribute_value",
    "client_attributes",
    "server_attributes",
    "strip_veronica_baggage",
    "token_count",
    "tracer",
    "UNTRACED_SPAN",
    "make_current",
    "release_current",
    "no_item",
    "not_none",
    "settle_failed",
    "without_veronica_baggage",
]

_logger = logging.getLogger(__name__)
tracer = trace.get_tracer("veronica_otel.instrumentors", __version__)
_CLOSED = CircuitState.CLOSED
_SUPPRESS_KEY_PLAIN = "suppress_instrumentation"  # the older key is_instrumentation_enabled reads

# Usage handler: (call, payload) -> None; reads usage and text from one payload.
PayloadHandler = Callable[["ContainedCall", Any], None]


#: ``value is not None`` as one C call (``filter(not_none, ...)``: no comprehension frame).
not_none: Callable[[object], bool] = functools.partial(operator.is_not, None)


def token_count(value: object) -> int | None:
    """A token count from a payload, capped at ``MAX_COUNT``; None when it is not one.

    Whole and fractional non-negative numbers are counts (JSON's ``1e26`` is a
    float); negatives, NaN, bools, strings and the rest are unreadable.
    """
    kind = type(value)
    if kind is int:
        number: int = value  # type: ignore[assignment]
        return min(number, MAX_COUNT) if number >= 0 else None
    if kind is float:
        real: float = value  # type: ignore[assignment]
        if real >= 0:  # False for NaN
            return MAX_COUNT if real >= MAX_COUNT else math.ceil(real)
    return None


def _detail(value: object) -> int | None:
    # Usage details are optional: absent is zero, present must be a count.
    return 0 if value is None else token_count(value)


# The most any ledger holds exactly (the store's numbers are doubles): a cost
# past it is clamped here so that an absurd usage report trips the chain
# instead of raising into the caller.
_MAX_EXACT = 2**53 - 1


class ContainedCall:
    """One admitted API call: its reservation, its span and its usage so far."""

    # Usage and bookkeeping start from class-level defaults: a call sets only
    # what it was admitted with (this runs before every instrumented call).
    input_tokens = 0
    output_tokens = 0
    cached_tokens = 0
    cache_write_tokens = 0
    reasoning_tokens = 0
    breaker: CircuitBreaker | None = None
    probe: object | None = None
    # Attributes set on our own span when it ends (None: no span of ours records).
    pending_attributes: dict[str, Any] | None = None
    usage_seen = False
    lost_attempts = 0  # attempts that may have reached the provider, never answered
    text_bytes = 0
    done = False  # settled (a plain attribute: every payload reads it)
    _text: list[str] | None = None
    # An async call collects a settlement decided in sync code (finish) and
    # then awaits it (settle_deferred), so a shared store is never waited on
    # in the event loop.
    _defer = False
    _deferred: tuple[BaseException | None, bool, bool] | None = None
    _async_stream = False
    # What an adapter read from the request (``_adapter.Request``), and what
    # the HTTP layer saw of the call's attempts (``note_send`` and friends).
    request: Any = None
    adapter: Any = None  # the ``_adapter.ProviderAdapter`` that admitted it, if one did
    http_attempts = False  # the HTTP layer reports its attempts (note_send, ...)
    sends = 0  # attempts that began sending
    replies = 0  # attempts answered with an HTTP status line
    # Attempts as each layer saw them, and the retries drawn for them: the
    # HTTP layer's (note_send), an SDK's own per-attempt hook's (anthropic's
    # _attempt_request) and its retry loop's count each attempt after the
    # first as a retry, and draw_retries keeps them to one draw per retry.
    attempts = 0  # note_send calls (sends, and the attempts that never connected)
    tries = 0  # attempts an SDK's per-attempt hook began (begin_try)
    retries = 0  # retries drawn from max_retries_total for this call
    billed_replies = 0  # replies with a 2xx status: each generated (and billed) a reply
    # What an adapter's reply reader keeps between payloads of one call (the
    # usage a stream has reported so far, when it is read only at the end).
    reading: Any = None
    unsent = False  # an attempt failed before a byte left (the HTTP layer saw it)
    # A retry the chain refused (note_send): the caller sees it even when the
    # SDK turned it into an error of its own that does not chain to it.
    denial: BudgetExceededError | None = None

    def __init__(
        self,
        ctx: ExecutionContext,
        handle: CallHandle,
        span: Span,
        owns_span: bool,
        provider: str,
        model: str,
        prices: UnitPrices | None,
        input_tokens_bound: int,
        output_cap: int | None,
    ) -> None:
        self.ctx = ctx
        self.handle = handle
        self.span = span
        self.owns_span = owns_span
        self.provider = provider
        self.model = model
        self.prices = prices
        self.input_bound = input_tokens_bound
        self.output_cap = output_cap

    @property
    def text(self) -> list[str]:
        """The streamed text received so far, in order."""
        return [] if self._text is None else self._text

    def set_usage(
        self,
        input_tokens: object,
        output_tokens: object,
        cached: object = 0,
        reasoning: object = 0,
        cache_write: object = 0,
    ) -> bool:
        """Record the call's usage so far (totals, not increments); False if unreadable.

        Counts come from a provider's payload and are never trusted: each is
        capped at ``MAX_COUNT``, and one that is not a non-negative number
        makes the whole report unreadable, so the call is settled at its
        reservation (never raised into the caller, never taken as zero).
        """
        inp = input_tokens
        if not (type(inp) is int and 0 <= inp <= MAX_COUNT):
            inp = token_count(inp)
        out = output_tokens
        if not (type(out) is int and 0 <= out <= MAX_COUNT):
            out = token_count(out)
        if inp is None or out is None:
            self.usage_seen = False  # a later total replaces earlier ones: none now
            return False
        if cached or reasoning or cache_write:
            c, r, w = _detail(cached), _detail(reasoning), _detail(cache_write)
            if c is None or r is None or w is None:
                self.usage_seen = False
                return False
            self.cached_tokens = min(c, inp)
            self.cache_write_tokens = w
            self.reasoning_tokens = min(r, out)
        else:  # the common case: no details (or all zero), no clamping to do
            self.cached_tokens = self.cache_write_tokens = self.reasoning_tokens = 0
        self.input_tokens = inp
        self.output_tokens = out
        self.usage_seen = True
        return True

    def add_text(self, text: str) -> None:
        """Keep streamed text: it is the partial result if the stream is cut."""
        if text:
            if self._text is None:
                self._text = []
            self._text.append(text)
            self.text_bytes += len(text.encode("utf-8"))
            self.ctx.set_partial_result("".join(self._text))

    def note_send(self) -> None:
        """An HTTP attempt of this call is about to be sent (the transport's report).

        Every attempt after the first is a retry (the SDK's own, or a resend by
        a middleware or a transport): it is drawn from ``max_retries_total``
        (unless an SDK hook drew it already) and re-checked against trips and
        the deadline before it leaves, and raises BudgetExceededError otherwise.
        """
        self.attempts += 1
        attempt = self.sends  # attempts sent before this one (one never connected is not)
        if attempt:
            try:
                self.draw_retries(attempt)
                self.ctx.ensure_active()
            except BudgetExceededError as exc:
                self.denial = exc
                raise
        self.sends += 1

    async def anote_send(self) -> None:
        """:meth:`note_send` for an async transport: a shared store is awaited."""
        self.attempts += 1
        attempt = self.sends
        if attempt:
            try:
                await self.adraw_retries(attempt)
                await self.ctx.aensure_active()
            except BudgetExceededError as exc:
                self.denial = exc
                raise
        self.sends += 1

    def begin_try(self, retries_taken: int) -> bool:
        """An SDK's per-attempt hook: attempt ``tries`` begins, the SDK's
        ``retries_taken``-th retry; draws what it makes a retry and says
        whether it is one (the first attempt is not)."""
        attempt = max(self.tries, retries_taken)
        self.tries += 1
        if attempt:
            self.draw_retries(attempt)
        return attempt > 0

    async def abegin_try(self, retries_taken: int) -> bool:
        """:meth:`begin_try` for async code: a shared store is awaited."""
        attempt = max(self.tries, retries_taken)
        self.tries += 1
        if attempt:
            await self.adraw_retries(attempt)
        return attempt > 0

    def draw_retries(self, retries: int) -> None:
        """Draw from ``max_retries_total`` until ``retries`` are drawn for this call
        (each layer that sees a retry asks; it is drawn once)."""
        drawn = self.retries
        if drawn >= retries:
            return
        while drawn < retries:
            self.ctx.consume_retry()  # raises BudgetExceededError: nothing more is sent
            drawn += 1
            self.retries = drawn
        self._note_retries()

    async def adraw_retries(self, retries: int) -> None:
        """:meth:`draw_retries` with a shared store awaited."""
        drawn = self.retries
        if drawn >= retries:
            return
        while drawn < retries:
            await self.ctx.aconsume_retry()
            drawn += 1
            self.retries = drawn
        self._note_retries()

    def _note_retries(self) -> None:
        span = self.span
        if span.is_recording():
            span.set_attribute(RETRIES, self.retries)

    def note_reply(self, status: object = None) -> None:
        """The attempt in flight was answered (an HTTP status line, ``status``, arrived)."""
        self.replies += 1
        if type(status) is int and 200 <= status < 300:
            self.billed_replies += 1

    def note_unsent(self) -> None:
        """The attempt in flight failed before any byte of it left (no connection)."""
        self.sends -= 1
        self.unsent = True

    def count_lost(self, read: int) -> int:
        """Attempts that may have been billed beyond the ``read`` reply whose
        usage the call commits (``lost_attempts``): those the HTTP layer sent
        with no reply, the 2xx replies dropped (a middleware that sent twice),
        or, where the HTTP layer saw nothing, those an SDK hook noted."""
        lost = self.sends - self.replies
        dropped = self.billed_replies - read
        if dropped > 0:
            lost += dropped
        self.lost_attempts = max(self.lost_attempts, lost)
        return self.lost_attempts

    def check_alive(self) -> None:
        """Raise BudgetExceededError when the chain tripped or its deadline passed.

        In an async stream the store read is left to the stream's own awaited
        check (:class:`AsyncContainedStream`), so a payload hook never blocks.
        """
        self.ctx.ensure_active(poll=not self._async_stream)

    def finish(
        self, error: BaseException | None = None, *, sent: bool = True, billed: bool = True
    ) -> None:
        """Settle the call exactly once (DESIGN G10); never raises.

        - ``sent=False``: no attempt left the process; released, step given back.
        - usage read from a reply: that usage is committed.
        - ``billed=False``: every attempt sent was answered by an HTTP error
          the provider does not bill; zero cost, the step counts.
        - otherwise (a reply without readable usage, a stream that ended or
          was cut without its final usage, a timeout, a lost connection, a
          cancellation, an interrupt, any other error once a request may have
          left): the reservation, the call's worst case. Streamed text does not
          bound it: reasoning tokens are billed but never streamed.

        Each attempt lost unanswered (``lost_attempts``: a timeout or a dropped
        connection the SDK then retried) may have been generated and billed
        too: it adds one reservation, to the usage or in place of it.
        """
        if self.done:
            return
        self.done = True
        if self.sends > 1:  # retried or resent: an attempt not read may be billed too
            self.count_lost(1)
        if self._defer:
            self._deferred = (error, sent, billed)
            return
        handle = self.handle
        try:
            if self.usage_seen and sent:  # the common case: a reply with its usage
                prices = self.prices
                plain = None if prices is None else prices._plain
                if (
                    plain is not None
                    and not self.lost_attempts
                    and not (self.cached_tokens or self.reasoning_tokens or self.cache_write_tokens)
                ):
                    # _usage_amounts' plain sum (input and output tokens only,
                    # nothing lost), without its frame: the test is the rule's own.
                    inp, out = self.input_tokens, self.output_tokens
                    cost = -(-(inp * plain[0] + out * plain[1]) // 1_000_000)
                    handle.commit(cost if cost < _MAX_EXACT else _MAX_EXACT, inp + out, error)
                else:
                    cost, tokens = self._usage_amounts()
                    handle.commit(cost, tokens, error)
            else:
                amounts = self._amounts(sent, billed)
                if amounts is None:
                    handle.finish(error, sent=False)
                else:
                    handle.commit(amounts[0], amounts[1], error)
        except Exception:
            _logger.exception("settling an instrumented call failed")
        finally:
            breaker = self.breaker
            # _settled's lane for a success with no breaker to feed (its own
            # tests, without its frame): the span ended, if there is one.
            if (
                error is None
                and sent
                and (
                    breaker is None
                    or (
                        type(breaker) is CircuitBreaker
                        and breaker._state is _CLOSED
                        and not breaker._failures
                    )
                )
            ):
                attributes = self.pending_attributes
                if attributes is not None:
                    # Our own recording span, a success: _end_span's lane (its
                    # rule, copied), without its frame.
                    span = self.span
                    try:
                        cost = handle.cost_nano
                        attributes[COST_USD] = cost / NANO_PER_USD if cost > 0 else 0.0
                        if self.usage_seen:
                            attributes[GEN_AI_USAGE_INPUT_TOKENS] = self.input_tokens
                            attributes[GEN_AI_USAGE_OUTPUT_TOKENS] = self.output_tokens
                        span.set_attributes(attributes)
                    except Exception:
                        _logger.exception("recording the call on its span failed")
                    finally:
                        span.end()
                elif self.span is not UNTRACED_SPAN:
                    self._end_span(None)
            else:
                self._settled(error, sent)

    async def afinish(
        self, error: BaseException | None = None, *, sent: bool = True, billed: bool = True
    ) -> None:
        """:meth:`finish` for async code: a shared store is awaited, never blocked on."""
        if self.done:
            return
        self.done = True
        if self.sends > 1:
            self.count_lost(1)
        handle = self.handle
        try:
            amounts = self._amounts(sent, billed)
            if amounts is None:
                await handle.afinish(error, sent=False)
            else:
                await handle.acommit(amounts[0], amounts[1], error)
        except Exception:
            _logger.exception("settling an instrumented call failed")
        finally:  # even when cancelled: the span ends, the probe is freed
            self._settled(error, sent)

    def defer_settlement(self) -> None:
        """From now, :meth:`finish` only records how the call ends (an async
        wrapper's sync code); :meth:`settle_deferred` then settles it."""
        self._defer = True

    async def settle_deferred(self) -> None:
        """Settle what :meth:`finish` recorded after :meth:`defer_settlement` (awaited)."""
        self._defer = False
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            self.done = False
            await self.afinish(deferred[0], sent=deferred[1], billed=deferred[2])

    def _amounts(self, sent: bool, billed: bool) -> tuple[int, int] | None:
        """What the call commits (cost, tokens); None: nothing was sent, release it."""
        if not sent:
            return None
        if self.usage_seen:
            return self._usage_amounts()
        if not billed:
            return 0, 0
        # Explicitly the reservation: the kernel's "no usage" default
        # for a call that raised has not always been the worst case.
        lost = max(1, self.lost_attempts)
        reservation = self.handle.reservation
        return min(lost * reservation.cost_nano, _MAX_EXACT), lost * reservation.tokens

    def _settled(self, error: BaseException | None, sent: bool) -> None:
        breaker = self.breaker
        if breaker is not None:
            if error is None and sent:  # the common case, without _feed_breaker's frame
                # A closed in-process breaker with no failures has nothing to
                # reset: record_success's own first test, without its frame. A
                # store-backed breaker (Redis) keeps its state in the store.
                if (
                    type(breaker) is not CircuitBreaker
                    or breaker._state is not _CLOSED
                    or breaker._failures
                ):
                    try:
                        breaker.record_success(self.probe)  # lock-free while closed
                    except Exception:
                        _logger.exception("feeding the endpoint breaker failed")
            else:
                self._feed_breaker(breaker, error if sent else None, sent)
        if self.span is not UNTRACED_SPAN:  # no TracerProvider: no span to record or end
            self._end_span(error)

    def _usage_amounts(self) -> tuple[int, int]:
        inp, out = self.input_tokens, self.output_tokens
        cost = 0
        prices = self.prices
        if prices is not None and (inp or out):
            cached, reasoning = self.cached_tokens, self.reasoning_tokens
            write = self.cache_write_tokens
            if cached or reasoning or write:
                cached = min(cached, inp)
                reasoning, write = min(reasoning, out), min(write, inp - cached)
                cost = prices.cost_nano_unchecked(inp, out, cached, reasoning, write)
            else:  # plain input and output tokens: plain_cost_nano's sum, without its frame
                plain = prices._plain
                if plain is None:
                    cost = prices.plain_cost_nano(inp, out)
                else:
                    cost = -(-(inp * plain[0] + out * plain[1]) // 1_000_000)
        tokens = inp + out
        lost = self.lost_attempts
        if lost:
            reservation = self.handle.reservation
            cost += lost * reservation.cost_nano
            tokens += lost * reservation.tokens
        return (cost if cost < _MAX_EXACT else _MAX_EXACT), tokens

    def _feed_breaker(
        self, breaker: CircuitBreaker, error: BaseException | None, sent: bool
    ) -> None:
        # Every path frees the half-open probe: a call that never reached the
        # endpoint, was cancelled or interrupted says nothing about its health.
        try:
            if not sent:
                breaker.release_probe(self.probe)
            elif error is None:
                breaker.record_success(self.probe)  # lock-free while closed
            elif classify_outcome(error) == "failure":
                breaker.record_failure(self.probe)
            else:
                breaker.release_probe(self.probe)
        except Exception:
            _logger.exception("feeding the endpoint breaker failed")

    def _end_span(self, error: BaseException | None) -> None:
        span = self.span
        try:
            attributes = self.pending_attributes  # set: our span, recording
            if attributes is not None or span.is_recording():
                if attributes is None:
                    attributes = {}
                cost = self.handle.cost_nano
                attributes[COST_USD] = cost / NANO_PER_USD if cost > 0 else 0.0
                if self.usage_seen:
                    attributes[GEN_AI_USAGE_INPUT_TOKENS] = self.input_tokens
                    attributes[GEN_AI_USAGE_OUTPUT_TOKENS] = self.output_tokens
                span.set_attributes(attributes)
                if error is not None:
                    span.set_attribute("error.type", type(error).__qualname__)
                    if not isinstance(error, BudgetExceededError):
                        span.record_exception(error)
                    _note_trip(span, error, self.ctx)
                    span.set_status(Status(StatusCode.ERROR, str(error)[:200]))
        except Exception:
            _logger.exception("recording the call on its span failed")
        finally:
            if self.owns_span:
                span.end()


# The last base URL read and the server attributes it gives, remembered by
# identity: a process usually has one client (this runs before every call
# whose span records).
_SERVER: list[tuple[object, dict[str, Any]]] = [(None, {})]


def server_attributes(attributes: dict[str, Any], base_url: object) -> None:
    """Add ``server.address`` and ``server.port`` read from an SDK client's base URL.

    ``base_url`` is an ``httpx``-style URL (``host``, ``port``, ``scheme``).
    """
    last = _SERVER[0]
    if last[0] is not base_url:
        last = _SERVER[0] = (base_url, _server_of(base_url))
    attributes.update(last[1])


def _server_of(base_url: object) -> dict[str, Any]:
    host = getattr(base_url, "host", None) or None
    port = getattr(base_url, "port", None)
    if port is None:
        port = {"https": 443, "http": 80}.get(getattr(base_url, "scheme", ""))
    found: dict[str, Any] = {}
    if type(host) is str:
        found["server.address"] = host
    if type(port) is int:
        found["server.port"] = port
    return found


def client_attributes(attributes: dict[str, Any], client: Any) -> None:
    """:func:`server_attributes` of a Stainless SDK client (``openai``, ``anthropic``):
    its own ``_base_url`` (openai 3's ``base_url`` property imports a module per
    read), else its ``base_url``; nothing for a client of another shape."""
    base_url = getattr(client, "_base_url", None)
    last = _SERVER[0]
    if base_url is not None and last[0] is base_url:  # server_attributes' hit, without its frame
        attributes.update(last[1])
        return
    if base_url is None:
        try:
            base_url = client.base_url
        except Exception:  # a client we do not know the shape of: no server attributes
            return
    server_attributes(attributes, base_url)


def attribute_value(value: object) -> object | None:
    """``value`` when a span attribute may hold it (a primitive or a list of str), else None."""
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool:
        return value
    if kind is list and all(type(item) is str for item in value):  # type: ignore[attr-defined]
        return value
    return None


# The call span while no TracerProvider is set: nothing records, so none is
# opened and none is made current (the caller's context, a remote parent
# included, passes through untouched, as the API's no-op tracer would leave it).
UNTRACED_SPAN: Span = trace.NonRecordingSpan(trace.INVALID_SPAN_CONTEXT)


def _untraced() -> bool:
    """True while no global TracerProvider is set (the API's proxy tracer is a no-op).

    Reads the API's set-once global, as its ``ProxyTracer`` does on every span;
    an API without it counts as traced (the general path).
    """
    return getattr(trace, "_TRACER_PROVIDER", True) is None


def _context_variable() -> ContextVar[otel_context.Context] | None:
    """The context variable behind ``opentelemetry.context`` where the runtime is
    the API's default; None for another runtime (then the API's functions)."""
    runtime = getattr(otel_context, "_RUNTIME_CONTEXT", None)
    variable = getattr(runtime, "_current_context", None)
    if type(runtime) is ContextVarsRuntimeContext and isinstance(variable, ContextVar):
        return variable
    return None


_CURRENT = _context_variable()
#: The current OpenTelemetry context (read once per call by the adapters):
#: ``opentelemetry.context.get_current`` as one C call where the runtime allows.
otel_current: Callable[[], otel_context.Context] = (
    otel_context.get_current if _CURRENT is None else _CURRENT.get
)
_set_current = None if _CURRENT is None else _CURRENT.set


def make_current(
    span: Span, context: otel_context.Context | None
) -> Token[otel_context.Context] | None:
    """Make ``span`` current in ``context``; the detach token (None: nothing attached).

    Where the runtime is the API's default, ``attach(set_span_in_context(span,
    context))`` in one context built and one variable set, without their five
    frames; ``opentelemetry.context.detach`` takes the token either way.
    """
    if span is UNTRACED_SPAN:
        return None
    if _set_current is not None and context is not None:
        return _set_current(otel_context.Context({**context, _SPAN_KEY: span}))
    return otel_context.attach(trace.set_span_in_context(span, context))


def release_current(token: Token[otel_context.Context]) -> None:
    """Detach what :func:`make_current` attached: ``opentelemetry.context.detach``
    in one frame where the runtime is the API's default (its failure logged, as
    there: a token reset in another context must not raise into the call)."""
    if _CURRENT is None:
        otel_context.detach(token)
        return
    try:
        _CURRENT.reset(token)
    except Exception:
        _logger.exception("Failed to detach context")


def start_span(
    operation: str,
    provider_name: str,
    model: str,
    agent: str | None = None,
    context: otel_context.Context | None = None,
) -> Span:
    """Open a GenAI client span (``{operation} {model}``).

    ``agent`` (``gen_ai.agent.name``) names the agent making the call, so
    the chain's handoff ceiling still sees it while this span is current.

    Under ``suppress_instrumentation()`` no span is recorded, but the call is
    still contained: suppression silences telemetry, it is not a way around
    the chain's limits. ``context``: the current OpenTelemetry context when
    the caller already read it (one read per call instead of several).
    """
    if context is None:
        if not is_instrumentation_enabled():
            return trace.INVALID_SPAN
    elif context.get(_SUPPRESS_KEY) or context.get(_SUPPRESS_KEY_PLAIN):
        return trace.INVALID_SPAN
    provider = getattr(trace, "_TRACER_PROVIDER", True)
    if provider is None:  # _untraced(), inline
        return UNTRACED_SPAN
    attributes = {
        GEN_AI_OPERATION_NAME: operation,
        GEN_AI_PROVIDER_NAME: provider_name,
        GEN_AI_REQUEST_MODEL: model,
    }
    if agent is not None:
        attributes[GEN_AI_AGENT_NAME] = agent
    known = _REAL_TRACER[0]
    real = known[1] if known[0] is provider else _real_tracer(provider)
    span: Span = real.start_span(
        f"{operation} {model}", context, kind=SpanKind.CLIENT, attributes=attributes
    )
    return span


# The global provider's own tracer, and the provider it came from: the API's
# ProxyTracer would look it up in two Python frames on every span. The global
# is set once, so the tracer is fetched again only when the provider differs.
_REAL_TRACER: list[tuple[object, Any]] = [(None, tracer)]


def _real_tracer(provider: object) -> Any:
    get_tracer = getattr(provider, "get_tracer", None)
    if get_tracer is None:  # an API without the global (True): its proxy
        return tracer
    real = get_tracer("veronica_otel.instrumentors", __version__)
    _REAL_TRACER[0] = (provider, real)
    return real


def _note_trip(span: Span, error: BaseException | None, ctx: ExecutionContext) -> None:
    """Put the trip on the call's span if it is not there yet.

    A fresh trip is announced on the current span when it happens; a sticky
    one denies later calls without being announced again, and a deadline or a
    ``cancel()`` trips the chain outside any call.
    """
    if not isinstance(error, BudgetExceededError) or not span.is_recording():
        return
    events = getattr(span, "events", None)  # the SDK's spans expose their events
    if events is not None and any(event.name == TRIP_EVENT for event in events):
        return
    span.add_event(TRIP_EVENT, {**trip_attributes(error.trip), **remaining_attributes(ctx)})
    span.set_status(Status(StatusCode.ERROR, f"veronica trip: {error.reason}"))


def strip_veronica_baggage(context: otel_context.Context | None = None) -> object | None:
    """Attach a context without ``veronica.*`` baggage; returns the detach token.

    Baggage leaves with every outbound request; our entries must never reach
    an LLM vendor. Returns None (nothing attached) when there is none to strip.
    ``context``: where to look for it when the caller already read the
    current context (the one stripped is always the current one).
    """
    entries = baggage.get_all(context)
    if not entries or not any(key.startswith(BAGGAGE_PREFIX) for key in entries):
        return None
    ctx = otel_context.get_current()
    for key in entries:
        if key.startswith(BAGGAGE_PREFIX):
            ctx = baggage.remove_baggage(key, ctx)
    return otel_context.attach(ctx)


@contextlib.contextmanager
def without_veronica_baggage() -> Iterator[None]:
    """Run the block in a context without ``veronica.*`` baggage (what it sends carries none)."""
    token = strip_veronica_baggage()
    try:
        yield
    finally:
        if token is not None:
            otel_context.detach(token)  # type: ignore[arg-type]


class ContainedStream(wrapt.BaseObjectProxy[Any]):
    """A sync SDK stream that accounts each item and can be cut mid-way."""

    def __init__(self, wrapped: Any, call: ContainedCall, on_item: PayloadHandler) -> None:
        super().__init__(wrapped)
        self._self_call = call
        self._self_on_item = on_item

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        call = self._self_call
        try:
            call.check_alive()
            item = self.__wrapped__.__next__()
            self._self_on_item(call, item)
        except StopIteration:
            call.finish()
            raise
        except BudgetExceededError as exc:
            self._self_cut(exc)
            raise
        except BaseException as exc:
            call.finish(exc)
            raise
        return item

    # Settle first, then close: closing may end a span the SDK owns (anthropic),
    # and the call's attributes must land on it before it ends.
    def _self_cut(self, exc: BudgetExceededError) -> None:
        try:
            self._self_call.finish(exc)
        finally:
            _close(self.__wrapped__)

    def close(self) -> None:
        try:
            self._self_call.finish()
        finally:
            _close(self.__wrapped__)

    def __enter__(self) -> ContainedStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        call = self._self_call
        if not call.done:
            defer(call.finish)  # a finaliser must not take the ledger's lock


class AsyncContainedStream(wrapt.BaseObjectProxy[Any]):
    """The async twin of :class:`ContainedStream`."""

    def __init__(self, wrapped: Any, call: ContainedCall, on_item: PayloadHandler) -> None:
        super().__init__(wrapped)
        self._self_call = call
        self._self_on_item = on_item
        call._async_stream = True
        # A settlement decided by sync code inside the SDK's iteration (a
        # payload hook cutting the stream) is awaited here, not made blocking.
        self._self_defer = call.ctx.awaits_store

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        call = self._self_call
        defer = self._self_defer
        try:
            await call.ctx.aensure_active()
            if defer:
                call.defer_settlement()
            try:
                item = await self.__wrapped__.__anext__()
                self._self_on_item(call, item)
            finally:
                if defer:
                    await call.settle_deferred()
        except StopAsyncIteration:
            await call.afinish()
            raise
        except BudgetExceededError as exc:
            try:
                await call.afinish(exc)
            finally:
                await _aclose(self.__wrapped__)
            raise
        except BaseException as exc:
            await call.afinish(exc)
            raise
        return item

    async def close(self) -> None:
        try:
            await self._self_call.afinish()
        finally:
            await _aclose(self.__wrapped__)

    async def aclose(self) -> None:
        await self.close()

    async def __aenter__(self) -> AsyncContainedStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __del__(self) -> None:
        call = self._self_call
        if not call.done:
            defer(call.finish)  # a finaliser must not take the ledger's lock


def _close(stream: Any) -> None:
    """Close an SDK stream: its ``close()``, a generator's included; nothing if it has none."""
    close = getattr(stream, "close", None)
    if callable(close):
        close()


async def _aclose(stream: Any) -> None:
    """Close an async SDK stream: ``aclose()`` (async generators) or ``close()``."""
    close = getattr(stream, "aclose", None) or getattr(stream, "close", None)
    if callable(close):
        result = close()
        if hasattr(result, "__await__"):
            await result


def get_field(obj: Any, name: str, default: Any = None) -> Any:
    """Read ``name`` from a pydantic model or a dict payload."""
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def no_item(call: ContainedCall, item: Any) -> None:
    """For SDK streams whose items the SDK's payload hook accounts (it sees raw dicts)."""


def settle_failed(call: ContainedCall, result: Any, logger: logging.Logger, provider: str) -> Any:
    """Settling a call that returned raised (our bug): commit the reservation, hand
    back the reply."""
    logger.exception("settling an %s call failed; its reservation is committed", provider)
    call.finish()
    return result
