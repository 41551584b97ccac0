"""The adapter and hooks of a Stainless-generated SDK that speaks the OpenAI wire format.

``openai`` (2.x and 3.x) and ``groq`` share one generated base client
(``<package>._base_client``): the same request loop, retry sleep and payload
parsing. :class:`StainlessAdapter` reads the ``request(cast_to, options,
stream=...)`` arguments (:mod:`._openai_request`) and holds a reply read
later (:mod:`._openai_response`); :func:`stainless_hooks` builds the hooks
for one SDK's adapter (each instrumentor module subclasses it with its
package and provider name, and declares its supported range). What each hook
does is documented in :mod:`veronica_otel.instrumentors.openai`.

``request`` goes through the shared wrapper (:func:`~._adapter.wrapper`):
admission, the span, the clamp and fallback, the G10 table, settlement and
the counted-once mark live there. The two hooks with no generic twin find
the call in flight as :data:`~._adapter.ADMITTED` (one of this adapter's):

- ``_sleep_for_retry``: the SDK is about to retry; the retry is drawn before
  its backoff is slept (the transport's report of the resend finds it drawn),
  and trips are re-checked before and after the backoff. An attempt the
  transport hooks did not see (a custom transport) is noted here, by its error;
- ``_process_response_data``: every payload, stream events included.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any, ClassVar

from opentelemetry.trace.propagation import _SPAN_KEY

from veronica_otel._errors import BudgetExceededError

from ._adapter import ADMITTED, ProviderAdapter, Request
from ._breakers import never_connected, raised_within
from ._common import ContainedCall
from ._endpoints import OPENAI as OPENAI_ENDPOINTS
from ._endpoints import routed
from ._hooks import Hook
from ._http_libs import bound_call
from ._openai_attributes import call_attributes
from ._openai_request import _NOT_PEER, _peer_span, read_plain, read_request, rewritten
from ._openai_response import _MODEL_TYPES, BOUND, account, hold, payload_lane

__all__ = [
    "GUARDS",
    "OpenAIWireAdapter",
    "StainlessAdapter",
    "in_flight",
    "retry_wrappers",
    "stainless_hooks",
    "with_options",
]

# The logger users filter on, as before the hooks were split out of openai.py.
_logger = logging.getLogger(__name__.rpartition(".")[0] + ".openai")


def _options(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[1] if len(args) > 1 else kwargs.get("options")


class StainlessAdapter(ProviderAdapter):
    """A Stainless-generated SDK (``openai``, ``groq``, ``anthropic``): hooked once
    per API call (:attr:`~._adapter.ProviderAdapter.nests`), its errors read by
    its own classes. Subclasses set :attr:`provider` and :attr:`package`."""

    #: Its import name (``"openai"``, ``"groq"``, ``"anthropic"``): where its
    #: ``Stream``, ``AsyncStream`` and error classes are found.
    package: ClassVar[str] = ""
    nests = True
    # Where its request loop sends an attempt and reads its reply: an error
    # raised inside either (an interrupt, a cancellation) came after the
    # request may have left.
    _sending: ClassVar[frozenset[str]] = frozenset(("_send_request", "_process_response"))
    _errors: tuple[type[BaseException], type[BaseException]] | None = None

    def outcome(self, error: BaseException | None) -> str:
        """What a failed attempt's error says: ``"reply"`` (an HTTP error status),
        ``"unsent"`` (refused by us, never connected, or raised before the send
        began) or ``"lost"`` (sent, maybe billed, never answered)."""
        errors = self._errors
        if errors is None:  # looked up on first use: the SDK may still be importing
            sdk = importlib.import_module(self.package)
            errors = self._errors = (sdk.APIConnectionError, sdk.APIStatusError)
        if isinstance(error, errors[1]):
            return "reply"
        if error is None:
            return "lost"  # no error to read: assume the worst
        if isinstance(error, BudgetExceededError) or never_connected(error):
            return "unsent"
        if (
            isinstance(error, errors[0])  # a timeout or a connection lost mid-request
            or type(error).__module__.split(".", 1)[0] in _TRANSPORT_MODULES
            or raised_within(error, self._sending)
        ):
            return "lost"
        return "unsent"

    def unsent(self, error: BaseException) -> bool:
        return self.outcome(error) == "unsent"


# A retry hook sees the transport's own error, before the SDK wraps it.
_TRANSPORT_MODULES = frozenset(("httpx2", "httpx", "httpcore", "ssl", "anyio"))


class OpenAIWireAdapter(StainlessAdapter):
    """A Stainless SDK speaking the OpenAI wire format (``openai``, ``groq``)."""

    #: Parsed response models: their usage was read by the payload hook inside
    #: ``request()``, so they settle as they return (:meth:`is_stream`: False).
    whole_replies = _MODEL_TYPES

    # request(cast_to, options, stream=...) read in one frame (the adapter is its first argument)
    read_request = read_request
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
        span = current.get(_SPAN_KEY)  # _peer_span's first test, without its frame
        if span is None or span is _NOT_PEER[0]:
            return None
        return _peer_span(request.operation, agent, current)

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
        # not is_parsed(reply), inline: a stream or a raw response, read later
        return reply is not None and type(reply) not in _MODEL_TYPES

    def wrap_stream(self, call: ContainedCall, reply: Any, is_async: bool) -> Any:
        return hold(self.package, call, reply)


def with_options(
    args: tuple[Any, ...], kwargs: dict[str, Any], options: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``request(cast_to, options, ...)``'s arguments with ``options`` in place."""
    if len(args) > 1:
        return (args[0], options, *args[2:]), kwargs
    return args, {**kwargs, "options": options}


def in_flight(adapter: StainlessAdapter) -> ContainedCall | None:
    """The call of ``adapter``'s SDK in flight (marked :data:`~._adapter.ADMITTED`)."""
    call = ADMITTED.get()
    return call if call is not None and call.adapter is adapter else None


def _note_retried(
    adapter: StainlessAdapter, call: ContainedCall, attempts: int, kwargs: Any
) -> None:
    """Note the failed attempt the SDK is about to retry, when the transport
    hooks did not see it (a transport they do not reach): it sent and was
    answered (``response=``), or its error (the one being handled) says."""
    if call.attempts >= attempts:
        return  # reported by the transport
    replied = kwargs.get("response") is not None
    said = "reply" if replied else adapter.outcome(sys.exc_info()[1])
    if said == "reply":
        call.sends += 1
        call.replies += 1
    elif said == "lost":
        call.lost_attempts += 1


def stainless_hooks(adapter: OpenAIWireAdapter) -> tuple[Hook, ...]:
    """The hooks of ``adapter``'s SDK base client, each with the parameters its wrapper reads."""
    sleep_for_retry, asleep_for_retry = retry_wrappers(adapter)
    return (
        Hook(
            "SyncAPIClient",
            "request",
            routed(adapter, OPENAI_ENDPOINTS),
            ("cast_to", "options"),
            ("stream",),
        ),
        Hook(
            "AsyncAPIClient",
            "request",
            routed(adapter, OPENAI_ENDPOINTS, is_async=True),
            ("cast_to", "options"),
            ("stream",),
            True,
        ),
        Hook("SyncAPIClient", "_sleep_for_retry", sleep_for_retry, (), ("retries_taken",)),
        Hook("AsyncAPIClient", "_sleep_for_retry", asleep_for_retry, (), ("retries_taken",), True),
        Hook(
            "BaseClient",
            "_process_response_data",
            _payload_wrapper(adapter),
            (),
            ("data", "response"),
        ),
    )


_Wrapper = Any


def retry_wrappers(adapter: StainlessAdapter) -> tuple[_Wrapper, _Wrapper]:
    """``_sleep_for_retry`` (before each SDK retry): the retry drawn, trips re-checked."""

    def sleep_for_retry(
        wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        call = in_flight(adapter)
        if call is not None:
            attempts = int(kwargs.get("retries_taken", 0)) + 1  # made so far
            _note_retried(adapter, call, attempts, kwargs)
            call.draw_retries(attempts)
            call.check_alive()  # a retry is a new dispatch: any trip stops it
        result = wrapped(*args, **kwargs)
        if call is not None:
            call.check_alive()  # the deadline may have passed while backing off
        return result

    async def asleep_for_retry(
        wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        call = in_flight(adapter)
        if call is not None:
            attempts = int(kwargs.get("retries_taken", 0)) + 1
            _note_retried(adapter, call, attempts, kwargs)
            await call.adraw_retries(attempts)
            await call.ctx.aensure_active()
        result = await wrapped(*args, **kwargs)
        if call is not None:
            await call.ctx.aensure_active()
        return result

    return sleep_for_retry, asleep_for_retry


def _payload_wrapper(adapter: OpenAIWireAdapter) -> _Wrapper:
    """``_process_response_data`` (every payload, stream events included): usage read."""
    package = adapter.package

    def process_response_data(
        wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        # Read after request() returned: bound to its call (none ever bound: none is).
        call = bound_call(kwargs.get("response")) if BOUND[0] else None
        later = call is not None
        if not later:  # parsed inside request(): the call in flight (in_flight, inline)
            call = ADMITTED.get()
            if call is not None and call.adapter is not adapter:
                call = None
        if call is not None and not call.done:
            try:
                account(call, kwargs.get("data"))
            except BudgetExceededError:
                raise  # cuts the stream: its generator closes the response
            except Exception:
                _logger.exception("reading usage from a %s payload failed", package)
            if later and call.usage_seen and not call.request.stream:
                call.finish()  # a raw response parsed after request() returned
        return wrapped(*args, **kwargs)

    # Over a plain method (_hooks._plain): the common payload read in one frame.
    process_response_data.veronica_lane = lambda: payload_lane(adapter, process_response_data)  # type: ignore[attr-defined]
    return process_response_data


# Where calls are refused when the hooks do not fit: public, every API call passes.
GUARDS = (("SyncAPIClient", ("request", "post")), ("AsyncAPIClient", ("request", "post")))
