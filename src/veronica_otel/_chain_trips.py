"""A chain's trips record: denials, the sticky trip, deadlines, agents' denials, overrides."""

from __future__ import annotations

import logging
import time

from opentelemetry import trace

from ._agent_limits import AgentLevels
from ._agents import HandoffCounter, current_agent
from ._chain_span import remaining_attributes
from ._chain_state import ChainState
from ._errors import BudgetExceededError, TripEvent, TripReason
from ._ledger import (
    Level,
)
from ._policy import PolicyDecision
from ._timer import CancellationToken
from ._trips import emit_trip
from ._units import check_count, check_usd, nano_to_usd, usd_to_nano

__all__ = ["ChainTrips"]

_MAX_OVERRIDE_S = 7 * 24 * 3600.0
_override_logger = logging.getLogger("veronica_otel.overrides")


class ChainTrips:
    """Denying a call and tripping the chain: every part that denies goes through
    here, so the sticky trip (``state.trip``) is set and announced in one place."""

    __slots__ = ("__weakref__", "_ledger", "chain_id", "state", "token")

    def __init__(self, state: ChainState) -> None:
        self.state = state
        self.chain_id = state.chain_id
        self._ledger = state.ledger
        self.token: CancellationToken = state.token  # the chain's timers reach it (weak_cancel)

    def cancel(self) -> None:
        """Stop the chain now: later calls are denied with reason ``timeout``."""
        if self.token.cancel():
            self.trip_now("timeout", 0, self.state.elapsed_ms(), "chain cancelled")

    def deny_timeout(self) -> None:
        if self.token.cancelled and self.state.trip is None:
            trip = self.state.current_trip()
            if trip is not None:
                raise BudgetExceededError(trip)
        limit = float(self.state.config.timeout_ms or 0)
        self.deny("timeout", limit, self.state.elapsed_ms(), "wall-clock deadline passed")

    def on_deadline(self) -> None:
        try:
            if self.state.trip is None:
                self.trip_now(
                    "timeout",
                    float(self.state.config.timeout_ms or 0),
                    self.state.elapsed_ms(),
                    "deadline",
                )
        finally:
            self.token.cancel()  # streams are cut even if the store is unreachable

    def trip_now(self, reason: TripReason, limit: float, observed: float, what: str) -> TripEvent:
        event = TripEvent(
            reason, float(limit), float(observed), self.chain_id, f"chain {self.chain_id}: {what}"
        )
        self.state.trip = self._ledger.trip(self.chain_id, event)
        return self.state.trip

    def deny(
        self,
        reason: TripReason,
        limit: float,
        observed: float,
        what: str,
        *,
        sticky: bool = True,
        raise_error: bool = True,
    ) -> None:
        if sticky:
            trip = self.trip_now(reason, limit, observed, what)
        else:
            trip = TripEvent(
                reason,
                float(limit),
                float(observed),
                self.chain_id,
                f"chain {self.chain_id}: {what}",
            )
        emit_trip(trip, remaining=remaining_attributes(self.state))
        if raise_error:
            raise BudgetExceededError(trip)

    def deny_policy(self, decision: PolicyDecision) -> None:
        trip = TripEvent(
            decision.trip_reason or "cost",
            decision.limit,
            decision.observed,
            self.chain_id,
            f"chain {self.chain_id}: {decision.policy_type} denied: {decision.reason}",
        )
        if decision.partial_result is not None:
            self.state.partial = decision.partial_result
        emit_trip(trip, remaining=remaining_attributes(self.state))
        raise BudgetExceededError(trip)

    def tripped(self, trip: TripEvent, *, raise_error: bool = True, stored: bool = False) -> None:
        """Deny for ``trip``; ``stored``: a pool's trip the async path already stored."""
        if not stored and self.pool_trip(trip):
            trip = self._ledger.trip(self.chain_id, trip)
        if not trip.sticky:  # only in-flight reservations denied it: deny, remember nothing
            emit_trip(trip, remaining=remaining_attributes(self.state))
        elif trip.chain_id == self.chain_id or self.state.trip is None:
            first = self.state.trip is None
            self.state.trip = trip
            if first:
                emit_trip(trip, remaining=remaining_attributes(self.state))
        if raise_error:
            raise BudgetExceededError(trip)

    def pool_trip(self, trip: TripEvent) -> bool:
        """Whether ``trip`` is a pool's sticky denial of this chain. A pool never
        trips; the chain it denied does (stored, so it is sticky for every
        context of the chain, children included)."""
        return trip.pool is not None and trip.sticky and trip.chain_id == self.chain_id

    def check_handoff(self, counter: HandoffCounter) -> None:
        name = current_agent()
        if name is None:
            return
        over = counter.observe(name)
        if over is not None:
            last, now, count = over
            self.deny(
                "loop",
                counter.limit,
                count,
                f"agents {last!r} and {now!r} handed control back and forth {count} times "
                f"(max_handoffs={counter.limit})",
            )

    def agent_path(self) -> tuple[tuple[Level, ...], str] | None:
        """This call's path with the levels of the limited agents it is made for."""
        state = self.state
        tree = state.agent_tree
        if tree is None:
            root = state
            while root.parent is not None:
                root = root.parent
            # One tree per root, also when threads race here (setdefault is atomic).
            held = vars(root)
            tree = held.get("agent_tree") or held.setdefault("agent_tree", AgentLevels(root))
            state.agent_tree = tree
        return tree.path(state.path, state.agent_lookups)

    def agent_denied(self, trip: TripEvent, *, raise_error: bool = True) -> bool:
        """Deny for an agent whose own level made ``trip``; the chain goes on.

        Returns False (nothing done) when ``trip`` is not an agent's."""
        tree = self.state.agent_tree
        mapped = tree.denial(trip, self.chain_id) if tree is not None else None
        if mapped is None:
            return False
        event, news = mapped
        if news:
            emit_trip(event, remaining=remaining_attributes(self.state))
        if raise_error:
            raise BudgetExceededError(event)
        return True

    def trip_lifted(self) -> bool:
        """Whether a logged override (maybe from another process) lifted our trip."""
        trip = self.state.trip
        if trip is None or trip.reason == "timeout":
            return trip is None  # a deadline is not lifted by a budget override
        # Only an explicit override lifts a trip: a store that lost the chain
        # (restart, flush, eviction) shows no trip but lifted nothing.
        lifted = getattr(self._ledger, "trip_lifted", None)
        if lifted is not None:
            if not lifted(trip.chain_id):
                return False
        elif self._ledger.snapshot(trip.chain_id).trip is not None:
            return False  # an in-process ledger removes a trip only by override
        return self.lift(trip)

    async def atrip_lifted(self) -> bool:
        """:meth:`_trip_lifted` reading the store without blocking."""
        trip = self.state.trip
        if trip is None or trip.reason == "timeout" or self.state.aledger is None:
            return self.trip_lifted()
        if not await self.state.aledger.atrip_lifted(trip.chain_id):
            return False
        return self.lift(trip)

    def lift(self, trip: TripEvent) -> bool:
        self.state.trip = None
        try:
            span = trace.get_current_span()
            if span.is_recording():
                span.add_event(
                    "veronica.override.applied",
                    {"veronica.chain.id": trip.chain_id, "veronica.trip.reason": trip.reason},
                )
        except Exception:
            _override_logger.exception("recording an override on the span failed")
        return True

    def override(
        self,
        reason: str,
        duration_s: float,
        *,
        add_usd: float = 0.0,
        add_steps: int = 0,
    ) -> TripEvent | None:
        """``ExecutionContext.override``: lift the sticky trip for ``duration_s``
        seconds, logged and shown as a span event; returns the trip lifted."""
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError("override needs a reason (a non-empty string)")
        duration = check_usd("duration_s", duration_s)  # finite, >= 0, not absurd
        if duration <= 0 or duration > _MAX_OVERRIDE_S:
            raise ValueError(
                f"duration_s must be in (0, {_MAX_OVERRIDE_S}] seconds, got {duration_s!r}"
            )
        extra_cost = usd_to_nano(check_usd("add_usd", add_usd))
        extra_steps = check_count("add_steps", add_steps)
        apply = getattr(self._ledger, "override", None)
        if apply is None:
            raise TypeError(f"ledger {self._ledger!r} does not support overrides")
        expires_at = time.time() + duration
        lifted: TripEvent | None = apply(
            self.chain_id, expires_at=expires_at, add_cost_nano=extra_cost, add_steps=extra_steps
        )
        self.state.trip = None
        attributes: dict[str, str | float | int] = {
            "veronica.chain.id": self.chain_id,
            "veronica.override.reason": reason,
            "veronica.override.duration_s": duration,
            "veronica.override.add_usd": nano_to_usd(extra_cost),
            "veronica.override.add_steps": extra_steps,
            "veronica.trip.reason": lifted.reason if lifted else "",
        }
        _override_logger.warning(
            "override chain=%s reason=%r duration=%gs add_usd=%g add_steps=%d lifted=%s",
            self.chain_id,
            reason,
            duration,
            nano_to_usd(extra_cost),
            extra_steps,
            lifted.reason if lifted else "none",
        )
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event("veronica.override", attributes)
        return lifted
