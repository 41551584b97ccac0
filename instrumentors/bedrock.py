"""Containment for Amazon Bedrock through ``boto3``/``botocore`` and ``aiobotocore``.

Usage::

    from veronica_otel.instrumentors.bedrock import BedrockInstrumentor

    BedrockInstrumentor().instrument()
    runtime = boto3.client("bedrock-runtime")
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)):
        runtime.converse(modelId="us.anthropic.claude-3-5-haiku-20241022-v1:0", ...)
        # raises BudgetExceededError when over

Configuration: limits come from the active :class:`ExecutionContext`, else the
process default chain (zero-code: ``VERONICA_*`` variables). With neither,
calls pass through untouched. Model ids price through ``genai-prices``'
Bedrock table; cross-region profiles (``us.``, ``eu.``, ``apac.``, ...)
price as their base model; an application inference profile or provisioned
model ARN names no model: map it with ``VERONICA_MODEL_ALIASES``.

Where it hooks:

- ``botocore.client.BaseClient._make_api_call`` /
  ``aiobotocore.client.AioBaseClient._make_api_call``: once per API call of any
  AWS client. Calls to other services pass after one check (the client's
  public ``meta.service_model.service_name`` in a set). ``bedrock-runtime``
  ``Converse``, ``ConverseStream``, ``InvokeModel`` and
  ``InvokeModelWithResponseStream`` are contained (read in
  ``_bedrock_request``, settled from ``_bedrock_response``); the endpoints
  whose bill a request cannot bound (batch, evaluation and customisation
  jobs, async invocations, bidirectional streams, guardrails, agents, flows:
  ``_bedrock_request.REFUSED``, and any ``bedrock-runtime`` operation not
  known to be free) are refused under a cost or token ceiling, naming them.
- Each HTTP attempt is reported by the transport hooks (``_attempts``:
  urllib3 for botocore, aiohttp or httpx for aiobotocore): botocore's own
  retries (legacy, standard and adaptive modes) draw on ``max_retries_total``.
  A retry refused there reaches the caller as :class:`BudgetExceededError`:
  a ``needs-retry`` handler registered first on each Bedrock client's events
  stops botocore from retrying our denial, which its HTTP session wraps in
  ``HTTPClientError`` (botocore backs off once before the refused attempt,
  as it decides a retry before sending it; never after the refusal).

Streams (``response["stream"]``, ``response["body"]``) are held so each event
is accounted and a trip cuts the stream at the next event.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import weakref
from collections.abc import Callable, Collection
from typing import Any

import wrapt

from ._adapter import ProviderAdapter, Request, _lane, denial_in, http_status, wrapper
from ._bedrock_request import (
    FREE,
    LAST,
    REFUSED,
    arguments,
    invoke_request,
    read_converse,
    read_plain,
    refused_request,
    rewrite_converse,
    rewrite_invoke,
)
from ._bedrock_response import (
    AsyncEvents,
    Events,
    converse_item,
    converse_reply,
    invoke_item,
    invoke_reply,
    status_of,
)
from ._common import ContainedCall
from ._hooks import GuardedInstrumentor, Hook, InstrumentationError, SDKHooks

__all__ = ["BedrockInstrumentor"]

PROVIDER = "aws.bedrock"
_instruments = ("botocore >= 1.34.116, < 2",)
_AIO_REQUIREMENT = "aiobotocore >= 2.13, < 4"
_SERVICES = frozenset(REFUSED)  # bedrock-runtime among them


class _Bedrock(ProviderAdapter):
    provider = PROVIDER

    def billed_nothing(self, error: BaseException) -> bool:
        if type(error).__name__ == "EventStreamError":
            return False  # an error event mid-stream: tokens may have been billed
        status = status_of(error) or http_status(error)
        return status is not None and status >= 400


class _Converse(_Bedrock):
    """``Converse`` and ``ConverseStream`` (:class:`_ConverseStream`: its
    ``response["stream"]`` is held)."""

    # Converse's reply: botocore's parsed dict, read and settled as it returns
    # (in the shared lane's frame).
    whole_replies = frozenset((dict,))
    # The request, the reply and its items read without a frame of their own.
    read_request = read_converse
    # The shared lane's reader, given the client: ``Converse``'s only (it reads no
    # stream); the lane is the hook over every AWS call (_make_api_call's lane).
    read_plain = staticmethod(read_plain)
    plain_reads_instance = True

    def rewrite(
        self,
        instance: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        cap: int | None,
        model: str | None,
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        name, params = arguments(args, kwargs)
        return (name, rewrite_converse(params, cap, model)), {}

    read_reply = staticmethod(converse_reply)
    read_item = staticmethod(converse_item)  # type: ignore[assignment]

    def wrap_stream(self, call: ContainedCall, reply: Any, is_async: bool) -> Any:
        return _held(self, call, reply, "stream", is_async)


class _ConverseStream(_Converse):
    """``ConverseStream``: its reply, a dict too, holds the stream (no reply is whole)."""

    whole_replies = frozenset()


class _Invoke(_Bedrock):
    """``InvokeModel`` and ``InvokeModelWithResponseStream`` (``response["body"]``)."""

    def read_request(
        self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], method: str
    ) -> Request:
        stream = method == "InvokeModelWithResponseStream"
        return invoke_request(arguments(args, kwargs)[1], stream)

    def rewrite(
        self,
        instance: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        cap: int | None,
        model: str | None,
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        name, params = arguments(args, kwargs)
        return (name, rewrite_invoke(params, cap, model)), {}

    def read_reply(self, call: ContainedCall, reply: Any) -> None:
        invoke_reply(call, reply)

    def read_item(self, call: ContainedCall, item: Any) -> None:
        invoke_item(call, item)

    def wrap_stream(self, call: ContainedCall, reply: Any, is_async: bool) -> Any:
        return _held(self, call, reply, "body", is_async)


class _Refused(_Bedrock):
    """Endpoints whose bill cannot be bounded: denied under any cost or token ceiling."""

    def read_request(
        self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], method: str
    ) -> Request:
        service = instance.meta.service_model.service_name
        return refused_request(service, method, arguments(args, kwargs)[1])

    def read_reply(self, call: ContainedCall, reply: Any) -> None:
        # No ceiling asked for it (else it was denied): a step, its spend unmetered.
        call.set_usage(0, 0)


def _held(
    adapter: ProviderAdapter, call: ContainedCall, reply: Any, key: str, is_async: bool
) -> Any:
    """The reply with its event stream under ``key`` held by our stream proxy."""
    stream = reply.get(key) if isinstance(reply, dict) else None
    if stream is None:  # nothing to hold: settle what the reply says
        adapter.read_reply(call, reply)
        call.finish()
        return reply
    events = AsyncEvents(stream) if is_async else Events(stream)
    reply[key] = ProviderAdapter.wrap_stream(adapter, call, events, is_async)
    return reply


_CONVERSE, _CONVERSE_STREAM = _Converse(), _ConverseStream()
_INVOKE, _REFUSE = _Invoke(), _Refused()
_Route = tuple[Callable[..., Any], Callable[..., Any]]


def _pair(adapter: ProviderAdapter, operation: str) -> _Route:
    return wrapper(adapter, operation), wrapper(adapter, operation, True)


_ROUTES: dict[tuple[str, str], _Route] = {
    ("bedrock-runtime", "Converse"): _pair(_CONVERSE, "Converse"),
    ("bedrock-runtime", "ConverseStream"): _pair(_CONVERSE_STREAM, "ConverseStream"),
    ("bedrock-runtime", "InvokeModel"): _pair(_INVOKE, "InvokeModel"),
    ("bedrock-runtime", "InvokeModelWithResponseStream"): _pair(
        _INVOKE, "InvokeModelWithResponseStream"
    ),
}
for _service, _operations in REFUSED.items():
    for _operation in _operations:
        _ROUTES[(_service, _operation)] = _pair(_REFUSE, _operation)


# The Bedrock client seen last: a weak reference to its ``meta`` and its service. A
# process's client asks again every call: its service is read once, and its
# needs-retry handler (_stop_retrying_denials) is known to be registered.
_LAST = LAST


def _route(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Route | None:
    """The wrappers for a Bedrock call we contain or refuse; None: it passes."""
    meta = instance.meta
    last, service = _LAST[0]
    known = last() is meta
    if not known:
        service = meta.service_model.service_name
        if service not in _SERVICES:
            return None  # every other AWS call: two attribute reads and a set lookup
    operation = args[0] if len(args) >= 2 else arguments(args, kwargs)[0]
    route = _ROUTES.get((service, operation))
    if route is None and service == "bedrock-runtime" and operation not in FREE:
        route = _ROUTES[(service, operation)] = _pair(_REFUSE, operation)  # a new operation
    if route is not None and not known:
        _stop_retrying_denials(instance)
        _LAST[0] = (weakref.ref(meta), service)
    return route


# -- botocore must not retry our denial ---------------------------------------------------

_REGISTERED: weakref.WeakSet[Any] = weakref.WeakSet()


def _no_retry_of_denials(caught_exception: BaseException | None = None, **_: Any) -> None:
    """``needs-retry`` handler: a retry we refused ends the call, unslept, as our error."""
    if caught_exception is not None:
        denial = denial_in(caught_exception)
        if denial is not None:
            raise denial


def _stop_retrying_denials(client: Any) -> None:
    events = client.meta.events
    if events not in _REGISTERED:
        # Under the service's own node, first: botocore calls the most specific
        # handlers first, and its retry handler (legacy mode) re-raises errors.
        service = client.meta.service_model.service_id.hyphenize()
        events.register_first(
            f"needs-retry.{service}", _no_retry_of_denials, unique_id=f"veronica-denials-{service}"
        )
        _REGISTERED.add(events)


# -- the hooks ------------------------------------------------------------------------


def _make_api_call(
    wrapped: Any,
    instance: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    request: Request | None = None,
    size: int = -1,
) -> Any:
    """Route a call to its adapter's wrapper, or send it (another AWS service).
    ``request`` and ``size`` (its input bytes): a Converse call's, read by the
    shared lane, which left it here."""
    # The client seen last asks again (botocore passes both arguments by
    # position): its routes without _route's frame; anything else asks _route.
    last, service = _LAST[0]
    route = _ROUTES.get((service, args[0])) if len(args) == 2 and last() is instance.meta else None
    if route is None and (route := _route(instance, args, kwargs)) is None:
        return wrapped(*args, **kwargs)
    return route[0](wrapped, instance, args, kwargs, request, size)


# The plain function ``_hooks`` puts over the method (its ``veronica_lane``): the
# shared lane of Converse, whose reader reads a Converse call of the Bedrock client
# seen last and leaves any other call to _make_api_call (the lane's general way).
_make_api_call.veronica_lane = lambda: _lane(_CONVERSE, _make_api_call)  # type: ignore[attr-defined]


async def _amake_api_call(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    route = _route(instance, args, kwargs)
    if route is None:
        return await wrapped(*args, **kwargs)
    return await route[1](wrapped, instance, args, kwargs)


def _is_bedrock(instance: Any) -> bool:
    try:
        return instance.meta.service_model.service_name in _SERVICES
    except Exception:
        return True  # cannot tell: refused (closed)


class _BedrockHooks(SDKHooks):
    """SDK hooks whose refusal (hooks that do not fit) stops Bedrock calls only."""

    def _guard(self, message: str, is_async: bool) -> Callable[..., Any]:
        guard = super()._guard(message, is_async)
        if is_async:

            async def arefuse(
                wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
            ) -> Any:
                if _is_bedrock(instance):
                    return await guard(wrapped, instance, args, kwargs)
                return await wrapped(*args, **kwargs)

            return arefuse

        def refuse(
            wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> Any:
            if _is_bedrock(instance):
                return guard(wrapped, instance, args, kwargs)
            return wrapped(*args, **kwargs)

        return refuse


_BOTOCORE = _BedrockHooks(
    _instruments[0],
    "botocore.client",
    (Hook("BaseClient", "_make_api_call", _make_api_call, ("operation_name", "api_params")),),
    (("BaseClient", ("_make_api_call",)),),
)
_AIOBOTOCORE = _BedrockHooks(
    _AIO_REQUIREMENT,
    "aiobotocore.client",
    (
        Hook(
            "AioBaseClient",
            "_make_api_call",
            _amake_api_call,
            ("operation_name", "api_params"),
            is_async=True,
        ),
    ),
    (("AioBaseClient", ("_make_api_call",)),),
)


def _aiobotocore_installed() -> bool:
    return importlib.util.find_spec("aiobotocore") is not None


# Whether aiobotocore's hooks are wanted (instrumented): its module may be
# imported later than botocore's, or botocore may still be importing when we
# are instrumented (zero code's import hook), and aiobotocore imports botocore.
_aio_wanted = False
_aio_hook_registered = False


def _install_aiobotocore(_module: object = None) -> None:
    if not _aio_wanted:
        return
    # A failure is logged and refused by install(): its Bedrock calls fail closed.
    with contextlib.suppress(InstrumentationError):
        _AIOBOTOCORE.install()


def _when_aiobotocore_imported() -> None:
    """Install aiobotocore's hooks now if it is imported, else when it is."""
    global _aio_hook_registered
    if "aiobotocore.client" in sys.modules:
        _AIOBOTOCORE.install()
    elif not _aio_hook_registered:
        _aio_hook_registered = True
        wrapt.register_post_import_hook(_install_aiobotocore, "aiobotocore.client")


class BedrockInstrumentor(GuardedInstrumentor):
    """Contains every Amazon Bedrock call of ``botocore`` and ``aiobotocore`` clients.

    ``instrument()`` raises :class:`~veronica_otel.instrumentors.InstrumentationError`
    when the installed ``botocore`` (or ``aiobotocore``, when installed) is
    outside the tested range or a hook changed; that library is not patched
    and its Bedrock calls in a chain are refused (fail closed); other AWS
    calls pass.
    """

    _hooks = _BOTOCORE
    reports_attempts = True

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        global _aio_wanted
        super()._instrument(**kwargs)
        if _aiobotocore_installed():
            _aio_wanted = True
            _when_aiobotocore_imported()

    def _uninstrument(self, **kwargs: Any) -> None:
        global _aio_wanted
        _aio_wanted = False
        _AIOBOTOCORE.remove()
        super()._uninstrument(**kwargs)

    def uninstrument(self, **kwargs: Any) -> Any:
        global _aio_wanted
        _aio_wanted = False
        _AIOBOTOCORE.remove()  # hooks or a refusal a failed instrument() left
        if not self.is_instrumented_by_opentelemetry:
            self._hooks.remove()
        return super().uninstrument(**kwargs)
