"""What both middlewares share: admitting one request into a chain.

:class:`Gate` reads the request's W3C ``baggage`` header, verifies the
caller's grant and builds the request's :class:`ExecutionContext`: joined to
the caller's chain (limits = the lower of local configuration and grant,
depth + 1) when the grant is trusted, else a fresh chain from the local
configuration at depth 0. It then runs the pre-flight check: a chain that is
already stopped -- too deep, past its deadline, tripped in the caller, or
with nothing left of a granted budget -- is refused before the application
runs, with HTTP 429 and a JSON body naming the reason.

A grant is trusted only when it is signed with a known key id and addressed
to this service (``audience`` / ``VERONICA_GRANT_AUDIENCE``, else the
request's ``Host``). A trusted grant whose budget was not carved -- one meant
for a shared Redis ledger this service does not use -- is refused with 429,
never run on local limits. The answer to a granted request carries the
signed ``veronica-spent`` header (:meth:`RequestAdmission.spent_header`), computed
when the handler is done (both middlewares hold the response until then, up
to a size limit), so spend while the body streams is counted.

Budget pools: ``pools=`` is a callable of the request (the ASGI scope or
the WSGI environ) returning the :class:`~veronica_otel.BudgetPool` objects
the request's chain also spends from (for example, by API key or tenant
header); None or ``[]`` for none. A pool with no room left refuses the
request before the application runs (429, ``"pool"`` in the JSON body and a
``Retry-After`` header, in whole seconds rounded up, when the pool's window
says when it frees room); so does a pool denial raised by the handler before
its answer starts. A ``pools=`` callable that raises (or returns something
other than pools on the middleware's ledger) fails closed: 503 with
``{"error": "budget pools unavailable", ...}`` naming the exception type,
and the application does not run.

When the budget store cannot be reached (the shared ledger is down, or
admitting the request failed in any other way), the request is refused with
HTTP 503 and a JSON body (``{"error": "budget store unavailable", ...}``)
before the application runs: never a 500, never an unmetered request. With
``VERONICA_FAIL_OPEN=true`` the Redis ledger falls back to a process-local
one instead of failing, and requests run as usual.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.baggage.propagation import W3CBaggagePropagator

from veronica_otel._attributes import BAGGAGE_CHAIN, BAGGAGE_GRANT, BAGGAGE_PREFIX
from veronica_otel._config import ExecutionConfig
from veronica_otel._context import ExecutionContext
from veronica_otel._errors import BudgetExceededError, TripEvent, TripReason
from veronica_otel._grants import (
    AUDIENCE_ENV,
    MAX_GRANT_BYTES,
    SPENT_HEADER,
    Grant,
    GrantKeys,
    NonceCache,
    coerce_keys,
    grant_key_from_env,
    record_rejection,
    sign_spent,
    verify_grant,
)
from veronica_otel._ledger import DEFAULT_LEDGER, Ledger, Level, Limits, PoolLevel
from veronica_otel._policy import PolicyPipeline
from veronica_otel._pools import BudgetPool, check_pools
from veronica_otel._remote import aspent, join_chain, ledger_shared_id, spent
from veronica_otel._trips import emit_trip

__all__ = [
    "BAGGAGE_PREFIX",
    "MAX_BAGGAGE_BYTES",
    "Gate",
    "PoolSelectionError",
    "PoolsFor",
    "RequestAdmission",
    "budget_error",
    "denial_body",
    "parse_audience",
    "refusal",
    "retry_after_header",
]

# The request (ASGI scope or WSGI environ) -> the pools its chain spends from.
PoolsFor = Callable[[Any], Iterable[BudgetPool] | None]


class PoolSelectionError(Exception):
    """The ``pools=`` callable raised, or returned something that is not pools."""


_logger = logging.getLogger("veronica_otel.middleware")
# The W3C baggage limit; a longer header is ignored (and counted) as a whole.
MAX_BAGGAGE_BYTES = 8192
_BAGGAGE = W3CBaggagePropagator()


@dataclass(slots=True)
class RequestAdmission:
    """One request's chain and what the pre-flight check said.

    Attributes:
        ctx: The request's chain (not entered).
        grant: The caller's trusted grant, if any.
        denial: Why the request is refused before the application runs.
        shared: The chain charges a ledger shared with the caller.
        otel_context: The OpenTelemetry context to run the request in
            (the caller's trace when no server span is active, and no
            ``veronica.*`` baggage).
    """

    ctx: ExecutionContext
    grant: Grant | None
    denial: TripEvent | None
    shared: bool
    otel_context: otel_context.Context

    def spent_header(self, key: GrantKeys | None) -> tuple[str, str] | None:
        """The signed ``veronica-spent`` header to answer with, if the caller sent a grant.

        Signed with this service's signing key, bound to the grant's nonce and
        audience. Without it (a failure here) the caller commits its whole carve.
        """
        grant = self.grant
        if grant is None or key is None:
            return None
        try:
            return SPENT_HEADER, sign_spent(spent(self.ctx), grant.nonce, grant.audience, key)
        except Exception:
            _logger.exception("building the veronica-spent header failed")
            return None

    async def aspent_header(self, key: GrantKeys | None) -> tuple[str, str] | None:
        """:meth:`spent_header` for async code: a shared store is read without blocking."""
        grant = self.grant
        if grant is None or key is None:
            return None
        try:
            used = await aspent(self.ctx)
            return SPENT_HEADER, sign_spent(used, grant.nonce, grant.audience, key)
        except Exception:
            _logger.exception("building the veronica-spent header failed")
            return None


class Gate:
    """Admits requests into chains (shared by the ASGI and WSGI middlewares).

    Args:
        config: Local limits per request (``ExecutionConfig.from_env()`` when omitted).
        ledger: Where request chains are counted (in-process by default; a
            shared Redis ledger makes the caller's chain count directly).
        grant_key: HMAC key for grants (``VERONICA_GRANT_KEY`` when omitted).
        pipeline: Policies run before every call of every request.
        max_baggage_bytes: Longest ``baggage`` header read.
        max_grant_bytes: Longest grant accepted.
        replay_cache: Nonces already accepted (the process-wide cache by default).
        clock: Wall clock, unix seconds (for grant expiry and deadlines).
        audience: The ``host[:port]`` names this service accepts grants for
            (``VERONICA_GRANT_AUDIENCE``, comma-separated, when omitted; else
            the request's ``Host`` header, which a client chooses: configure
            it wherever one key is shared by several services).
        pools: A callable of the request (ASGI scope, WSGI environ) returning
            the budget pools its chain also spends from (None or [] for none).
    """

    def __init__(
        self,
        config: ExecutionConfig | None = None,
        *,
        ledger: Ledger | None = None,
        grant_key: bytes | str | None = None,
        pipeline: PolicyPipeline | None = None,
        max_baggage_bytes: int = MAX_BAGGAGE_BYTES,
        max_grant_bytes: int = MAX_GRANT_BYTES,
        replay_cache: NonceCache | None = None,
        clock: Callable[[], float] = time.time,
        audience: str | Sequence[str] | None = None,
        pools: PoolsFor | None = None,
    ) -> None:
        if config is not None and not isinstance(config, ExecutionConfig):
            raise TypeError(f"config must be an ExecutionConfig, got {config!r}")
        if pools is not None and not callable(pools):
            raise TypeError(
                f"pools must be a callable of the request returning BudgetPools, got {pools!r}"
            )
        self.pools = pools
        for name, value in (
            ("max_baggage_bytes", max_baggage_bytes),
            ("max_grant_bytes", max_grant_bytes),
        ):
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.config = config if config is not None else ExecutionConfig.from_env()
        self.ledger = ledger
        self.key = coerce_keys(grant_key) if grant_key is not None else grant_key_from_env()
        self.audience = (
            parse_audience(audience, "audience")
            if audience is not None
            else parse_audience(os.environ.get(AUDIENCE_ENV, ""), AUDIENCE_ENV)
        )
        self.pipeline = pipeline
        self.max_baggage_bytes = max_baggage_bytes
        self.max_grant_bytes = max_grant_bytes
        self.replay_cache = replay_cache
        self.clock = clock
        self._shared_id = ledger_shared_id(ledger)

    def admit(
        self, headers: Mapping[str, str], request: object = None, name: str = "request"
    ) -> RequestAdmission:
        """Build the chain for a request with these (lower-case) headers.

        ``request`` (the ASGI scope or WSGI environ) is what ``pools=`` is
        called with. Raises PoolSelectionError when that call fails. ``name``
        names a chain started here (its root span ``invoke_workflow {name}``).
        """
        admission = self._join(headers, self._pools_for(request), name)
        ctx = admission.ctx
        if admission.denial is None:
            admission.denial = _preflight(ctx, admission.grant, ctx.trip)
        if admission.denial is None and ctx.pools:
            admission.denial = _pool_preflight(ctx)
        if admission.denial is None:
            admission.denial = _grant_preflight(ctx, admission.grant)
        return admission

    async def aadmit(
        self, headers: Mapping[str, str], request: object = None, name: str = "request"
    ) -> RequestAdmission:
        """:meth:`admit` for async servers: the pre-flight's store reads are awaited."""
        admission = self._join(headers, self._pools_for(request), name)
        ctx = admission.ctx
        if admission.denial is None:
            admission.denial = _preflight(ctx, admission.grant, await ctx.atrip())
        if admission.denial is None and ctx.pools:
            admission.denial = await _apool_preflight(ctx)
        if admission.denial is None:
            admission.denial = _grant_preflight(ctx, admission.grant)
        return admission

    def _join(
        self, headers: Mapping[str, str], pools: tuple[BudgetPool, ...], name: str
    ) -> RequestAdmission:
        """The request's chain (no pre-flight yet: ``denial`` None unless refused here)."""
        header = headers.get("baggage")
        if header is not None and len(header.encode("utf-8", "replace")) > self.max_baggage_bytes:
            record_rejection("oversized")
            headers = {k: v for k, v in headers.items() if k != "baggage"}
            header = None
        carrier_context = _request_context(headers)
        grant = self._grant(header, headers.get("host", "")) if header else None
        now = self.clock()
        shared = (
            grant is not None and self._shared_id is not None and grant.ledger_id == self._shared_id
        )
        if grant is not None and not shared and not grant.carved:
            # Meant for a shared ledger this service does not use: nothing was
            # carved for it, so running it on local limits could overspend.
            record_rejection("ledger_mismatch", grant.chain_id)
            ctx = self._request_chain(pools, name)
            denial = _deny(
                ctx, "cost", 0, 0, f"grant of chain {grant.chain_id} is for another ledger"
            )
            return RequestAdmission(ctx, None, denial, False, carrier_context)
        if grant is not None:
            ctx = join_chain(
                self.config,
                grant,
                ledger=self.ledger,
                pipeline=self.pipeline,
                now=now,
                shared=shared,
                pools=pools,
            )
        else:
            ctx = self._request_chain(pools, name)
        return RequestAdmission(ctx, grant, None, shared, carrier_context)

    def _request_chain(self, pools: tuple[BudgetPool, ...], name: str) -> ExecutionContext:
        """A request's own chain on this service's limits (detached: a request
        served inside some chain of this process is still its own)."""
        return ExecutionContext(
            self.config, self.pipeline, ledger=self.ledger, name=name, pools=pools, detached=True
        )

    def _pools_for(self, request: object) -> tuple[BudgetPool, ...]:
        if self.pools is None:
            return ()
        try:
            return check_pools(
                self.pools(request), self.ledger if self.ledger is not None else DEFAULT_LEDGER
            )
        except Exception as exc:
            raise PoolSelectionError(
                f"the pools= callable failed ({type(exc).__name__}: {exc})"
            ) from exc

    def _grant(self, header: str, host: str) -> Grant | None:
        entries = {
            key: str(value)
            for key, value in baggage.get_all(
                _BAGGAGE.extract({"baggage": header}, otel_context.Context())
            ).items()
            if key.startswith(BAGGAGE_PREFIX)
        }
        if not entries:
            return None
        raw = entries.get(BAGGAGE_GRANT)
        if raw is None:
            record_rejection("unsigned", entries.get(BAGGAGE_CHAIN))
            return None
        audience = self.audience or (host.strip().lower(),)
        return verify_grant(
            raw,
            self.key,
            audience=audience,
            now=self.clock(),
            max_bytes=self.max_grant_bytes,
            replay_cache=self.replay_cache,
        )


def parse_audience(value: str | Sequence[str], name: str) -> tuple[str, ...]:
    """``host[:port]`` names from a comma-separated string or a sequence.

    Raises:
        ValueError: A malformed name (naming ``name``).
    """
    items = value.split(",") if isinstance(value, str) else list(value)
    names: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"{name} must hold strings, got {item!r}")
        text = item.strip().lower()
        if not text:
            continue
        if not text.isascii() or any(c in text for c in " ,;/?#@*\t") or text.startswith(":"):
            shown = repr(item) if len(item) <= 80 else repr(item[:77]) + "..."
            raise ValueError(f"{name}: bad audience {shown} (expected host or host:port)")
        names.append(text)
    return tuple(names)


def _request_context(headers: Mapping[str, str]) -> otel_context.Context:
    """The context to run the request in: the caller's trace, minus ``veronica.*`` baggage."""
    current = otel_context.get_current()
    if not trace.get_current_span(current).get_span_context().is_valid:
        # No server instrumentation ran: continue the caller's trace ourselves.
        current = propagate.extract(headers, context=current)
    for key in baggage.get_all(current):
        if key.startswith(BAGGAGE_PREFIX):
            current = baggage.remove_baggage(key, current)
    return current


def _preflight(
    ctx: ExecutionContext, grant: Grant | None, trip: TripEvent | None
) -> TripEvent | None:
    """Why the request is refused before it runs (``trip``: the chain's, as read)."""
    if trip is not None:
        return trip
    if grant is not None and grant.trip_reason is not None:
        reason = cast(TripReason, grant.trip_reason)  # checked against REASONS on decode
        return _deny(ctx, reason, 0, 0, f"caller's chain {grant.chain_id} stopped")
    try:
        ctx.ensure_active()
    except BudgetExceededError as exc:
        return exc.trip
    return None


def _grant_preflight(ctx: ExecutionContext, grant: Grant | None) -> TripEvent | None:
    """Why a request whose chain and pools have room is refused: its grant is spent."""
    if grant is None:
        return None
    # The caller's budget is spent: refuse now rather than fail on the first call.
    if grant.steps == 0:
        return _deny(ctx, "steps", 0, 1, "no steps left in the caller's chain")
    if grant.tokens == 0:
        return _deny(ctx, "tokens", 0, 1, "no tokens left in the caller's chain")
    if grant.cost_nano == 0:
        return _deny(ctx, "cost", 0, 0, "no budget left in the caller's chain")
    return None


def _pool_preflight(ctx: ExecutionContext) -> TripEvent | None:
    """A pool with no room for even the smallest call refuses the request now.

    Asks the pools' ledger itself (a reservation of one step, one token and
    one nano-USD, released at once), so the denial carries the pool's name
    and ``retry_after_s`` exactly as a call's would. A pool with a little
    room left admits the request; its first call that does not fit is then
    refused as usual.
    """
    ledger = ctx.pools[0].ledger  # check_pools: every pool is on the chain's ledger
    probe, levels = _pool_probe(ctx)
    held = ledger.reserve(probe, 1, 1, steps=1, pools=levels)
    if isinstance(held, TripEvent):
        emit_trip(held)
        return held
    ledger.release(probe, held)
    return None


async def _apool_preflight(ctx: ExecutionContext) -> TripEvent | None:
    """:func:`_pool_preflight` with the store's round trips awaited."""
    if not ctx.awaits_store:  # in process: nothing to await
        return _pool_preflight(ctx)
    ledger: Any = ctx.pools[0].ledger  # the chain's: a store with coroutine operations
    probe, levels = _pool_probe(ctx)
    held = await ledger.areserve(probe, 1, 1, steps=1, pools=levels)
    if isinstance(held, TripEvent):
        emit_trip(held)
        return held
    await ledger.arelease(probe, held)
    return None


def _pool_probe(ctx: ExecutionContext) -> tuple[tuple[Level, ...], list[PoolLevel]]:
    """The pre-flight's throwaway path (the chain's id, no limits) and the pools' levels."""
    return (Level(ctx.chain_id, Limits()),), [pool.level for pool in ctx.pools]


def _deny(
    ctx: ExecutionContext, reason: TripReason, limit: float, observed: float, what: str
) -> TripEvent:
    trip = TripEvent(reason, float(limit), float(observed), ctx.chain_id, f"{what} (pre-flight)")
    emit_trip(trip)
    return trip


def denial_body(trip: TripEvent) -> bytes:
    """The JSON body of a 429 answer (with ``pool`` and ``retry_after_s`` for a pool's)."""
    body: dict[str, object] = {
        "error": "budget_exceeded",
        "reason": trip.reason,
        "limit": trip.limit,
        "observed": trip.observed,
        "chain_id": trip.chain_id,
        "message": trip.message,
    }
    if trip.pool is not None:
        body["pool"] = trip.pool
        body["retry_after_s"] = trip.retry_after_s
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


def retry_after_header(trip: TripEvent | None) -> tuple[str, str] | None:
    """``Retry-After`` (whole seconds, rounded up, at least 1) when ``trip`` says when."""
    if trip is None or trip.retry_after_s is None:
        return None
    return "Retry-After", str(max(1, math.ceil(trip.retry_after_s)))


UNAVAILABLE = "budget store unavailable"
POOLS_UNAVAILABLE = "budget pools unavailable"


def store_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is the shared ledger failing closed (not a limit reached)."""
    # Only loaded with the redis extra; without it no such error can exist.
    errors = sys.modules.get("veronica_otel.distributed._errors")
    return errors is not None and isinstance(exc, errors.LedgerUnavailableError)


def refusal(exc: BaseException) -> tuple[int, bytes, str]:
    """How to refuse a request whose chain could not be admitted or run.

    Returns the HTTP status, the JSON body and a short WebSocket close
    reason: 429 for a limit, 503 when the budget store is unreachable or
    admitting failed in any other way. The body names the reason but not
    the store's address or the error's text (logged here instead).
    """
    error = budget_error(exc)
    if error is not None and not store_failure(error):
        return 429, denial_body(error.trip), f"budget_exceeded: {error.reason}"
    if isinstance(exc, PoolSelectionError):
        _logger.error("veronica-otel: refusing a request with 503: %s", exc, exc_info=exc)
        cause = type(exc.__cause__).__name__ if exc.__cause__ is not None else "error"
        body = {
            "error": POOLS_UNAVAILABLE,
            "reason": f"the pools= callable failed ({cause}); failing closed",
            "chain_id": None,
        }
        return 503, json.dumps(body, separators=(",", ":")).encode("utf-8"), POOLS_UNAVAILABLE
    if error is not None:
        reason = "the shared budget ledger could not be reached; failing closed"
        chain_id: str | None = error.chain_id
    else:
        reason = f"admitting the request failed ({type(exc).__name__}); failing closed"
        chain_id = None
    _logger.error("veronica-otel: refusing a request with 503: %s", exc, exc_info=exc)
    body = {"error": UNAVAILABLE, "reason": reason, "chain_id": chain_id}
    return 503, json.dumps(body, separators=(",", ":")).encode("utf-8"), "budget store unavailable"


def budget_error(exc: BaseException) -> BudgetExceededError | None:
    """The BudgetExceededError in ``exc`` (or in an exception group), if any."""
    if isinstance(exc, BudgetExceededError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = budget_error(inner)
            if found is not None:
                return found
    return None
