"""CircuitBreaker: CLOSED -> OPEN -> HALF_OPEN with exactly one probe in flight.

The clock is injectable (``time.monotonic`` by default) so tests move time
instead of sleeping. The half-open probe slot belongs to the call that took
it; it is released when that call succeeds, fails, or is abandoned because a
later policy denied it. A probe that never reports back (its caller hung or
died without telling us) expires after ``probe_ttl_s``, like the Redis
breaker's probe TTL, so a breaker can never stay wedged half-open.
"""

from __future__ import annotations

import enum
import math
import threading
import time
from collections.abc import Callable

from ._policy import PolicyContext, PolicyDecision
from ._units import check_count

__all__ = ["CircuitBreaker", "CircuitState"]


class CircuitState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


_ALLOW = PolicyDecision(True, "circuit_breaker")
# A probe slot must outlive the probe call itself, even with a tiny recovery timeout.
_MIN_PROBE_TTL_S = 60.0


class CircuitBreaker:
    """Stops calls to an endpoint that keeps failing.

    Args:
        failure_threshold: Consecutive failures that open the circuit.
        recovery_timeout: Seconds the circuit stays OPEN before one probe.
        probe_ttl_s: Seconds a half-open probe slot is held before it is
            considered abandoned and the next call may probe (default:
            ``recovery_timeout``, at least 60 s, as for
            :class:`~veronica_otel.distributed.RedisCircuitBreaker`, so a short
            recovery timeout never lets a second probe in while the first
            one's call is still running).
        clock: Monotonic seconds; inject a fake one in tests.
    """

    policy_type = "circuit_breaker"

    def __init__(
        self,
        failure_threshold: int = 5,
        recovery_timeout: float = 60.0,
        *,
        probe_ttl_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_count("failure_threshold", failure_threshold)
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {failure_threshold!r}")
        if (
            isinstance(recovery_timeout, bool)
            or not isinstance(recovery_timeout, (int, float))
            or not math.isfinite(recovery_timeout)
            or recovery_timeout < 0
        ):
            raise ValueError(
                "recovery_timeout must be a finite number of seconds >= 0, "
                f"got {recovery_timeout!r}"
            )
        if probe_ttl_s is None:
            probe_ttl_s = max(float(recovery_timeout), _MIN_PROBE_TTL_S)
        elif (
            isinstance(probe_ttl_s, bool)
            or not isinstance(probe_ttl_s, (int, float))
            or not math.isfinite(probe_ttl_s)
            or probe_ttl_s <= 0
        ):
            raise ValueError(
                f"probe_ttl_s must be a finite number of seconds > 0, got {probe_ttl_s!r}"
            )
        self.failure_threshold = failure_threshold
        self.recovery_timeout = float(recovery_timeout)
        self.probe_ttl_s = float(probe_ttl_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._state = CircuitState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._probe_owner: object | None = None
        self._probe_expires = 0.0

    @property
    def state(self) -> CircuitState:
        """Current state; OPEN reads as HALF_OPEN once the timeout has passed."""
        with self._lock:
            self._advance()
            return self._state

    @property
    def failure_count(self) -> int:
        return self._failures

    def check(self, context: PolicyContext | object | None = None) -> PolicyDecision:
        """Allow, or deny while OPEN or while the half-open probe is out.

        Args:
            context: Identifies the caller; in HALF_OPEN the allowed caller owns
                the probe slot, and only its outcome (or abandonment) counts.
        """
        if self._state is CircuitState.CLOSED:
            # Lock-free for the common case: only OPEN moves on with time, and
            # a concurrent trip to OPEN orders after this check either way.
            return _ALLOW
        with self._lock:
            self._advance()
            # Re-read under the lock: the probe may have closed it meanwhile.
            if self._state is CircuitState.CLOSED:  # type: ignore[comparison-overlap]
                return _ALLOW
            if self._state is CircuitState.HALF_OPEN:
                now = self._clock()
                if self._probe_owner is None or now >= self._probe_expires:
                    # A free slot, or one whose holder never reported back.
                    self._probe_owner = context if context is not None else object()
                    self._probe_expires = now + self.probe_ttl_s
                    return _ALLOW
            retry_in = max(0.0, self._opened_at + self.recovery_timeout - self._clock())
            return PolicyDecision(
                False,
                self.policy_type,
                f"circuit {self._state.value} after {self._failures} failures; "
                f"next probe in {retry_in:.1f}s",
                limit=self.failure_threshold,
                observed=self._failures,
            )

    def record_success(self, owner: object | None = None) -> None:
        """Feed a success. In HALF_OPEN only the probe's outcome counts.

        Args:
            owner: The call reporting (its PolicyContext); None for a caller
                that manages the breaker by hand and is the probe.
        """
        if self._state is CircuitState.CLOSED and not self._failures:
            return  # nothing to reset: the common case takes no lock
        with self._lock:
            self._advance()
            # A late success from a call sent before the circuit opened must
            # not close it: only CLOSED or the half-open probe count.
            if self._state is CircuitState.OPEN or not self._is_probe(owner):
                return
            self._failures = 0
            self._state = CircuitState.CLOSED
            self._probe_owner = None

    def record_failure(self, owner: object | None = None) -> None:
        """Feed a failure. Late failures neither restart OPEN nor free the probe."""
        with self._lock:
            self._advance()
            if self._state is CircuitState.OPEN or not self._is_probe(owner):
                return
            self._failures += 1
            if self._state is CircuitState.HALF_OPEN or self._failures >= self.failure_threshold:
                self._state = CircuitState.OPEN
                self._opened_at = self._clock()
            self._probe_owner = None

    def _is_probe(self, owner: object | None) -> bool:
        if self._state is not CircuitState.HALF_OPEN:
            return True
        return owner is None or owner is self._probe_owner

    def release_probe(self, owner: object | None = None) -> None:
        """Free the half-open probe slot without an outcome (call not sent)."""
        if self._probe_owner is None:
            return
        with self._lock:
            if owner is None or self._probe_owner is owner:
                self._probe_owner = None

    def on_success(self, context: PolicyContext) -> None:
        self.record_success(context)

    def on_failure(self, context: PolicyContext, error: BaseException) -> None:
        self.record_failure(context)

    def on_abandon(self, context: PolicyContext) -> None:
        self.release_probe(context)

    def reset(self) -> None:
        with self._lock:
            self._state = CircuitState.CLOSED
            self._failures = 0
            self._probe_owner = None

    def _advance(self) -> None:
        if (
            self._state is CircuitState.OPEN
            and self._clock() - self._opened_at >= self.recovery_timeout
        ):
            self._state = CircuitState.HALF_OPEN
            self._probe_owner = None
