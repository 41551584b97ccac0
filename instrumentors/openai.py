"""Containment for the ``openai`` SDK (2.30 and later 2.x, 3.x).

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

Counted once (DESIGN G13): a call an adapter above already admitted (litellm
over this SDK) passes through; while ours runs it is
:data:`~._adapter.ADMITTED`, so the HTTP layer below does not admit it again
(its retries are counted here, by the retry hook).

Both majors share these hooks; 3.x sends through ``httpx2``, 2.x through
``httpx`` (either takes a client of the other): the HTTP library is resolved
where a response is read (:mod:`._http_libs`), never imported here.

Layout (as contrib's ``openai_v2``): this module is what is patched;
``_stainless`` builds the wrappers (``groq`` shares them); ``_openai_request``
reads and rewrites a request (route, body, cap, the call described for the
kernel, its span); ``_openai_response`` reads how a call ended (reply, stream
events, usage, error) and settles it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from . import _realtime
from ._hooks import GuardedInstrumentor, SDKHooks
from ._openai_request import OPENAI
from ._stainless import GUARDS, stainless_hooks

__all__ = ["OpenAIInstrumentor"]

_instruments = ("openai >= 2.30, < 4",)

# Each hook and the parameters our wrapper reads (checked before any is wrapped).
_PATCHES = stainless_hooks(OPENAI)
_request = _PATCHES[0].wrapper  # what a peer's benchmark looks for on SyncAPIClient.request
_HOOKS = SDKHooks(_instruments[0], "openai._base_client", _PATCHES, GUARDS)


class OpenAIInstrumentor(GuardedInstrumentor):
    """Contains every HTTP API call of the ``openai`` SDK in the active chain.

    ``instrument()`` raises :class:`~veronica_otel.instrumentors.InstrumentationError`
    when the installed ``openai`` is outside the tested range or a hook changed;
    nothing is patched and calls in a chain are refused (fail closed).
    """

    _hooks = _HOOKS

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        try:
            super()._instrument(**kwargs)
        finally:  # WebSocket sessions bypass the HTTP hooks: contained either way
            _realtime.install()

    def uninstrument(self, **kwargs: Any) -> Any:
        _realtime.remove()
        return super().uninstrument(**kwargs)
