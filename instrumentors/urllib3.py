"""The HTTP vendor guard on ``urllib3`` (``requests``, ``botocore`` and direct use).

Usage::

    from veronica_otel.instrumentors.urllib3 import URLLib3Instrumentor

    URLLib3Instrumentor().instrument()
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=20)):
        urllib3.request("POST", "https://api.openai.com/v1/chat/completions", json=...)

A request to an LLM vendor sent inside a chain by a client no SDK adapter
contains is admitted like an SDK call: reserved from its body, committed from
its reply's usage, refused when it cannot be priced under a cost ceiling (see
:mod:`veronica_otel.instrumentors._vendor_guard`). A call an adapter admitted
is not counted again; its attempts are reported to it.

Configuration (argument, else environment, else default):

- ``vendor_guard`` / ``VERONICA_VENDOR_GUARD``: ``contain`` (default),
  ``refuse`` (every such request in a chain that limits anything raises) or
  ``off``;
- ``vendor_hosts`` / ``VERONICA_VENDOR_HOSTS``: more vendor hosts, added to
  the built-in list;
- ``propagate_threads`` / ``VERONICA_THREADS``: carry the chain into threads
  (default true).

Where it hooks: ``urllib3.connectionpool.HTTPConnectionPool.urlopen`` (every
attempt: urllib3's own retries recurse through it), when the application
imports ``urllib3``; this module imports nothing of it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)

from ._vendor_guard import turn_off, turn_on

__all__ = ["URLLib3Instrumentor"]

_instruments = ("urllib3 >= 1.26",)


class URLLib3Instrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Turns the HTTP vendor guard on for ``urllib3``."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        turn_on("urllib3", ("urllib3",), kwargs)

    def _uninstrument(self, **kwargs: Any) -> None:
        turn_off("urllib3", ("urllib3",))
