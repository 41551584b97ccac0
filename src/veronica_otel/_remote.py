"""A chain across services: the grant a caller sends, the chain a service joins,
and the spending that flows back.

- :func:`issue_grant` (caller side): what the active chain has left now --
  the tightest remaining cost, steps, retries and tokens on its path, its
  deadline and hop ceiling -- as a :class:`~veronica_otel._grants.Grant`.
- :func:`join_chain` (service side): a per-request :class:`ExecutionContext`
  whose limits are the minimum of the local configuration and the grant, at
  the caller's depth plus one.
- :func:`spent` / :func:`commit_spent`: what the service's chain used, and
  committing it into the caller's chain when it comes back in the
  ``veronica-spent`` header.

When both sides use one shared ledger (a ledger exposing ``shared_id``, as
the Redis ledger does), the joined chain charges the caller's chain ids
directly: its path holds them as unlimited levels above its own, so every
call it makes is counted in the caller's chain atomically, and a trip there
stops it. The ``veronica-spent`` header then says ``shared=1`` and the caller
does not count it again.

The remaining budget in a grant is what the caller had left when it sent the
request: calls the caller makes while the service works are not reserved
against it, so concurrent spending on both sides can overrun the caller's
ceiling by at most what was granted; the caller's chain then trips.
"""

from __future__ import annotations

import secrets
import time

from ._config import ExecutionConfig
from ._context import ExecutionContext
from ._grants import MAX_ANCESTORS, Grant, Spent
from ._ledger import Ledger, Reservation
from ._policy import PolicyPipeline
from ._units import MAX_COUNT, nano_to_usd

__all__ = [
    "child_chain_id",
    "commit_spent",
    "effective_config",
    "issue_grant",
    "join_chain",
    "ledger_shared_id",
    "spent",
]

_NO_RESERVATION = Reservation("", 0, 0)
# Counts committed from one response header, at most (a signed header is
# trusted, but a loop must stay bounded whatever it says).
_MAX_REMOTE_COUNT = 100_000


def ledger_shared_id(ledger: object) -> str | None:
    """The id a ledger shares with other processes (``shared_id``), or None."""
    value = getattr(ledger, "shared_id", None)
    return value if isinstance(value, str) and 0 < len(value) <= 128 else None


def _ledger(ctx: ExecutionContext) -> Ledger:
    return ctx._ledger


def issue_grant(ctx: ExecutionContext, *, now: float | None = None, ttl_s: float = 60.0) -> Grant:
    """What ``ctx`` lets a downstream service spend, as of now."""
    wall = time.time() if now is None else now
    ledger = _ledger(ctx)
    steps: int | None = None
    retries: int | None = None
    for level in ctx._path:
        limits = level.limits
        if limits.steps is None and limits.retries is None:
            continue
        state = ledger.snapshot(level.chain_id)
        if limits.steps is not None:
            left = max(0, limits.steps - state.steps)
            steps = left if steps is None else min(steps, left)
        if limits.retries is not None:
            left = max(0, limits.retries - state.retries)
            retries = left if retries is None else min(retries, left)
    deadline_ms: int | None = None
    if ctx._deadline is not None:
        left_s = ctx._deadline - time.monotonic()
        deadline_ms = max(0, int((wall + left_s) * 1000))
    shared = ledger_shared_id(ledger)
    trip = ctx.trip
    return Grant(
        chain_id=ctx.chain_id,
        depth=ctx.depth,
        nonce=secrets.token_urlsafe(12),
        issued_at=int(wall),
        expires_at=int(wall + ttl_s) + 1,
        cost_nano=ctx.remaining_cost_nano(),
        steps=steps,
        retries=retries,
        tokens=ctx.remaining_tokens(),
        max_depth=ctx.config.max_depth,
        deadline_ms=deadline_ms,
        trip_reason=trip.reason if trip is not None else None,
        ledger_id=shared,
        # Root and the nearest levels when the path is deeper than a grant carries.
        ancestors=_ancestors(ctx) if shared is not None else (),
    )


def _ancestors(ctx: ExecutionContext) -> tuple[str, ...]:
    above = tuple(level.chain_id for level in ctx._path[:-1])
    if len(above) > MAX_ANCESTORS:
        above = (above[0], *above[-(MAX_ANCESTORS - 1) :])
    return above


def _min(local: int | None, granted: int | None) -> int | None:
    if local is None:
        return granted
    if granted is None:
        return local
    return min(local, granted)


def effective_config(local: ExecutionConfig, grant: Grant, now: float) -> ExecutionConfig:
    """Field by field, the lower of the local configuration and the grant."""
    cost = local.max_cost_usd
    if grant.cost_nano is not None:
        granted = nano_to_usd(grant.cost_nano)
        cost = granted if cost is None else min(cost, granted)
    timeout_ms = local.timeout_ms
    if grant.deadline_ms is not None:
        left = min(MAX_COUNT, max(0, grant.deadline_ms - int(now * 1000)))
        timeout_ms = _min(timeout_ms, left)
    return ExecutionConfig(
        max_cost_usd=cost,
        max_steps=_min(local.max_steps, grant.steps),
        max_retries_total=_min(local.max_retries_total, grant.retries),
        timeout_ms=timeout_ms,
        max_tokens=_min(local.max_tokens, grant.tokens),
        max_repeats=local.max_repeats,
        max_handoffs=local.max_handoffs,
        max_depth=_min(local.max_depth, grant.max_depth),
    )


def child_chain_id(grant: Grant) -> str:
    """This request's chain id: the caller's, plus a suffix unique to the grant."""
    suffix = grant.nonce[:12]
    return f"{grant.chain_id[: 127 - len(suffix)]}:{suffix}"


def join_chain(
    config: ExecutionConfig,
    grant: Grant,
    *,
    ledger: Ledger | None,
    pipeline: PolicyPipeline | None,
    now: float,
    shared: bool,
) -> ExecutionContext:
    """The chain a request joins under ``grant`` (not entered yet).

    A joined chain deeper than its ``max_depth`` is born tripped (reason
    ``depth``).
    """
    parent: ExecutionContext | None = None
    if shared:
        # The caller's chain ids, unlimited here: charged, and their trips stop us.
        for chain_id in (*grant.ancestors, grant.chain_id):
            parent = ExecutionContext(
                chain_id=chain_id,
                ledger=ledger,
                name="remote",
                _parent=parent,
                _depth=grant.depth,
            )
    return ExecutionContext(
        effective_config(config, grant, now),
        pipeline,
        chain_id=child_chain_id(grant),
        ledger=ledger,
        name="request",
        _parent=parent,
        _depth=grant.depth + 1,
    )


def spent(ctx: ExecutionContext, *, shared: bool = False) -> Spent:
    """What ``ctx``'s own chain has used so far (in-flight reservations included)."""
    state = _ledger(ctx).snapshot(ctx.chain_id)
    return Spent(
        cost_nano=state.cost_nano + state.reserved_nano,
        tokens=state.tokens + state.reserved_tokens,
        steps=state.steps,
        retries=state.retries,
        shared=shared,
    )


def commit_spent(ctx: ExecutionContext, used: Spent) -> None:
    """Count a downstream service's spending in ``ctx``'s chain.

    Cost and tokens go through :meth:`ExecutionContext.record_usage` (into
    the running wrapped call, if any). Steps and retries are drawn one by one,
    check-before-increment: spending that no longer fits trips the chain
    (sticky), exactly as a local call would. Never raises for a trip.
    """
    if used.shared:
        return
    if used.cost_nano or used.tokens:
        ctx.record_usage(cost_usd=nano_to_usd(used.cost_nano), input_tokens=used.tokens)
    ledger = _ledger(ctx)
    path = ctx._path
    for count, step in ((used.steps, True), (used.retries, False)):
        for _ in range(min(count, _MAX_REMOTE_COUNT)):
            result = ledger.reserve(path, 0, 0, step=step, retry=not step)
            if type(result) is not Reservation:
                ctx._tripped(result, raise_error=False)  # type: ignore[arg-type]
                return
            ledger.commit(path, result, 0, 0)
