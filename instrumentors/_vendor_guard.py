"""The HTTP vendor guard: LLM requests no SDK adapter admitted, contained at the transport.

Money leaves through clients we have no adapter for (a new SDK, a raw
``httpx2.post`` or ``requests.post`` to a provider's API, a framework's own
HTTP code). Under the adapters, the transports (``httpx2``, ``httpx``,
``urllib3`` under ``requests`` and ``botocore``, ``aiohttp``) pass every
request through one hook each (:mod:`._attempts`). A request

- sent inside a chain, that no adapter admitted (:data:`~._adapter.ADMITTED`
  unset: a call an adapter admitted is counted there, once, DESIGN G13),
- to a known LLM vendor: a host on the built-in list or
  ``VERONICA_VENDOR_HOSTS`` (:mod:`._outbound`), or a ``POST`` to a path of a
  provider's API (``/v1/chat/completions``, ``/v1/messages``,
  ``/v1beta/models/*:generateContent``, ``/model/*/converse``, ``/api/chat``,
  ... :mod:`._wire`) whatever the host, when its body reads as that API's,

is admitted like an SDK call (:mod:`._adapter`: one admission, the G10
failure table, the span): reserved from its body (model, input, the output
cap under any provider's key; no cap: the model's largest output), committed
from the reply's usage in any known wire format (:mod:`._wire_reply`; a
stream's as it passes; a trip cuts it at the next chunk). Under a cost
ceiling a request that cannot be priced is refused, naming the model or
endpoint: an unknown model, an endpoint billed otherwise than by the token
(images, audio, batches, rerank), a vendor path we do not know, a body that
cannot be read without consuming it (a generator, a file).

Modes (``VERONICA_VENDOR_GUARD``, or ``instrument(vendor_guard=...)``):
``contain`` (default), ``refuse`` (every unadmitted vendor request in a
chain that limits anything raises :class:`~._hooks.InstrumentationError`:
only adapters may call vendors), ``off``.

For any other request the hook costs one context variable read and one
cheap test (:meth:`VendorGuard.screen`: the method, a cached host verdict,
the path's last segment).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from veronica_otel._chain_span import remaining_attributes
from veronica_otel._config import ExecutionConfig
from veronica_otel._context import ExecutionContext
from veronica_otel._errors import BudgetExceededError, TripEvent
from veronica_otel._pricing import DEFAULT_MAX_OUTPUT_TOKENS
from veronica_otel._propagation import default_context
from veronica_otel._trips import emit_trip

from ._adapter import Request
from ._admit import input_bound
from ._hooks import InstrumentationError
from ._outbound import VENDOR_HOSTS_ENV, HostPattern, vendor_patterns
from ._wire import (
    SERVER_SIDE_KEYS,
    decode_body,
    maybe_api_path,
    provider_of,
    read_body,
    route_of,
)

__all__ = ["GUARD_ENV", "MODES", "VendorGuard", "guard_mode", "turn_off", "turn_on"]

GUARD_ENV = "VERONICA_VENDOR_GUARD"
MODES = ("contain", "refuse", "off")
_DEFAULT_PORTS = {"http": 80, "https": 443}
_MAX_HOSTS = 4096  # host verdicts kept (a process talks to a handful)
# Server-side input of unknown size, for a model whose context window is unknown.
_UNKNOWN_WINDOW = 2_097_152
_UNLIMITED = ExecutionConfig()
# POSTs to a vendor host that are not billed (token counting, uploads).
_FREE_TAILS = frozenset(("count_tokens", "countTokens", "files", "uploads", "tokenize"))


def guard_mode(given: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The guard's mode: ``given``, else ``VERONICA_VENDOR_GUARD``, else ``contain``.

    Raises:
        ValueError: Not one of ``contain``, ``refuse``, ``off`` (naming where it came from).
    """
    if given is not None:
        name, raw = "vendor_guard", given
    else:
        env = os.environ if environ is None else environ
        name, raw = GUARD_ENV, env.get(GUARD_ENV, "")
    if not isinstance(raw, str):
        raise ValueError(f"{name} must be one of {', '.join(MODES)}, got {raw!r}")
    mode = raw.strip().lower() or "contain"
    if mode not in MODES:
        raise ValueError(f"{name} must be one of {', '.join(MODES)}, got {raw[:80]!r}")
    return mode


class VendorGuard:
    """One configuration of the guard: its mode and the vendor hosts.

    Args:
        mode: ``contain`` or ``refuse`` (``off`` installs no guard).
        vendor_hosts: Extra vendor hosts (else ``VERONICA_VENDOR_HOSTS``),
            added to the built-in list.
        environ: Environment to read instead of ``os.environ``.
    """

    def __init__(
        self,
        mode: str = "contain",
        vendor_hosts: str | Sequence[str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        if mode not in ("contain", "refuse"):
            raise ValueError(f"vendor_guard must be 'contain' or 'refuse' here, got {mode!r}")
        self.mode = mode
        self.vendors: tuple[HostPattern, ...] = vendor_patterns(vendor_hosts, environ)
        self._hosts: dict[tuple[str, int | None, str], bool] = {}
        self._verdicts: dict[tuple[str, int | None], bool] = {}

    def __repr__(self) -> str:
        return f"VendorGuard(mode={self.mode!r}, {VENDOR_HOSTS_ENV}: {len(self.vendors)} patterns)"

    def vendor_host(self, host: str, port: int | None) -> bool:
        """Whether ``host[:port]`` is an LLM vendor's (cached per host and port)."""
        key = (host, port)
        hit = self._verdicts.get(key)
        if hit is None:
            name = host.lower().rstrip(".")
            hit = any(pattern.matches(name, port) for pattern in self.vendors)
            if len(self._verdicts) < _MAX_HOSTS:
                self._verdicts[key] = hit
        return hit

    def screen(self, method: str, scheme: str, host: str, port: int | None, path: str) -> bool:
        """The cheap test every request passes: could it be a vendor's API call?

        Only a ``POST`` can be; then a cached verdict on the host, else the
        path's last segment. ``port`` as the URL has it (None: the scheme's).
        """
        if method != "POST":
            return False
        hit = self._hosts.get((host, port, scheme))
        if hit is None:
            hit = self.vendor_host(host, _DEFAULT_PORTS.get(scheme) if port is None else port)
            if len(self._hosts) < _MAX_HOSTS:
                self._hosts[(host, port, scheme)] = hit
        return hit or maybe_api_path(path)

    def describe(
        self, scheme: str, host: str, port: int | None, path: str, raw_body: object
    ) -> Request | None:
        """The call a screened request makes, or None when it is not a vendor call.

        Raises :class:`BudgetExceededError` when the request cannot be priced
        under the chain's cost ceiling, and :class:`InstrumentationError` in
        ``refuse`` mode.
        """
        if port is None:
            port = _DEFAULT_PORTS.get(scheme)
        vendor = self.vendor_host(host, port)
        route = route_of(path) if maybe_api_path(path) else None
        if route is None and not vendor:
            return None
        tail = path[path.rfind("/") + 1 :]
        if route is None and tail.rpartition(":")[2] in _FREE_TAILS:
            return None
        body = decode_body(raw_body)
        model = body.get("model") if isinstance(body, dict) else None
        if not vendor and not isinstance(model, str) and (route is None or route.model is None):
            return None  # a path like a provider's, a body unlike its API's: not one
        ctx = default_context()
        if ctx is None:
            return None
        provider = provider_of(host.lower(), route)
        if self.mode == "refuse" and (ctx.config != _UNLIMITED or ctx.pipeline):
            raise InstrumentationError(
                f"veronica-otel: a request to {host}{path} (an LLM vendor) was sent by a "
                f"client no adapter contains, and {GUARD_ENV}=refuse: instrument its SDK "
                "or set it to contain"
            )
        name = model if isinstance(model, str) and model else None
        if name is None and route is not None:
            name = route.model
        what = name or f"POST {path}"
        if route is None:
            return _unpriced(ctx, provider, what, f"POST {path} is no API we can read")
        if not isinstance(body, dict):
            return _unpriced(ctx, provider, what, f"the body of POST {path} cannot be read")
        if not route.priced:
            return _unpriced(ctx, provider, what, f"POST {path} is not billed by the token")
        request = read_body(route, body)
        prices = ctx.prices_for(provider, request.model)  # unknown under a ceiling: denied
        extra = 0
        if not SERVER_SIDE_KEYS.isdisjoint(body):
            window = None if prices is None else prices.context_window
            extra = _UNKNOWN_WINDOW if window is None else window
        cap = request.cap
        if cap is None:  # the model's largest output, never 0
            bound = input_bound(body, request.n_messages) + extra
            cap = DEFAULT_MAX_OUTPUT_TOKENS if prices is None else prices.output_limit(bound)
            cap = max(cap, 1)
        attributes: dict[str, Any] = {"server.address": host}
        if port is not None:
            attributes["server.port"] = port
        return request._replace(
            cap=cap, extra_input_tokens=extra, attributes=attributes, provider=provider
        )


def _unpriced(ctx: ExecutionContext, provider: str, model: str, why: str) -> Request:
    """A request that cannot be priced: refused under a cost ceiling (as an
    unknown model is), else counted as a step with no price."""
    if ctx.has_cost_ceiling:
        limit = float(ctx.config.max_cost_usd or 0.0)
        trip = TripEvent(
            "cost",
            limit,
            float("inf"),
            ctx.chain_id,
            f"chain {ctx.chain_id}: no known price for model {model!r} (provider "
            f"{provider!r}): {why}; under a cost ceiling a call that cannot be priced "
            "is never sent",
            sticky=False,
        )
        emit_trip(trip, remaining=remaining_attributes(ctx))
        raise BudgetExceededError(trip)
    return Request("chat", model, {}, 1, DEFAULT_MAX_OUTPUT_TOKENS, provider=provider)


def turn_on(owner: str, families: Sequence[str], options: Mapping[str, Any]) -> None:
    """Turn the guard on ``families`` for instrumentor ``owner`` (``instrument()``'s kwargs).

    ``vendor_guard`` (else ``VERONICA_VENDOR_GUARD``) and ``vendor_hosts``
    (else ``VERONICA_VENDOR_HOSTS``) are read; a malformed value raises
    ``ValueError`` naming it. The chain is carried into threads while the
    guard is on (``propagate_threads=False`` / ``VERONICA_THREADS=false``:
    not by this).

    Raises:
        ValueError: A malformed mode or host list.
    """
    # Imported here: the transports' module builds on this one.
    from ._attempts import ensure_attempt_hooks
    from ._guard_transports import install_guard
    from ._hooks import _propagate_threads
    from .threading import hold_threads

    mode = guard_mode(options.get("vendor_guard"))
    guard = None if mode == "off" else VendorGuard(mode, options.get("vendor_hosts"))
    threads = _propagate_threads(options.get("propagate_threads"))
    for family in families:
        install_guard(family, owner, guard)
    ensure_attempt_hooks()
    if guard is not None and threads:
        hold_threads(f"{owner}:vendor_guard")


def turn_off(owner: str, families: Sequence[str]) -> None:
    """``owner`` (uninstrumented) no longer wants the guard on ``families``."""
    from ._guard_transports import remove_guard
    from .threading import release_threads

    for family in families:
        remove_guard(family, owner)
    release_threads(f"{owner}:vendor_guard")
