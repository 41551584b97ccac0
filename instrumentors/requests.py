"""Chain propagation and the vendor guard for ``requests``.

Usage::

    from veronica_otel.instrumentors.requests import RequestsInstrumentor

    RequestsInstrumentor().instrument(propagate_hosts="orders.internal")

Same policy and configuration as
:class:`~veronica_otel.instrumentors.httpx.HTTPXInstrumentor`: this writes
only the chain's ``veronica.*`` entries, only for allowed hosts, sends no
baggage at all to LLM vendors, and commits the ``veronica-spent`` answer.
Trace headers come from ``opentelemetry-instrumentation-requests``, enabled
here only when asked (``enable_otel_http=True``). It hooks
``requests.Session.send`` (every hop, redirects included), inside
OpenTelemetry's wrapper: that one replaces ``Session.send`` with a plain
function, and wrapping it from outside would make its uninstrument remove
ours too. ``requests`` is patched when the application imports it.

It also turns on the HTTP vendor guard on ``urllib3``, which ``requests``
sends through (:mod:`veronica_otel.instrumentors._vendor_guard`;
``vendor_guard`` / ``VERONICA_VENDOR_GUARD``: ``contain``, ``refuse``, ``off``).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Collection
from contextvars import Token
from typing import Any
from urllib.parse import urlsplit

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

__all__ = ["RequestsInstrumentor"]

_logger = logging.getLogger(__name__)


def _prepare(policy: Propagation, request: Any) -> tuple[Plan, Token[Context] | None]:
    plan = _STRIP_ONLY
    try:
        parts = urlsplit(request.url)
        headers = request.headers
        plan = policy.plan(parts.scheme, parts.hostname, parts.port, headers.__contains__)
        if not plan.entries and policy.to_vendor(
            parts.scheme, parts.hostname, parts.port, headers.__contains__
        ):
            headers.pop("baggage", None)
            return plan, otel_context.attach(baggage.clear())
        current = headers.get("baggage")
        if current or plan.entries:
            value = rewrite_baggage([current] if current else [], plan.entries)
            headers.pop("baggage", None)
            if value is not None:
                headers["baggage"] = value
        return plan, otel_context.attach(context_for(plan.entries))
    except Exception as exc:
        policy.unsent(plan)
        prepare_failed(exc, "preparing a requests request")
        return _STRIP_ONLY, None


def _send(
    policy: Propagation, wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
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
    if plan.carve is not None:
        try:
            policy.settle(plan, response.headers.get(SPENT_HEADER))
        except Exception:
            _logger.exception("veronica-otel: committing a downstream service's spend failed")
    return response


class RequestsInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Propagates the active chain to your own services over ``requests``."""

    # A singleton (BaseInstrumentor): state is set by _instrument, not __init__.
    _policy: Propagation | None = None
    _wrapper: Any = None
    _otel: Any = None

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("requests >= 2.0",)

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
        turn_on("requests", ("urllib3",), kwargs)  # the vendor guard (arguments checked above)
        self._policy = policy
        self._otel = None
        otel_kwargs: dict[str, Any] = {
            k: kwargs[k] for k in ("tracer_provider", "meter_provider") if k in kwargs
        }
        enable_otel = bool(kwargs.get("enable_otel_http", False))
        hook = functools.partial(self._patch, policy, enable_otel, otel_kwargs)
        wrapt.register_post_import_hook(hook, "requests")

    def _patch(
        self, policy: Propagation, enable_otel: bool, otel_kwargs: dict[str, Any], module: Any
    ) -> None:
        if self._policy is not policy:
            return
        try:
            wrapper = functools.partial(_send, policy)
            wrapt.wrap_function_wrapper(module.Session, "send", wrapper)
            self._wrapper = wrapper
            if enable_otel:
                self._enable_otel(otel_kwargs)
        except Exception:
            _logger.exception("veronica-otel: could not instrument requests")

    def _enable_otel(self, otel_kwargs: dict[str, Any]) -> None:
        try:
            from opentelemetry.instrumentation.requests import (
                RequestsInstrumentor as OTelRequestsInstrumentor,
            )
        except ImportError:
            _logger.debug("opentelemetry-instrumentation-requests is not installed")
            return
        instrumentor = OTelRequestsInstrumentor()
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(skip_dep_check=True, **otel_kwargs)
            self._otel = instrumentor

    def _uninstrument(self, **kwargs: Any) -> None:
        turn_off("requests", ("urllib3",))
        if self._policy is not None:
            self._policy.active = False
        self._policy = None
        if self._otel is not None:
            self._otel.uninstrument()  # restores our wrapper as Session.send
            self._otel = None
        module = sys.modules.get("requests")
        if self._wrapper is not None and module is not None:
            unwrap_ours(module.Session, "send", self._wrapper)
        self._wrapper = None
