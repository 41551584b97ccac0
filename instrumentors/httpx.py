"""Chain propagation and the vendor guard for ``httpx2`` and ``httpx`` clients.

Usage::

    from veronica_otel.instrumentors.httpx import HTTPXInstrumentor

    HTTPXInstrumentor().instrument(propagate_hosts=["orders.internal", "127.0.0.1:8001"])
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=20)):
        httpx2.get("http://orders.internal/plan")   # carries the chain's signed grant

This one writes only the chain's ``veronica.*`` baggage entries, only for
allowed hosts, and commits the ``veronica-spent`` answer of the downstream
service into the chain. A request to an LLM vendor carries no baggage at all,
whoever would add it. Trace headers (``traceparent``) come from OpenTelemetry's
own instrumentation (``opentelemetry-instrumentation-httpx``), which this one
turns on only when asked (``enable_otel_http=True``); ``opentelemetry-instrument``
turns it on by itself when it is installed. See
:mod:`veronica_otel.instrumentors._outbound` for the policy.

Configuration (argument, else environment, else default):

- ``propagate_hosts`` / ``VERONICA_PROPAGATE_HOSTS``: allow-list of
  ``host[:port]`` patterns (default: none).
- ``vendor_hosts`` / ``VERONICA_VENDOR_HOSTS``: more vendor hosts, added to
  the built-in list.
- ``grant_key`` / ``VERONICA_GRANT_KEYS`` (``kid:key,...``, the first signs) /
  ``VERONICA_GRANT_KEY``: the HMAC keys shared with your services.
- ``grant_ttl_s``: how long a grant is valid (60 s).
- ``grant_max_cost_usd``, ``grant_max_steps``, ``grant_max_tokens``: the most
  one request's grant carves out of the chain (else ``VERONICA_GRANT_MAX_*``,
  else all that is left: other requests are then denied until it settles;
  set them to fan out).

It also turns on the HTTP vendor guard for both libraries
(:mod:`veronica_otel.instrumentors._vendor_guard`): a request to an LLM vendor
sent inside a chain by a client no SDK adapter contains (a raw
``httpx2.post`` to ``/v1/chat/completions``, an SDK we have no adapter for) is
admitted, reserved from its body and committed from its reply's usage.

- ``vendor_guard`` / ``VERONICA_VENDOR_GUARD``: ``contain`` (default),
  ``refuse`` (such requests raise in a chain that limits anything) or ``off``.
- ``propagate_threads`` / ``VERONICA_THREADS``: carry the chain into threads
  while the guard is on (default true).

Where it hooks: ``HTTPTransport.handle_request``,
``AsyncHTTPTransport.handle_async_request`` and the in-process
``WSGITransport`` / ``ASGITransport`` of each library, once per hop
(redirects included), outside OpenTelemetry's wrapper. Neither library is
imported by this module: each is patched when the application imports it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Collection
from contextvars import Token
from typing import Any

import wrapt
from opentelemetry import baggage
from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)

from veronica_otel._grants import SPENT_HEADER

from ._outbound import (
    _STRIP_ONLY,
    Plan,
    Propagation,
    context_for,
    prepare_failed,
    rewrite_baggage,
)
from ._unwrap import unwrap_ours
from ._vendor_guard import turn_off, turn_on

__all__ = ["HTTPXInstrumentor"]

_logger = logging.getLogger(__name__)
_MODULES = ("httpx2", "httpx")
# (class, method, is async)
_TRANSPORTS = (
    ("HTTPTransport", "handle_request", False),
    ("AsyncHTTPTransport", "handle_async_request", True),
    ("WSGITransport", "handle_request", False),
    ("ASGITransport", "handle_async_request", True),
)
_OTEL_INSTRUMENTORS = {"httpx2": "HTTPX2ClientInstrumentor", "httpx": "HTTPXClientInstrumentor"}

Wrapper = Callable[..., Any]


def _prepare(policy: Propagation, request: Any) -> tuple[Plan, Token[Context] | None]:
    """Rewrite the request's baggage and attach the matching context."""
    plan = _STRIP_ONLY
    try:
        url = request.url
        headers = request.headers
        plan = policy.plan(url.scheme, url.host, url.port, headers.__contains__)
        if not plan.entries and policy.to_vendor(
            url.scheme, url.host, url.port, headers.__contains__
        ):
            if "baggage" in headers:
                del headers["baggage"]
            return plan, otel_context.attach(baggage.clear())
        current = headers.get_list("baggage")
        if current or plan.entries:
            value = rewrite_baggage(current, plan.entries)
            if "baggage" in headers:
                del headers["baggage"]
            if value is not None:
                headers["baggage"] = value
        return plan, otel_context.attach(context_for(plan.entries))
    except Exception as exc:
        policy.unsent(plan)
        prepare_failed(exc, "preparing an httpx request")
        return _STRIP_ONLY, None


def _settle(policy: Propagation, plan: Plan, response: Any) -> None:
    if plan.carve is None:
        return
    try:
        policy.settle(plan, response.headers.get(SPENT_HEADER))
    except Exception:
        _logger.exception("veronica-otel: committing a downstream service's spend failed")


def _sync_wrapper(policy: Propagation) -> Wrapper:
    def send(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not policy.active:
            return wrapped(*args, **kwargs)
        plan, token = _prepare(policy, args[0] if args else kwargs.get("request"))
        try:
            response = wrapped(*args, **kwargs)
        except BaseException as exc:
            policy.failed(plan, exc)
            raise
        finally:
            if token is not None:
                otel_context.detach(token)
        _settle(policy, plan, response)
        return response

    return send


def _async_wrapper(policy: Propagation) -> Wrapper:
    async def send(
        wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if not policy.active:
            return await wrapped(*args, **kwargs)
        plan, token = _prepare(policy, args[0] if args else kwargs.get("request"))
        try:
            response = await wrapped(*args, **kwargs)
        except BaseException as exc:
            policy.failed(plan, exc)
            raise
        finally:
            if token is not None:
                otel_context.detach(token)
        _settle(policy, plan, response)
        return response

    return send


def _import_otel_httpx() -> Any:
    try:
        from opentelemetry.instrumentation import httpx as otel_httpx
    except ImportError:
        _logger.debug("opentelemetry-instrumentation-httpx is not installed")
        return None
    return otel_httpx


class HTTPXInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Propagates the active chain to your own services over httpx2 and httpx."""

    # A singleton (BaseInstrumentor): state is set by _instrument, not __init__.
    _policy: Propagation | None = None
    _patched: tuple[tuple[Any, str, Wrapper], ...] = ()
    _otel: tuple[Any, ...] = ()
    _pending: tuple[Any, ...] = ()
    _patching = False

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()  # either library; each is patched when (if) it is imported

    def _instrument(self, **kwargs: Any) -> None:
        self._uninstrument()  # left by an instrument() that raised: never wrap twice
        policy = Propagation(
            propagate_hosts=kwargs.get("propagate_hosts"),
            vendor_hosts=kwargs.get("vendor_hosts"),
            grant_key=kwargs.get("grant_key"),
            grant_ttl_s=kwargs.get("grant_ttl_s", 60.0),
            grant_max_cost_usd=kwargs.get("grant_max_cost_usd"),
            grant_max_steps=kwargs.get("grant_max_steps"),
            grant_max_tokens=kwargs.get("grant_max_tokens"),
        )
        turn_on("httpx", ("httpx",), kwargs)  # the vendor guard (arguments checked above)
        self._policy = policy
        self._patched = ()
        self._otel = ()
        otel_kwargs: dict[str, Any] = {
            k: kwargs[k] for k in ("tracer_provider", "meter_provider") if k in kwargs
        }
        enable_otel = bool(kwargs.get("enable_otel_http", False))
        for name in _MODULES:
            hook = functools.partial(self._patch, policy, enable_otel, otel_kwargs)
            wrapt.register_post_import_hook(hook, name)

    def _patch(
        self, policy: Propagation, enable_otel: bool, otel_kwargs: dict[str, Any], module: Any
    ) -> None:
        if self._policy is not policy:  # uninstrumented (or re-instrumented) since
            return
        self._pending = (*self._pending, module)
        if self._patching:
            # Importing OpenTelemetry's module imports httpx and httpx2, which runs
            # this hook again mid-import: the outer call patches those too.
            return
        self._patching = True
        try:
            otel_httpx = _import_otel_httpx() if enable_otel else None
            while self._pending:
                target, self._pending = self._pending[0], self._pending[1:]
                self._patch_module(policy, target, otel_httpx, otel_kwargs)
        finally:
            self._patching = False
            self._pending = ()

    def _patch_module(
        self, policy: Propagation, module: Any, otel_httpx: Any, otel_kwargs: dict[str, Any]
    ) -> None:
        # Ours first, on its own: OpenTelemetry's may fail (imported half-way:
        # its own import of httpx2 is what runs this hook), ours must not.
        # Either order is right: ours writes the header itself, and clears
        # the context it runs the request in.
        try:
            for cls, method, is_async in _TRANSPORTS:
                owner = getattr(module, cls, None)
                if owner is None:
                    continue
                wrapper = _async_wrapper(policy) if is_async else _sync_wrapper(policy)
                wrapt.wrap_function_wrapper(owner, method, wrapper)
                self._patched = (*self._patched, (owner, method, wrapper))
        except Exception:
            _logger.exception("veronica-otel: could not instrument %s", module.__name__)
        if otel_httpx is None:
            return
        name = _OTEL_INSTRUMENTORS[module.__name__]
        found = getattr(otel_httpx, name, None)
        if found is None:  # HTTPX2ClientInstrumentor: opentelemetry-instrumentation-httpx 0.65b0+
            _logger.warning(
                "veronica-otel: the installed opentelemetry-instrumentation-httpx has no %s "
                "(0.65b0 and later have it): %s requests carry no trace headers; "
                "the chain is still propagated and contained",
                name,
                module.__name__,
            )
            return
        try:
            instrumentor = found()
            if not instrumentor.is_instrumented_by_opentelemetry:
                instrumentor.instrument(skip_dep_check=True, **otel_kwargs)
                self._otel = (*self._otel, instrumentor)
        except Exception:
            _logger.exception(
                "veronica-otel: could not enable OpenTelemetry's %s instrumentation",
                module.__name__,
            )

    def _uninstrument(self, **kwargs: Any) -> None:
        turn_off("httpx", ("httpx",))
        if self._policy is not None:
            self._policy.active = False  # a wrapper we cannot remove passes through
        self._policy = None
        for owner, method, wrapper in reversed(self._patched):
            unwrap_ours(owner, method, wrapper)
        self._patched = ()
        for instrumentor in self._otel:
            instrumentor.uninstrument()
        self._otel = ()
