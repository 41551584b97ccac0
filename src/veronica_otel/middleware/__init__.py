"""Server middleware: one chain per request, joined to the caller's chain.

- :class:`VeronicaASGIMiddleware` (HTTP and WebSocket) and
  :class:`VeronicaWSGIMiddleware` (HTTP) read the caller's signed budget
  grant from W3C baggage (``veronica.chain``, ``veronica.depth``,
  ``veronica.grant``), run the request in a chain whose limits are the lower
  of the local configuration and the grant, at the caller's depth plus one,
  and answer HTTP 429 with a JSON body naming the reason when the chain
  cannot run (or a trip escapes the handler).
- Unsigned, forged, expired, replayed or oversized grants are ignored,
  counted on ``veronica.grants.rejected`` and logged: the request then runs
  on the local configuration alone, as does a request with no grant.
- What the request's chain spent goes back to the caller in the signed
  ``veronica-spent`` response header (``shared=1`` when both sides charge one
  shared ledger), which the caller's HTTP instrumentation commits.

Configuration: ``config`` (else ``VERONICA_*``), ``grant_key`` (else
``VERONICA_GRANT_KEY``), ``ledger`` (in-process by default; pass the Redis
ledger to count in a chain shared across processes).
"""

from ._asgi import VeronicaASGIMiddleware
from ._wsgi import VeronicaWSGIMiddleware

__all__ = ["VeronicaASGIMiddleware", "VeronicaWSGIMiddleware"]
