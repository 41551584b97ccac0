"""The shared call machinery every provider adapter goes through.

A provider adapter (``instrumentors/<provider>.py``) says only what is
provider-specific, as a :class:`ProviderAdapter` subclass:

- :meth:`~ProviderAdapter.read_request`: how a call's arguments read
  (:class:`Request`: operation, model, input, output cap, stream);
- :meth:`~ProviderAdapter.rewrite`: how a clamp or a fallback model is put
  into the arguments (adapters whose requests cannot be rewritten keep the
  default, and mark their requests not clampable);
- :meth:`~ProviderAdapter.read_reply` and :meth:`~ProviderAdapter.read_item`:
  how a reply and one stream item read (usage, response id and model,
  finish reasons) into the :class:`~._common.ContainedCall`;
- :meth:`~ProviderAdapter.wrap_stream`: how a streamed reply is held
  (default: a ``wrapt`` proxy that accounts each item and cuts the stream at
  the next item once the chain trips); with :meth:`~ProviderAdapter.is_stream`,
  any reply whose body is read after the hooked method returns (a Stainless
  SDK's stream or raw response, settled when its HTTP response closes);
- where an SDK differs: :meth:`~ProviderAdapter.call_span` (a span that
  already stands for the call: the SDK's own, a peer instrumentor's),
  :meth:`~ProviderAdapter.unsent` (what an error says when the HTTP layer saw
  no attempt), :attr:`~ProviderAdapter.nests` (an SDK hooked once per API
  call: its own calls made inside one of its calls are calls of their own).

Everything else lives here once: the chain lookup, the span, admission (one
:class:`~veronica_otel._call_spec.CallSpec`, one ``admit_call``), a policy's
``rate_limit_ms`` wait, the clamp and fallback, the G10 failure table,
settlement, and the mark that keeps a call counted once (DESIGN G13).

The plain lane: an adapter that reads its common request in one frame
(:attr:`~ProviderAdapter.read_plain`) gets, over a sync SDK method, one plain
function (:func:`_lane`) that runs the common call (no TracerProvider, a plain
chain, a plain request, a whole reply with plain usage) from its read to its
commit in that frame, with the general way's rules, copied; anything else
takes the general way from where it left.

Counted once: while an admitted call runs, :data:`ADMITTED` holds it. Another
adapter underneath (litellm over the ``openai`` SDK) and the HTTP vendor guard
see it and do not admit the call again. The vendor guard instead reports each
HTTP attempt of it (:meth:`~._common.ContainedCall.note_send`,
``note_reply``, ``note_unsent``): every attempt after the first is a retry
(the SDK's own, or a resend by a middleware or a custom transport), drawn from
``max_retries_total`` before it is sent, and an attempt lost unanswered costs
its reservation (G10). An SDK hook that sees its retries earlier (``openai``'s
``_sleep_for_retry``, ``anthropic``'s ``_attempt_request``) draws them through
the same call (``draw_retries``, ``begin_try``): each retry is drawn once,
whichever layer sees it first.

G10 for an adapter's call that raised:

- a :class:`BudgetExceededError` raised inside the SDK (a retry refused by the
  HTTP layer) reaches the caller as itself, even when the SDK wrapped it in
  its own error type (``raise ... from`` the SDK's error);
- no attempt left (the HTTP layer saw none, or the error says the connection
  was never made): released;
- every attempt answered by an HTTP error status (then raised, or followed
  by a retry we refused before it was sent): zero cost, the step counts;
- otherwise the reservation, times the attempts that may have been billed
  unread: lost unanswered, or answered 2xx and dropped (a middleware that
  sent twice). Where the HTTP layer saw no attempt, the adapter's
  :meth:`~ProviderAdapter.unsent` reads the error (a Stainless SDK's: raised
  before its send began).

An endpoint billed in units no token price covers (images, video seconds,
tuning jobs, cache storage, batch jobs whose input lives server-side) is read
as a request with ``priced=False``: admitted at its configured bound
(``[prices."<provider>:<operation>"] per_request``, :mod:`._bounds`) when it
has one; else under a cost ceiling it is refused before anything is sent (a
non-sticky ``cost`` denial naming the endpoint and the key that would bound
it); without one it is counted like any call (a step, its input tokens).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Callable, Collection
from types import FunctionType
from typing import Any, ClassVar, NamedTuple

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.baggage import _BAGGAGE_KEY
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY as _SUPPRESS_KEY
from opentelemetry.context.context import Context
from opentelemetry.trace import INVALID_SPAN, NonRecordingSpan
from opentelemetry.trace.propagation import _SPAN_KEY

from veronica_otel import _agents, _pricing
from veronica_otel._agents import current_agent
from veronica_otel._attributes import GEN_AI_REQUEST_MAX_TOKENS
from veronica_otel._breaker import CircuitBreaker, CircuitState
from veronica_otel._call import ACTIVE_CALL, CallHandle, PlainCall
from veronica_otel._chain_span import remaining_attributes
from veronica_otel._context import CONTEXT_KEY, ExecutionContext
from veronica_otel._errors import BudgetExceededError, TripEvent
from veronica_otel._gc_safe import pending
from veronica_otel._ledger import _one_step
from veronica_otel._ledger import _settle as _settle_queued
from veronica_otel._policy import ALLOW
from veronica_otel._pricing import _PER_MTOK, TOKENS_PER_MESSAGE, TOKENS_PER_REQUEST
from veronica_otel._propagation import default_context
from veronica_otel._telemetry import _calls
from veronica_otel._trips import emit_trip
from veronica_otel._units import MAX_COUNT

from ._admit import CallSpec, _list_bytes, _mark_denied, _utf8_bytes, aadmit, admit
from ._bounds import BOUND_USD, BoundedCall, bounded, how_to_bound
from ._breakers import _breakers as _BREAKERS  # read-only here: a dict hit, no call
from ._breakers import never_connected
from ._common import (
    _CURRENT,
    _MAX_EXACT,
    _SUPPRESS_KEY_PLAIN,
    UNTRACED_SPAN,
    AsyncContainedStream,
    ContainedCall,
    ContainedStream,
    _aclose,
    _set_current,
    make_current,
    otel_current,
    release_current,
    start_span,
    strip_veronica_baggage,
)

__all__ = [
    "ADMITTED",
    "HTTPErrorReply",
    "ProviderAdapter",
    "Request",
    "admitted_call",
    "denial_in",
    "http_status",
    "refuse_unpriced",
    "wrapper",
]

_logger = logging.getLogger(__name__)

# The call an adapter admitted, while it runs (None outside one): no other
# layer under it admits it again, and the HTTP layer counts its attempts.
ADMITTED: contextvars.ContextVar[ContainedCall | None] = contextvars.ContextVar(
    "veronica_admitted_call", default=None
)
admitted_call = ADMITTED.get
_active_call = ACTIVE_CALL.get
_CLOSED = CircuitState.CLOSED
_new = object.__new__


def _counted_above(adapter: ProviderAdapter, above: ContainedCall) -> bool:
    """Whether the call ``above`` (admitted, running) already counts this one (G13).

    Under another adapter's call (litellm over ``openai``) the SDK call *is*
    that call. For an SDK hooked once per API call (:attr:`ProviderAdapter.nests`)
    under one of such an SDK's own calls, another call (made from a hook, an
    auth callback, a middleware) is a call of its own.
    """
    if not adapter.nests:
        return True
    outer = above.adapter
    return outer is not None and not getattr(outer, "nests", False)


# A CallSpec from its fields without NamedTuple's Python-level __new__ (once per call).
_spec_of = tuple.__new__


class Request(NamedTuple):
    """One SDK call's request, as its adapter reads it.

    Attributes:
        operation: ``gen_ai.operation.name`` (``"chat"``, ``"embeddings"``, ...).
        model: The model requested (``"unknown"`` when the request names none).
        input_parts: Everything sent as input (messages, system prompt, tools):
            its UTF-8 bytes bound the input tokens, and it signs the call for
            the repeat limit.
        n_messages: Messages in the input (each adds the per-message overhead).
        cap: The output cap the request sets (None: none).
        clampable: Whether :meth:`ProviderAdapter.rewrite` can set or lower the cap.
        choices: Completions generated, each up to the cap.
        stream: Whether the reply streams.
        extra_input_tokens: Input the byte walk cannot see, at its documented
            worst case (images, files, server-side context).
        attributes: More span attributes read from the request.
        provider: ``gen_ai.provider.name`` of this call when it is not the
            adapter's own (a library that routes to many providers, such as
            ``litellm`` or the vendor guard; one SDK reaching a local server
            and a hosted service billed differently); None:
            :attr:`ProviderAdapter.provider`. The call is priced, broken and
            named under it.
        priced: False when the endpoint bills in units token prices do not
            cover: refused under a cost ceiling (see the module docs).
        cache_writes: Whether input may be billed at the cache-write price
            (the request marks blocks to cache); False: reserved at the
            uncached or cache-read price.
    """

    operation: str
    model: str
    input_parts: object
    n_messages: int = 1
    cap: int | None = None
    clampable: bool = False
    choices: int = 1
    stream: bool = False
    extra_input_tokens: int = 0
    attributes: dict[str, Any] | None = None
    provider: str | None = None
    priced: bool = True
    cache_writes: bool = True


# Request fields read by position where it is read before each call.
_PRICED = Request._fields.index("priced")
_ATTRIBUTES = Request._fields.index("attributes")
# No clamp, no fallback, no span attributes, none read: nothing for _prepared to do.
_NOTHING = (None, None, None, None)


class ProviderAdapter:
    """What one provider's SDK calls look like; see the module docs.

    Subclasses set :attr:`provider` and override :meth:`read_request`,
    :meth:`read_reply` and, for streams, :meth:`read_item`. One instance
    serves every hooked method of the SDK: :func:`wrapper` builds the
    ``wrapt`` wrapper for each.
    """

    #: ``gen_ai.provider.name`` (``"gcp.gemini"``, ``"aws.bedrock"``, ...).
    provider: ClassVar[str] = ""
    #: Where the SDK's HTTP requests go (for ``server.address``); None: unknown.
    server: ClassVar[str | None] = None
    #: Hooked once per API call of an SDK (see :func:`_counted_above`).
    nests: ClassVar[bool] = False
    #: Reply types known whole (never a stream to hold): :meth:`is_stream` is
    #: False for them without being asked (an SDK's parsed response models),
    #: and one whose call is settled already has nothing left to read.
    whole_replies: ClassVar[Collection[type]] = ()
    # Whether is_stream, call_span and read_reply are the defaults: not asked
    # (read_reply's no-op: a whole reply settles as it returns).
    _plain_streams: ClassVar[bool] = True
    _plain_spans: ClassVar[bool] = True
    _plain_replies: ClassVar[bool] = True
    #: The plain lane's reader (:func:`_lane`), ``(adapter, args, kwargs) ->
    #: (request, input_bytes)``: the request :meth:`read_request` reads, and the
    #: UTF-8 bytes of its input (``_utf8_bytes(request.input_parts)``) when it
    #: is plain: one choice, priced under the adapter's own provider, no span
    #: attributes; -1 for any other. None: the adapter has no lane. An adapter
    #: with one and a :meth:`call_span` returns None for a span that does not
    #: record (the lane takes no span where one of those is current).
    read_plain: ClassVar[Callable[..., tuple[Request | None, int]] | None] = None
    #: The hooked method's keyword argument that carries the SDK's own span for
    #: the call, None when the SDK's tracing is off: where it is None (or
    #: absent), :meth:`call_span` is not asked. None: always asked.
    span_kwarg: ClassVar[str | None] = None
    #: Whether :attr:`read_plain` is also given the hooked method's instance,
    #: ``(adapter, args, kwargs, instance)``: a request that depends on the
    #: client (ollama's host), read with no frame before the lane's.
    plain_reads_instance: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._plain_streams = cls.is_stream is ProviderAdapter.is_stream
        cls._plain_spans = cls.call_span is ProviderAdapter.call_span
        cls._plain_replies = cls.read_reply is ProviderAdapter.read_reply

    def read_request(
        self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], method: str
    ) -> Request | None:
        """The call's request; None when it is not a billable call (passed through)."""
        raise NotImplementedError

    def call_span(
        self,
        instance: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        request: Request,
        agent: str | None,
        current: otel_context.Context,
    ) -> Any:
        """A span that already stands for this call (the SDK's own, a peer
        instrumentor's): our attributes go on it and it stays theirs to end.
        None (the default): we open our own GenAI span."""
        return None

    def request_attributes(
        self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], request: Request
    ) -> dict[str, Any] | None:
        """Span attributes read from the request, asked only when our span records
        (default: ``request.attributes``): work no call pays without a TracerProvider."""
        return request.attributes

    def rewrite(
        self,
        instance: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        cap: int | None,
        model: str | None,
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments with the output ``cap`` and the fallback ``model`` set.

        Each is None when unchanged. Never mutate the caller's objects: copy
        what changes.
        """
        return args, kwargs

    def read_reply(self, call: ContainedCall, reply: Any) -> None:
        """Read a whole reply's usage (``call.set_usage``) and attributes."""

    def read_item(self, call: ContainedCall, item: Any) -> None:
        """Read one stream item: usage totals so far, text (``call.add_text``)."""

    def wrap_stream(self, call: ContainedCall, reply: Any, is_async: bool) -> Any:
        """Hold a streamed reply so each item is accounted and a trip cuts it.

        ``is_async``: the hooked method was awaited; a sync method may return
        an async iterator too (an async generator function).
        """
        if is_async or (hasattr(reply, "__anext__") and not hasattr(reply, "__next__")):
            return AdapterAsyncStream(reply, call, self.read_item)
        return AdapterStream(reply, call, self.read_item)

    def is_stream(self, reply: Any, request: Request) -> bool:
        """Whether ``reply`` is a stream to hold (default: what the request asked)."""
        return request.stream

    def unpriced_reason(self, request: Request) -> str:
        """Why a ``priced=False`` request is refused under a cost ceiling, and how to price it."""
        return how_to_bound(request.provider or self.provider, request.operation)

    def billed_nothing(self, error: BaseException) -> bool:
        """Whether ``error`` is an HTTP error reply the provider does not bill."""
        status = http_status(error)
        return status is not None and status >= 400

    def unsent(self, error: BaseException) -> bool:
        """Whether ``error``, ending a call whose HTTP layer saw no attempt, says
        nothing was sent (default: the connection was never made)."""
        return never_connected(error)


class HTTPErrorReply(Exception):
    """An HTTP error status that a hooked method returned as its reply.

    Hooks below an SDK's error handling (a ``do_request`` that hands the
    response back, the SDK raising its own error after it) settle such a
    reply with ``call.finish(HTTPErrorReply(status), billed=False)``: zero
    cost, the step counts (G10), and the endpoint breaker reads the status.
    """

    def __init__(self, status_code: int) -> None:
        super().__init__(f"HTTP {status_code} reply")
        self.status_code = status_code


def http_status(error: BaseException) -> int | None:
    """The HTTP status an SDK error carries (``status_code``, ``status``, ``code``,
    or its ``response``'s), or None when it is not an HTTP reply."""
    for name in ("status_code", "status", "code"):
        value = getattr(error, name, None)
        if type(value) is int and 100 <= value <= 599:
            return value
    response = getattr(error, "response", None)
    for name in ("status_code", "status"):
        value = getattr(response, name, None)
        if type(value) is int and 100 <= value <= 599:
            return value
    return None


def denial_in(error: BaseException) -> BudgetExceededError | None:
    """Our denial, when ``error`` is one or an SDK error raised from (or while
    handling) one: the caller must see it as itself."""
    seen = 0
    current: BaseException | None = error
    while current is not None and seen < 8:  # a bounded walk: chains can loop
        if isinstance(current, BudgetExceededError):
            return current
        current = current.__cause__ or current.__context__
        seen += 1
    return None


def _denial(call: ContainedCall, error: BaseException) -> BudgetExceededError | None:
    """Our denial behind ``error``: in its chain, or a retry the HTTP layer refused
    (some SDKs rebuild the error from its message, breaking the chain)."""
    return denial_in(error) or call.denial


_UNPRICED_HINT = (
    "cannot be priced before it is sent; it is refused under a cost ceiling "
    "(run it in a chain without max_cost_usd to count it in steps)"
)


def refuse_unpriced(
    ctx: ExecutionContext, what: str, span: Any = None, *, why: str = _UNPRICED_HINT
) -> None:
    """Raise the non-sticky ``cost`` denial of a call that cannot be priced before
    it is sent (``what`` names it, ``why`` says so), and mark ``span`` (ours:
    ended) with it."""
    trip = TripEvent(
        "cost",
        float(ctx.config.max_cost_usd or 0.0),
        float("inf"),
        ctx.chain_id,
        f"chain {ctx.chain_id}: {what} {why}",
        sticky=False,
    )
    emit_trip(trip, remaining=remaining_attributes(ctx))
    error = BudgetExceededError(trip)
    if span is not None:
        _mark_denied(span, True, ctx, error)
    raise error


def _refuse(adapter: ProviderAdapter, ctx: ExecutionContext, request: Request, span: Any) -> None:
    what = f"{adapter.provider} {request.operation} ({request.model})"
    refuse_unpriced(ctx, what, span, why=adapter.unpriced_reason(request))


class AdapterStream(ContainedStream):
    """:class:`~._common.ContainedStream` for an adapter's call.

    Many SDKs send a streamed request lazily, from the first ``next()`` (a
    generator): each item is fetched with the call marked :data:`ADMITTED`,
    so the HTTP layer counts its attempts instead of admitting it again, and
    an error is settled by the G10 table and raised as our denial when the SDK
    wrapped one.
    """

    def __next__(self) -> Any:
        call = self._self_call
        try:
            call.check_alive()
            mark = ADMITTED.set(call)
            try:
                item = self.__wrapped__.__next__()
            finally:
                ADMITTED.reset(mark)
            self._self_on_item(call, item)
        except StopIteration:
            call.finish()
            raise
        except BudgetExceededError as exc:
            self._self_cut(exc)
            raise
        except BaseException as exc:
            _fail(call.adapter, call, exc)
            denial = _denial(call, exc)
            if denial is None:
                raise
            raise denial from exc
        return item


class AdapterAsyncStream(AsyncContainedStream):
    """The async twin of :class:`AdapterStream`."""

    async def __anext__(self) -> Any:
        call = self._self_call
        try:
            await call.ctx.aensure_active()
            call.defer_settlement()
            mark = ADMITTED.set(call)
            try:
                item = await self.__wrapped__.__anext__()
                self._self_on_item(call, item)
            finally:
                ADMITTED.reset(mark)
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
            call.defer_settlement()
            try:
                _fail(call.adapter, call, exc)
            finally:
                await call.settle_deferred()
            denial = _denial(call, exc)
            if denial is None:
                raise
            raise denial from exc
        return item


def _describe(
    adapter: ProviderAdapter,
    instance: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    method: str,
    request: Request | None = None,
    size: int = -1,
) -> tuple[Any, Request, CallSpec, Any, bool, otel_context.Context] | None:
    """The call's chain, request, spec and span (None: passed through).
    ``request``: read already (by the plain lane, which left it here), with
    ``size``, the UTF-8 bytes of its input its reader counted (-1: none)."""
    above = ADMITTED.get()
    if above is not None and _counted_above(adapter, above):
        return None  # a layer above admitted this call: counted there (G13)
    current = otel_current()
    ctx: ExecutionContext | None = current.get(CONTEXT_KEY)  # type: ignore[assignment]
    if ctx is None:  # no active chain (one dict read)
        ctx = default_context(current)  # the process default, or none
        if ctx is None:
            return None
    if request is None:
        request = adapter.read_request(instance, args, kwargs, method)
        if request is None:
            return None
    if not request[_PRICED]:  # admitted at its configured bound, if it has one
        request = bounded(ctx, request.provider or adapter.provider, request)
    # Every field at once: one unpacking, not a descriptor call per field read.
    op, model, parts, n_msgs, cap, clamps, choices, stream, extra, _, provider, _, writes = request
    if provider is None:
        provider = adapter.provider
    state = ctx._state  # ctx.names_agents, without its two property frames
    agent = current_agent() if state.agents_named or _agents._limited_in_code else None
    spec = _spec_of(
        CallSpec,
        (
            provider,
            op,
            model,
            # input_bound(parts, n_messages), without its two frames for a list,
            # and with no walk where the plain reader counted the bytes
            (
                size
                if size >= 0
                else _list_bytes(parts)
                if type(parts) is list
                else _utf8_bytes(parts)
            )
            + (n_msgs if n_msgs > 1 else 1) * TOKENS_PER_MESSAGE
            + TOKENS_PER_REQUEST
            + extra,
            cap,
            clamps,
            choices,
            stream,
            agent,
            parts,
            writes,
        ),
    )
    if not adapter._plain_spans and (
        adapter.span_kwarg is None or kwargs.get(adapter.span_kwarg) is not None
    ):
        span = adapter.call_span(instance, args, kwargs, request, agent, current)
        if span is not None:
            return ctx, request, spec, span, False, current
    if (
        getattr(trace, "_TRACER_PROVIDER", True) is None  # no TracerProvider: no span
        and not current.get(_SUPPRESS_KEY)  # suppressed: start_span's INVALID_SPAN
        and not current.get(_SUPPRESS_KEY_PLAIN)
    ):
        return ctx, request, spec, UNTRACED_SPAN, True, current  # start_span's, without its frame
    span = start_span(op, provider, model, agent, current)
    return ctx, request, spec, span, True, current


def _prepared(
    adapter: ProviderAdapter,
    instance: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    request: Request,
    admitted: tuple[ContainedCall, int | None, str | None],
) -> tuple[ContainedCall, tuple[Any, ...], dict[str, Any]]:
    """Put the clamp and fallback into the arguments, the request on the span."""
    call, clamp, fallback = admitted  # its request and adapter set by the wrapper
    attributes = call.pending_attributes
    if request.attributes is not None and BOUND_USD in request.attributes:
        call.__class__ = BoundedCall  # costs its bound, whatever its reply reports
    if attributes is not None:
        if request.cap is not None and GEN_AI_REQUEST_MAX_TOKENS not in attributes:
            attributes[GEN_AI_REQUEST_MAX_TOKENS] = request.cap
        read = adapter.request_attributes(instance, args, kwargs, request)
        if read:
            attributes.update(read)
        if adapter.server is not None:
            attributes.setdefault("server.address", adapter.server)
    if clamp is not None or fallback is not None:
        args, kwargs = adapter.rewrite(instance, args, kwargs, clamp, fallback)
    return call, args, kwargs


def _fail(adapter: ProviderAdapter, call: ContainedCall, error: BaseException) -> None:
    """Settle a call whose SDK call raised ``error``, per the G10 table."""
    lost = call.count_lost(0)
    if not call.sends and not lost:  # the HTTP layer saw nothing leave
        if call.unsent or adapter.unsent(error) or denial_in(error) is not None:
            call.finish(error, sent=False)  # never connected, or refused before sending
            return
        if adapter.billed_nothing(error):
            call.finish(error, billed=False)  # the HTTP layer unseen: the SDK's error says
            return
    elif (
        call.replies
        and not lost
        and (adapter.billed_nothing(error) or denial_in(error) is not None)
    ):
        # Every attempt sent was answered by an HTTP error (the last one, or
        # one before a retry we refused, unsent): the provider billed nothing.
        call.finish(error, billed=False)
        return
    call.finish(error)


def _failed(
    adapter: ProviderAdapter, call: ContainedCall, error: BaseException
) -> BudgetExceededError | None:
    """Settle a sync call whose SDK call raised ``error`` (:func:`_fail`); our
    denial to raise from it when the SDK wrapped one in its own error (None:
    re-raise ``error``)."""
    _fail(adapter, call, error)
    denial = _denial(call, error)
    return None if denial is error else denial


def _settle(adapter: ProviderAdapter, call: ContainedCall, reply: Any, is_async: bool) -> Any:
    try:
        request = call.request
        if type(reply) in adapter.whole_replies:
            if call.done:
                return reply  # settled already (its payload said all): nothing to read
        elif request.stream if adapter._plain_streams else adapter.is_stream(reply, request):
            return adapter.wrap_stream(call, reply, is_async)
        adapter.read_reply(call, reply)
    except Exception:
        _logger.exception("reading a %s reply failed; its reservation is committed", call.provider)
    call.finish()
    return reply


def wrapper(
    adapter: ProviderAdapter,
    method: str,
    is_async: bool = False,
    otherwise: Callable[..., Any] | None = None,
) -> Callable[..., Any]:
    """The ``wrapt`` wrapper that contains one SDK method through ``adapter``.

    ``method`` names the hooked method to :meth:`ProviderAdapter.read_request`
    (one adapter reads several). ``is_async``: the method returns an awaitable.
    ``otherwise``: a ``wrapt`` wrapper for the calls ``adapter`` does not admit
    (another endpoint of the SDK, no chain), unless one of ``adapter``'s own
    calls is running (it sends them as part of itself); None: sent as they are.
    """
    if is_async:
        return _async_wrapper(adapter, method, otherwise)
    return _sync_wrapper(adapter, method, otherwise)


def _passes(adapter: ProviderAdapter, otherwise: Callable[..., Any] | None) -> bool:
    """Whether a call ``adapter`` did not admit is sent as it is (not to ``otherwise``)."""
    if otherwise is None:
        return True
    call = ADMITTED.get()
    return call is not None and call.adapter is adapter


def _async_wrapper(
    adapter: ProviderAdapter, method: str, otherwise: Callable[..., Any] | None
) -> Callable[..., Any]:
    async def acontained(
        wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        described = _describe(adapter, instance, args, kwargs, method)
        if described is None:
            if _passes(adapter, otherwise):
                return await wrapped(*args, **kwargs)
            return await otherwise(wrapped, instance, args, kwargs)  # type: ignore[misc]
        ctx, request, spec, span, owns, current = described
        span_token = make_current(span, current) if owns and span is not UNTRACED_SPAN else None
        admitted = None
        try:
            if not request[_PRICED] and ctx.has_cost_ceiling:
                _refuse(adapter, ctx, request, span)
            call, clamp, fallback = admitted = await aadmit(ctx, span, owns, spec)
            call.request, call.adapter, call.http_attempts = request, adapter, True
            if (clamp, fallback, call.pending_attributes, request[_ATTRIBUTES]) != _NOTHING:
                call, args, kwargs = _prepared(adapter, instance, args, kwargs, request, admitted)
            delay_ms = call.handle.decision.rate_limit_ms  # a policy's wait before sending
            if delay_ms:
                await asyncio.sleep(delay_ms / 1000)
        except BaseException as exc:
            if admitted is not None:  # admitted, then rewriting failed: nothing sent
                await admitted[0].afinish(exc, sent=False)
            if span_token is not None:
                release_current(span_token)
            raise
        mark = ADMITTED.set(call)
        # Baggage leaves with the request: ours must not (none at all: one read).
        stripped = strip_veronica_baggage(current) if current.get(_BAGGAGE_KEY) else None
        try:
            reply = await wrapped(*args, **kwargs)
        except BaseException as exc:
            call.defer_settlement()
            try:
                _fail(adapter, call, exc)
            finally:
                await call.settle_deferred()
            denial = _denial(call, exc)
            if denial is None or denial is exc:
                raise
            raise denial from exc  # the SDK wrapped our denial in its own error
        finally:
            _detach(stripped, mark, span_token)
        call.defer_settlement()
        try:
            return _settle(adapter, call, reply, True)
        finally:
            await call.settle_deferred()

    return acontained


def _sync_wrapper(
    adapter: ProviderAdapter, method: str, otherwise: Callable[..., Any] | None
) -> Callable[..., Any]:
    def contained(
        wrapped: Any,
        instance: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        request: Request | None = None,
        size: int = -1,
    ) -> Any:
        described = _describe(adapter, instance, args, kwargs, method, request, size)
        if described is None:
            if _passes(adapter, otherwise):
                return wrapped(*args, **kwargs)
            return otherwise(wrapped, instance, args, kwargs)  # type: ignore[misc]
        ctx, request, spec, span, owns, current = described
        # Current from admission until the SDK returns: a denial's trip event
        # lands on this span, and HTTP spans nest under it (a span not ours
        # is current already; none while untraced: make_current's first test).
        span_token = (
            None
            if not owns or span is UNTRACED_SPAN
            else make_current(span, current)
            if _set_current is None
            # make_current's lane for the API's default runtime, without its frame
            else _set_current(Context({**current, _SPAN_KEY: span}))
        )
        admitted = None
        try:
            if not request[_PRICED] and ctx.has_cost_ceiling:
                _refuse(adapter, ctx, request, span)
            call, clamp, fallback = admitted = admit(ctx, span, owns, spec)
            call.request, call.adapter, call.http_attempts = request, adapter, True
            if (clamp, fallback, call.pending_attributes, request[_ATTRIBUTES]) != _NOTHING:
                call, args, kwargs = _prepared(adapter, instance, args, kwargs, request, admitted)
            delay_ms = call.handle.decision.rate_limit_ms  # a policy's wait before sending
            if delay_ms:
                time.sleep(delay_ms / 1000)
        except BaseException as exc:
            if admitted is not None:  # admitted, then rewriting failed: nothing sent
                admitted[0].finish(exc, sent=False)
            if span_token is not None:
                release_current(span_token)
            raise
        mark = ADMITTED.set(call)
        # Baggage leaves with the request: ours must not (none at all: one read).
        stripped = strip_veronica_baggage(current) if current.get(_BAGGAGE_KEY) else None
        try:
            reply = wrapped(*args, **kwargs)
        except BaseException as exc:
            denial = _failed(adapter, call, exc)
            if denial is None:
                raise
            raise denial from exc  # the SDK wrapped our denial in its own error
        finally:
            if stripped is not None:
                otel_context.detach(stripped)  # type: ignore[arg-type]
            ADMITTED.reset(mark)
            if span_token is not None:
                try:  # release_current, without its frame where it resets _CURRENT
                    _CURRENT.reset(span_token)  # type: ignore[union-attr]
                except Exception:  # not ours to reset (the API's runtime), or failed: its way
                    release_current(span_token)
        if type(reply) in adapter.whole_replies:  # _settle's lanes for a whole reply
            if call.done:
                return reply  # settled already (its payload said all): nothing to read
            if adapter._plain_replies:
                call.finish()  # nothing to read
                return reply
        return _settle(adapter, call, reply, False)

    if adapter.read_plain is not None:
        contained.veronica_lane = lambda: _lane(adapter, contained)  # type: ignore[attr-defined]
    return contained


# One frame per call by design (issue 26): its statements are the general way's, run once each.
def _lane(adapter: ProviderAdapter, contained: Callable[..., Any]) -> Callable[..., Any]:  # noqa: PLR0915
    """The hooked method's plain lane: ``contained`` (the general way) for
    everything but the common call, which it runs in this one frame.

    The common call: in a chain (the active one or the process default), an
    adapter with a :attr:`~ProviderAdapter.read_plain` reader, a sync method
    of a class (``_hooks._plain`` puts this function over it), no
    TracerProvider, no span but one that does not record, no baggage, no
    suppression, no call admitted above, a chain whose plain lane is open
    (``Admission._lane``: in process, a root, no policies, pools, deadline
    or repeat limit; no trip, no cancellation, no agents, no wrapped call to
    join), a plain request (its input bytes read), a closed in-process
    breaker, a cached untiered price and a cap the request sets.
    Every rule it applies is copied from the general way and named where it
    is: ``_describe`` (the input bound), ``admit_call``'s plain lane (the
    worst case, the handle) with ``LocalLedger.plain_step`` (the reservation,
    under the ledger's lock), ``admit`` (the call), the sync wrapper (the
    send, the G10 table on an error) and ``ContainedCall.finish`` with
    ``PlainCall.commit`` and ``LocalLedger.commit_one`` (a whole reply with
    plain usage, less than was reserved; more, or exactly it, is committed
    by ``commit_one`` itself). Anything else,
    at any of these points, goes the general way (before anything is held,
    or, once admitted, to the shared settlement).
    """
    read: Callable[..., tuple[Request | None, int]] = type(adapter).read_plain  # type: ignore[assignment]
    with_instance = adapter.plain_reads_instance
    provider = adapter.provider
    whole = adapter.whole_replies
    plain_replies = adapter._plain_replies

    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: PLR0915
        method = hooked.__wrapped__  # type: ignore[attr-defined]
        current = otel_current()
        ctx: Any = current.get(CONTEXT_KEY)
        if ctx is None:  # no active chain: the process default (zero code), or none
            ctx = default_context(current)
        request: Request | None = None
        size = -1
        call: ContainedCall | None = None
        if ctx is not None and admitted_call() is None:  # else passed through, or counted above
            # What _describe would read next: read here, and left to it when the lane is not taken.
            request, size = (
                read(adapter, args, kwargs, self) if with_instance else read(adapter, args, kwargs)
            )
            admission = ctx._admission
            state = admission._state
            lane = admission._lane
            if (
                size >= 0
                and request is not None
                and lane is not None
                and getattr(trace, "_TRACER_PROVIDER", True) is None  # no span to start
                and type(current.get(_SPAN_KEY, INVALID_SPAN)) is NonRecordingSpan  # no peer's
                and not current.get(_SUPPRESS_KEY)
                and not current.get(_SUPPRESS_KEY_PLAIN)
                and not current.get(_BAGGAGE_KEY)  # none to strip before the send
                and not _agents._limited_in_code
                and not state.agents_named
                and not pending  # nothing left by garbage collection to settle first
                and state.trip is None
                and not admission._token.cancelled
                and _active_call() is None  # no wrapped call to join: a step of its own
            ):
                # _describe's input bound, then admit_call's plain lane: the
                # breaker closed, the price cached and untiered, the cap set.
                _, model, _, n_msgs, cap, _, _, _, extra, _, _, _, writes = request
                key = (provider, model)
                breaker = _BREAKERS.get(key)
                table = admission._prices
                if table is None:
                    table = _pricing._default_table
                prices = None if table is None else table._cache.get(key)
                worst = None if prices is None else prices._untiered
                bound = (
                    size
                    + (n_msgs if n_msgs > 1 else 1) * TOKENS_PER_MESSAGE
                    + TOKENS_PER_REQUEST
                    + extra
                )
                if (
                    worst is not None
                    and type(breaker) is CircuitBreaker
                    and breaker._state is _CLOSED
                    and type(cap) is int
                    and 0 <= cap <= MAX_COUNT
                    and bound <= MAX_COUNT
                ):
                    cost = -(
                        -(bound * (worst[0] if writes else worst[1]) + cap * worst[2]) // _PER_MTOK
                    )
                    # LocalLedger.plain_step's rule, copied (one frame less): under
                    # the ledger's lock, on a level with no trip or override, the
                    # step, tokens and cost within its limits are taken, its
                    # one-step reservation reused while its amounts are the
                    # same; else None (the general way re-checks under the lock).
                    ledger, live, limits = lane
                    tokens = bound + cap
                    reservation = None
                    lock = ledger._lock
                    lock.acquire()
                    try:
                        if live.trip is None and live.override is None:
                            steps = live.steps + 1
                            if (
                                (limits.steps is None or steps <= limits.steps)
                                and (
                                    limits.tokens is None
                                    or live.tokens + live.reserved_tokens + tokens <= limits.tokens
                                )
                                and (
                                    limits.cost_nano is None
                                    or live.cost_nano + live.reserved_nano + cost
                                    <= limits.cost_nano
                                )
                            ):
                                live.steps = steps
                                live.reserved_nano += cost
                                live.reserved_tokens += tokens
                                reservation = ledger._one
                                if reservation.cost_nano != cost or reservation.tokens != tokens:
                                    reservation = ledger._one = _one_step(cost, tokens)
                    finally:
                        lock.release()
                    if reservation is not None:
                        # admit_call's handle and admit's call, every field
                        # each sets (PlainCall.__new__, ContainedCall.__init__).
                        handle: CallHandle = _new(PlainCall)
                        handle.context = admission._settlement
                        handle.reservation = reservation
                        handle.decision = ALLOW
                        handle.model = model
                        handle.policy_context = handle.agents = None
                        handle.cost_nano = handle.tokens = -1
                        handle.metrics = getattr(_calls, "_real_instrument", _calls) is not None
                        handle._done = False
                        handle.kind = "llm"
                        # Stored a field at a time, in __init__'s order: the
                        # instance keeps the class's shared keys and inline
                        # values (a dict of its own outgrows pymalloc's blocks
                        # as the call's usage and attempts are set: a malloc).
                        call = _new(ContainedCall)
                        call.ctx = ctx
                        call.handle = handle
                        call.span = UNTRACED_SPAN
                        call.owns_span = True
                        call.provider = provider
                        call.model = model
                        call.prices = prices
                        call.input_bound = bound
                        call.output_cap = cap
                        call.breaker = breaker
                        call.probe = object()
                        call.request = request
                        call.adapter = adapter
                        call.http_attempts = True
        if call is None:  # the general way
            return contained(method.__get__(self, type(self)), self, args, kwargs, request, size)
        # The sync wrapper's send and G10 table on an error (its rules, copied).
        mark = ADMITTED.set(call)
        try:
            if type(method) is FunctionType:  # the SDK's own method: no binding
                reply = method(self, *args, **kwargs)
            else:  # another wrapper under ours (wrapt): bound, as it expects
                reply = method.__get__(self, type(self))(*args, **kwargs)
        except BaseException as exc:
            denial = _failed(adapter, call, exc)
            if denial is None:
                raise
            raise denial from exc  # the SDK wrapped our denial in its own error
        finally:
            ADMITTED.reset(mark)
        if type(reply) not in whole:
            return _settle(adapter, call, reply, False)
        if call.done:
            return reply  # settled already (its payload said all): nothing to read
        if not plain_replies:  # _settle's read of a whole reply (its rule, copied), no frame
            try:
                adapter.read_reply(call, reply)
            except Exception:
                _logger.exception(
                    "reading a %s reply failed; its reservation is committed", provider
                )
            if call.done:
                return reply  # settled by its reader (an error status the SDK raises next)
        # A whole reply: ContainedCall.finish's plain usage (input and output
        # tokens, nothing lost or retried), committed as PlainCall.commit
        # commits it, with no span to end and a breaker with nothing to reset
        # (finish's own tests); anything else, finish.
        handle = call.handle
        plain = call.prices._plain  # type: ignore[union-attr]
        breaker = call.breaker
        if (
            not call.usage_seen
            or plain is None
            or call.sends > 1
            or call.lost_attempts
            or call.cached_tokens
            or call.reasoning_tokens
            or call.cache_write_tokens
            or handle._done
            or breaker._state is not _CLOSED  # type: ignore[union-attr]
            or breaker._failures  # type: ignore[union-attr]
        ):
            call.finish()
            return reply
        call.done = handle._done = True
        inp, out = call.input_tokens, call.output_tokens
        cost = -(-(inp * plain[0] + out * plain[1]) // _PER_MTOK)
        cost = cost if cost < _MAX_EXACT else _MAX_EXACT
        tokens = inp + out
        held = handle.cost_nano  # usage reported into it before (record_usage) adds
        if held > 0:
            cost += held
        held = handle.tokens
        if held > 0:
            tokens += held
        handle.cost_nano, handle.tokens = cost, tokens
        try:
            context: Any = handle.context
            reservation = handle.reservation
            held_cost, held_tokens = reservation.cost_nano, reservation.tokens
            if (
                cost <= held_cost
                and tokens <= held_tokens
                and (cost != held_cost or tokens != held_tokens)
            ):
                # LocalLedger.commit_one's rule for less than was reserved, copied
                # (one frame less): under the ledger's lock, the queued exact
                # commits applied, the reservation moved out and the usage in;
                # it crosses no ceiling (no overrun). The chain's one level is
                # the lane's (state.fast, as context._fast).
                ledger, live, _ = lane
                lock = ledger._lock
                lock.acquire()
                try:
                    if live.settled:
                        _settle_queued(live)
                    live.reserved_nano -= held_cost
                    live.reserved_tokens -= held_tokens
                    live.cost_nano += cost
                    live.tokens += tokens
                finally:
                    lock.release()
                if handle.metrics:
                    context._finished(handle, None, cost, None)
            else:  # exactly the reservation (queued), or over it (a trip to read)
                ledger, level, state = context._fast
                overrun = ledger.commit_one(level, state, reservation, cost, tokens)
                if overrun is not None or handle.metrics:
                    context._finished(handle, None, cost, overrun)
        except Exception:
            _logger.exception("settling an instrumented call failed")
        return reply

    return hooked


def _detach(stripped: object, mark: contextvars.Token[Any], span_token: object) -> None:
    if stripped is not None:
        otel_context.detach(stripped)  # type: ignore[arg-type]
    ADMITTED.reset(mark)
    if span_token is not None:
        release_current(span_token)  # type: ignore[arg-type]
