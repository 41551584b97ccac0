"""The HTTP vendor guard on ``aiohttp`` clients.

Usage::

    from veronica_otel.instrumentors.aiohttp import AioHTTPInstrumentor

    AioHTTPInstrumentor().instrument()
    async with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=20)):
        async with aiohttp.ClientSession() as session:
            await session.post("https://api.anthropic.com/v1/messages", json=...)

A request to an LLM vendor sent inside a chain by a client no SDK adapter
contains (litellm's own async handlers send through aiohttp) is admitted
like an SDK call: reserved from its body (``json=`` or a bytes/str ``data=``;
a form, a generator or a payload object cannot be priced), committed from its
reply's usage as the body is read, refused when it cannot be priced under a
cost ceiling (see :mod:`veronica_otel.instrumentors._vendor_guard`).

Configuration (argument, else environment, else default):

- ``vendor_guard`` / ``VERONICA_VENDOR_GUARD``: ``contain`` (default),
  ``refuse`` or ``off``;
- ``vendor_hosts`` / ``VERONICA_VENDOR_HOSTS``: more vendor hosts;
- ``propagate_threads`` / ``VERONICA_THREADS``: carry the chain into threads
  (default true).

Where it hooks: ``aiohttp.client.ClientSession._request`` (every request,
``async with session.post(...)`` included), when the application imports
``aiohttp``; this module imports nothing of it. A reply read with
``auto_decompress=False`` and a compressed body cannot be read: its
reservation is committed.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)

from ._vendor_guard import turn_off, turn_on

__all__ = ["AioHTTPInstrumentor"]

_instruments = ("aiohttp >= 3.9",)


class AioHTTPInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Turns the HTTP vendor guard on for ``aiohttp``."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        turn_on("aiohttp", ("aiohttp",), kwargs)

    def _uninstrument(self, **kwargs: Any) -> None:
        turn_off("aiohttp", ("aiohttp",))
