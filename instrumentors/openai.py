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

- ``SyncAPIClient.request`` / ``AsyncAPIClient.request``: once per API call,
  through the shared adapter wrapper (:mod:`._adapter`). Opens the GenAI span
  (or describes the call on a peer instrumentor's), runs the pre-call check,
  clamps the output cap when the request sets none, swaps in a fallback model
  (both in a copy of the request options), settles the call.
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

Every HTTP attempt is reported by the transport hooks (:mod:`._attempts`), as
for every adapter: an attempt after the first (the SDK's retry, or a resend by
a custom transport) is a retry, drawn once whichever of the retry hook and the
transport sees it first. What a call that did not end well costs (DESIGN G10)
is read by the shared table (:func:`~._adapter._fail`) from what the transport
saw: a connection never made was not sent; an attempt answered by an HTTP
error status (``APIStatusError``) is billed nothing; anything else once the
send began (a timeout, a lost connection, a cancellation, KeyboardInterrupt)
may have reached the provider and costs the reservation, one per attempt lost
unanswered. Where the transport saw no attempt (a transport the hooks do not
reach), the SDK's errors say: an interrupt or cancellation raised inside
``_send_request`` or ``_process_response`` came after the request may have
left, anywhere else before.

Counted once (DESIGN G13): a call an adapter above already admitted (litellm
over this SDK) passes through; while ours runs it is
:data:`~._adapter.ADMITTED`, so the HTTP layer below reports its attempts
instead of admitting it again.

Both majors share these hooks; 3.x sends through ``httpx2``, 2.x through
``httpx`` (either takes a client of the other): the HTTP library is resolved
where a response is read (:mod:`._http_libs`), never imported here.

Layout: this module is what is patched; ``_stainless`` holds the adapter
(:class:`~._stainless.OpenAIWireAdapter`, which ``groq`` shares) and builds
its hooks, ``request`` through the shared wrapper (:mod:`._adapter`);
``_openai_request`` reads and rewrites a request (route, body, cap, a peer
instrumentor's span); ``_openai_response`` reads a reply, stream events and
usage, and holds a reply read later.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from . import _realtime
from ._hooks import GuardedInstrumentor, SDKHooks
from ._stainless import GUARDS, OpenAIWireAdapter, stainless_hooks

__all__ = ["OpenAIInstrumentor"]

_instruments = ("openai >= 2.30, < 4",)


class OpenAIAdapter(OpenAIWireAdapter):
    provider = "openai"
    package = "openai"


# Each hook and the parameters our wrapper reads (checked before any is wrapped).
_PATCHES = stainless_hooks(OpenAIAdapter())
_request = _PATCHES[0].wrapper  # what a peer's benchmark looks for on SyncAPIClient.request
_HOOKS = SDKHooks(_instruments[0], "openai._base_client", _PATCHES, GUARDS)


class OpenAIInstrumentor(GuardedInstrumentor):
    """Contains every HTTP API call of the ``openai`` SDK in the active chain.

    ``instrument()`` raises :class:`~veronica_otel.instrumentors.InstrumentationError`
    when the installed ``openai`` is outside the tested range or a hook changed;
    nothing is patched and calls in a chain are refused (fail closed).
    """

    _hooks = _HOOKS
    reports_attempts = True

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
