"""A chain across services: the grant a caller sends, the chain a service joins,
and the settlement of what came back.

- :func:`issue_grant` (caller side): *carves* the grant's budget out of the
  active chain -- one ordinary ledger reservation of cost, tokens and the
  granted steps, atomic, so concurrent grants can never hand out more than
  the chain has left. A grant that cannot be carved is not
  made: :class:`~veronica_otel.BudgetExceededError` before the request leaves.
- :func:`settle` (caller side): the signed spend-back settles the carve --
  what the service used is committed, capped at the carve, and the rest is
  released. A missing or untrusted spend-back commits the whole carve (the
  service may have spent all of it). One ledger operation: a commit of cost
  and tokens that gives the unused steps back (or a release when nothing was
  used), whatever the service reports.
- :func:`join_chain` (service side): a per-request :class:`ExecutionContext`
  whose limits are the minimum of the local configuration and the grant, at
  the caller's depth plus one.
- :func:`spent`: what the service's chain used (the spend-back's content).

Shared ledger: when the caller's ledger has a ``shared_id`` (a Redis ledger
does), nothing is carved. The grant names the ledger and the caller's path
with its ceilings; a service on the same ledger runs the request as a child
chain of the caller's chain (same chain tree, so one Redis Cluster slot),
every call checked and charged in the caller's chain atomically, and the
spend-back is not counted again. A service on another ledger refuses such a
grant (it was not carved).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ._children import min_limit
from ._config import ExecutionConfig
from ._context import ExecutionContext
from ._errors import BudgetExceededError, TripEvent, TripReason
from ._grants import MAX_ANCESTORS, Grant, Spent, record_spent_rejection
from ._ledger import Ledger, LedgerState, Level, Reservation
from ._limits import GRANT_MARK
from ._policy import PolicyPipeline
from ._pools import BudgetPool
from ._trips import emit_trip
from ._units import MAX_COUNT, nano_to_usd

__all__ = [
    "MAX_CARVE_STEPS",
    "Carve",
    "GrantLimits",
    "child_chain_id",
    "effective_config",
    "issue_grant",
    "join_chain",
    "ledger_shared_id",
    "settle",
    "spent",
]

# Steps one grant can carry (all in the carve's one reservation).
MAX_CARVE_STEPS = 32
_NO_RESERVATION = Reservation("", 0, 0)
# Snapshot-then-reserve of one carve at a time in this process, so two grants
# made at once do not both ask for "all that is left".
_carving = threading.Lock()


@dataclass(frozen=True, slots=True)
class GrantLimits:
    """The most one grant may carve (None: all that is left).

    Attributes:
        cost_nano: Cost per grant, nano-USD.
        steps: Steps per grant (at most :data:`MAX_CARVE_STEPS` in any case).
        tokens: Tokens per grant.
    """

    cost_nano: int | None = None
    steps: int | None = None
    tokens: int | None = None


@dataclass(slots=True)
class Carve:
    """What one grant holds in the caller's chain until its spend-back settles it."""

    ctx: ExecutionContext
    path: tuple[Level, ...]
    main: Reservation | None  # cost, tokens and the steps; None: nothing limited
    cost_nano: int | None = None
    tokens: int | None = None
    steps: int | None = None
    settled: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


def ledger_shared_id(ledger: object) -> str | None:
    """The id a ledger shares with other processes (``shared_id``), or None."""
    value = getattr(ledger, "shared_id", None)
    return value if isinstance(value, str) and 0 < len(value) <= 128 else None


def _ledger(ctx: ExecutionContext) -> Ledger:
    return ctx._state.ledger


def issue_grant(
    ctx: ExecutionContext,
    *,
    audience: str,
    now: float | None = None,
    ttl_s: float = 60.0,
    limits: GrantLimits | None = None,
) -> tuple[Grant, Carve | None]:
    """A grant for ``audience`` and the carve that backs it (None on a shared ledger).

    Raises:
        BudgetExceededError: The chain has stopped, or nothing is left to
            carve (not sticky: the chain itself is not tripped by a grant).
    """
    ctx.ensure_active()
    wall = time.time() if now is None else now
    ledger = _ledger(ctx)
    deadline_ms: int | None = None
    if ctx._state.deadline is not None:
        left_s = ctx._state.deadline - time.monotonic()
        deadline_ms = max(0, int((wall + left_s) * 1000))
    nonce = secrets.token_urlsafe(12)
    base = {
        "chain_id": ctx.chain_id,
        "depth": ctx.depth,
        "nonce": nonce,
        "issued_at": int(wall),
        "expires_at": int(wall + ttl_s) + 1,
        "audience": audience,
        "max_depth": ctx.config.max_depth,
        "deadline_ms": deadline_ms,
    }
    shared = ledger_shared_id(ledger)
    if shared is not None:
        pools = tuple(pool.level for pool in ctx.pools)  # charged there as the caller would
        grant = Grant(**base, ledger_id=shared, path=_shared_path(ctx), pools=pools)  # type: ignore[arg-type]
        return grant, None
    carve = _carve(ctx, ledger, limits or GrantLimits())
    retries = _retries_left(ctx, ledger)
    grant = Grant(
        **base,  # type: ignore[arg-type]
        cost_nano=carve.cost_nano,
        steps=carve.steps,
        retries=retries,
        tokens=carve.tokens,
        carved=True,
    )
    return grant, carve


def _shared_path(ctx: ExecutionContext) -> tuple[Level, ...]:
    path = ctx._state.path
    if len(path) > MAX_ANCESTORS:
        path = (path[0], *path[-(MAX_ANCESTORS - 1) :])
    return tuple(path)


def _retries_left(ctx: ExecutionContext, ledger: Ledger) -> int | None:
    left: int | None = None
    for level in ctx._state.path:
        if level.limits.retries is not None:
            used = ledger.snapshot(level.chain_id).retries
            left = min_limit(left, max(0, level.limits.retries - used))
    return left


def _carve(ctx: ExecutionContext, ledger: Ledger, caps: GrantLimits) -> Carve:
    path = ctx._state.path
    with _carving:
        cost_left, steps_left = ctx.remaining_cost_and_steps()
        cost = min_limit(cost_left, caps.cost_nano)
        steps = min_limit(steps_left, caps.steps)
        if steps is not None:
            steps = min(steps, MAX_CARVE_STEPS)
        tokens = min_limit(ctx.remaining_tokens(), caps.tokens)
        for reason, value in (("steps", steps), ("cost", cost), ("tokens", tokens)):
            if value == 0:
                _nothing_left(ctx, reason)  # type: ignore[arg-type]
        if cost is None and steps is None and tokens is None:
            return Carve(ctx, path, None)
        main = ledger.reserve(
            path,
            cost or 0,
            tokens or 0,
            step=steps is not None,
            steps=steps or 1,
            **ctx._state.pool_args(),  # a grant spends the chain's pools too
        )
        if type(main) is not Reservation:
            ctx._trips.tripped(main)  # type: ignore[arg-type]
        return Carve(ctx, path, main, cost, tokens, steps)  # type: ignore[arg-type]


def _nothing_left(ctx: ExecutionContext, reason: TripReason) -> None:
    trip = TripEvent(
        reason,
        0.0,
        0.0,
        ctx.chain_id,
        f"chain {ctx.chain_id}: no {reason} left to grant a downstream service "
        "(in-flight calls and grants may hold it; try again once they finish)",
        sticky=False,
    )
    emit_trip(trip)
    raise BudgetExceededError(trip)


def settle(carve: Carve, used: Spent | None) -> None:
    """Settle ``carve`` with the service's trusted spend-back (None: commit it all).

    What is reported is capped at the carve on every limited measure;
    reporting more is counted (``over_carve``) and charged as the carve.
    Settles once; later calls do nothing. Never raises for a trip.
    """
    with carve.lock:
        if carve.settled:
            return
        carve.settled = True
    ctx = carve.ctx
    ledger = _ledger(ctx)
    if carve.main is None:  # nothing limited: count the reported spend, if any
        if used is not None and (used.cost_nano or used.tokens):
            _trip_on(ctx, ledger.commit(carve.path, _NO_RESERVATION, used.cost_nano, used.tokens))
        return
    if used is None:
        cost, tokens, steps = carve.cost_nano or 0, carve.tokens or 0, carve.steps or 0
    else:
        cost, over_cost = _capped(used.cost_nano, carve.cost_nano)
        tokens, over_tokens = _capped(used.tokens, carve.tokens)
        steps, over_steps = _capped(used.steps, carve.steps)
        if over_cost or over_tokens or over_steps:
            record_spent_rejection("over_carve", ctx.chain_id)
    if steps == 0 and cost == 0 and tokens == 0:
        ledger.release(carve.path, carve.main)
        return
    # A settlement that commits anything counts at least one of the carved steps.
    unused = carve.main.step - max(1, steps)
    overrun = ledger.commit(carve.path, carve.main, cost, tokens, release_steps=max(0, unused))
    _trip_on(ctx, overrun)


def _capped(value: int, carved: int | None) -> tuple[int, bool]:
    value = min(value, MAX_COUNT)
    if carved is None:
        return value, False
    return (carved, True) if value > carved else (value, False)


def _trip_on(ctx: ExecutionContext, overrun: TripEvent | None) -> None:
    if overrun is not None:
        ctx._trips.tripped(overrun, raise_error=False)


def effective_config(local: ExecutionConfig, grant: Grant, now: float) -> ExecutionConfig:
    """Field by field, the lower of the local configuration and the grant."""
    cost = local.max_cost_usd
    if grant.cost_nano is not None:
        granted = nano_to_usd(grant.cost_nano)
        cost = granted if cost is None else min(cost, granted)
    timeout_ms = local.timeout_ms
    if grant.deadline_ms is not None:
        left = min(MAX_COUNT, max(0, grant.deadline_ms - int(now * 1000)))
        timeout_ms = min_limit(timeout_ms, left)
    return ExecutionConfig(
        max_cost_usd=cost,
        max_steps=min_limit(local.max_steps, grant.steps),
        max_retries_total=min_limit(local.max_retries_total, grant.retries),
        timeout_ms=timeout_ms,
        max_tokens=min_limit(local.max_tokens, grant.tokens),
        max_repeats=local.max_repeats,
        max_handoffs=local.max_handoffs,
        max_depth=min_limit(local.max_depth, grant.max_depth),
        reservation_wait_s=local.reservation_wait_s,
    )


def child_chain_id(grant: Grant) -> str:
    """This request's chain id: the caller's, ``:grant/``, and a suffix unique to the grant.

    In the caller's chain tree (see ``distributed/_keys.py``), so on a shared
    Redis ledger every key of the request's path is in one cluster slot; the
    ``/`` keeps it apart from every chain id a user can give.
    """
    suffix = grant.nonce[:12]
    return f"{grant.chain_id[: 128 - len(GRANT_MARK) - len(suffix)]}{GRANT_MARK}{suffix}"


def join_chain(
    config: ExecutionConfig,
    grant: Grant,
    *,
    ledger: Ledger | None,
    pipeline: PolicyPipeline | None,
    now: float,
    shared: bool,
    pools: Sequence[BudgetPool] = (),
) -> ExecutionContext:
    """The chain a request joins under ``grant`` (not entered yet).

    ``pools`` are the receiving service's own budget pools for the request
    (the caller's pools were charged for the grant's carve already; on a
    shared ledger, where nothing is carved, the request's calls are reserved
    in the caller's pools named by the grant).

    Shared: the caller's path, with its ceilings, sits above the request's
    chain, so every call is checked against and charged to the caller's
    chain in one atomic ledger step. A joined chain deeper than its
    ``max_depth`` is born tripped (reason ``depth``).
    """
    parent: ExecutionContext | None = None
    if shared:
        for level in grant.path:
            limits = level.limits
            cost = limits.cost_nano
            parent = ExecutionContext(
                ExecutionConfig(
                    max_cost_usd=None if cost is None else nano_to_usd(cost),
                    max_steps=limits.steps,
                    max_retries_total=limits.retries,
                    max_tokens=limits.tokens,
                ),
                chain_id=level.chain_id,
                ledger=ledger,
                name="remote",
                detached=True,
                _grant_chain=True,
                _parent=parent,
                _depth=grant.depth,
            )
    if shared and grant.pools:
        pools = (*_caller_pools(grant, ledger, {pool.name for pool in pools}), *pools)
    return ExecutionContext(
        effective_config(config, grant, now),
        pipeline,
        chain_id=child_chain_id(grant),
        ledger=ledger,
        name="request",
        detached=True,
        _grant_chain=True,
        _parent=parent,
        _depth=grant.depth + 1,
        pools=pools,
    )


def _caller_pools(grant: Grant, ledger: Ledger | None, own: set[str]) -> list[BudgetPool]:
    """The caller's pools on the shared ledger, with the limits its grant carries
    (a pool the service lists itself is the same budget: listed once)."""
    pools = []
    for level in grant.pools:
        if level.name in own:
            continue
        cost = level.limits.cost_nano
        pools.append(
            BudgetPool(
                level.name,
                max_cost_usd=None if cost is None else nano_to_usd(cost),
                max_steps=level.limits.steps,
                max_tokens=level.limits.tokens,
                window=level.window_s,
                ledger=ledger,
            )
        )
    return pools


def spent(ctx: ExecutionContext) -> Spent:
    """What ``ctx``'s own chain has used so far (in-flight reservations included)."""
    return _spent(_ledger(ctx).snapshot(ctx.chain_id))


async def aspent(ctx: ExecutionContext) -> Spent:
    """:func:`spent` for async code: a shared store is read without blocking."""
    aledger = ctx._state.aledger
    if aledger is None:
        return spent(ctx)
    return _spent(await aledger.asnapshot(ctx.chain_id))


def _spent(state: LedgerState) -> Spent:
    return Spent(
        cost_nano=state.cost_nano + state.reserved_nano,
        tokens=state.tokens + state.reserved_tokens,
        steps=state.steps,
        retries=state.retries,
    )
