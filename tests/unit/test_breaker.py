"""CircuitBreaker: states, the single half-open probe, pipelines, threads, bad arguments.

Time is a fake clock the tests move forward; nothing here sleeps.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from tests._clock import FakeClock
from veronica_otel import (
    CircuitBreaker,
    CircuitState,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    LocalLedger,
    PolicyContext,
    PolicyDecision,
    PolicyPipeline,
)


class DenyAll:
    """A policy that denies every call (placed after the breaker in a pipeline)."""

    policy_type = "step_guard"

    def __init__(self) -> None:
        self.checks = 0

    def check(self, context: PolicyContext) -> PolicyDecision:
        self.checks += 1
        return PolicyDecision(False, self.policy_type, "denied for the test")

    def reset(self) -> None:
        self.checks = 0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1000.0)


@pytest.fixture
def breaker(clock: FakeClock) -> CircuitBreaker:
    return CircuitBreaker(failure_threshold=3, recovery_timeout=30.0, clock=clock)


def _open(breaker: CircuitBreaker) -> None:
    for _ in range(breaker.failure_threshold):
        breaker.record_failure()
    assert breaker.state is CircuitState.OPEN


def _allowed(breaker: CircuitBreaker, context: PolicyContext | None = None) -> bool:
    return breaker.check(context if context is not None else PolicyContext()).allowed


# -- CLOSED / OPEN -------------------------------------------------------------


def test_starts_closed_and_allows(breaker: CircuitBreaker) -> None:
    assert breaker.state is CircuitState.CLOSED
    assert all(_allowed(breaker) for _ in range(100))
    assert breaker.failure_count == 0


def test_opens_after_threshold_consecutive_failures(breaker: CircuitBreaker) -> None:
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state is CircuitState.CLOSED
    assert _allowed(breaker)
    breaker.record_failure()
    assert breaker.state is CircuitState.OPEN
    decision = breaker.check(PolicyContext())
    assert not decision.allowed
    assert decision.trip_reason == "circuit_open"
    assert decision.policy_type == "circuit_breaker"


def test_success_resets_the_failure_count(breaker: CircuitBreaker) -> None:
    for _ in range(5):
        breaker.record_failure()
        breaker.record_failure()
        breaker.record_success()
        assert breaker.failure_count == 0
    assert breaker.state is CircuitState.CLOSED
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state is CircuitState.CLOSED


def test_open_denies_until_recovery_timeout(breaker: CircuitBreaker, clock: FakeClock) -> None:
    _open(breaker)
    for _ in range(29):
        clock.advance(1.0)
        assert not _allowed(breaker)
        assert breaker.state is CircuitState.OPEN
    clock.advance(0.999)
    assert not _allowed(breaker)
    clock.advance(0.001)
    assert breaker.state is CircuitState.HALF_OPEN


def test_half_open_allows_exactly_one_probe(breaker: CircuitBreaker, clock: FakeClock) -> None:
    _open(breaker)
    clock.advance(30.0)
    assert _allowed(breaker)
    assert [_allowed(breaker) for _ in range(20)] == [False] * 20
    clock.advance(59.9)  # within the probe timeout (max(recovery, 60 s)) the slot holds
    assert not _allowed(breaker)
    clock.advance(0.1)  # then the probe that never reported back has expired
    assert _allowed(breaker)
    assert not _allowed(breaker)
    assert breaker.state is CircuitState.HALF_OPEN


def test_probe_success_closes(breaker: CircuitBreaker, clock: FakeClock) -> None:
    _open(breaker)
    clock.advance(30.0)
    assert _allowed(breaker)
    breaker.record_success()
    assert breaker.state is CircuitState.CLOSED
    assert breaker.failure_count == 0
    assert all(_allowed(breaker) for _ in range(10))


def test_probe_failure_reopens_with_a_fresh_timeout(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    _open(breaker)
    clock.advance(45.0)  # well past the first timeout
    assert _allowed(breaker)
    breaker.record_failure()
    assert breaker.state is CircuitState.OPEN
    clock.advance(29.9)
    assert not _allowed(breaker)
    assert breaker.state is CircuitState.OPEN
    clock.advance(0.1)
    assert breaker.state is CircuitState.HALF_OPEN
    assert _allowed(breaker)
    assert not _allowed(breaker)


def test_probe_slot_released_when_a_later_policy_denies(clock: FakeClock) -> None:
    abandoned: list[PolicyContext] = []

    class SpyBreaker(CircuitBreaker):
        def on_abandon(self, context: PolicyContext) -> None:
            abandoned.append(context)
            super().on_abandon(context)

    breaker = SpyBreaker(failure_threshold=3, recovery_timeout=30.0, clock=clock)
    deny = DenyAll()
    pipeline = PolicyPipeline([breaker, deny])
    _open(breaker)
    clock.advance(30.0)
    first = PolicyContext()
    decision = pipeline.evaluate(first)
    assert not decision.allowed
    assert decision.policy_type == "step_guard"
    assert deny.checks == 1
    assert abandoned == [first]
    # The breaker took the probe, the pipeline gave it back: the next call gets it.
    assert _allowed(breaker)
    assert not _allowed(breaker)


def test_without_abandon_the_probe_stays_taken(breaker: CircuitBreaker, clock: FakeClock) -> None:
    _open(breaker)
    clock.advance(30.0)
    assert breaker.check(PolicyContext()).allowed
    assert not breaker.check(PolicyContext()).allowed


def test_abandon_by_another_call_does_not_free_the_probe(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    _open(breaker)
    clock.advance(30.0)
    probe, other = PolicyContext(), PolicyContext()
    assert breaker.check(probe).allowed
    assert not breaker.check(other).allowed
    breaker.on_abandon(other)
    assert not _allowed(breaker)
    breaker.on_abandon(probe)
    assert _allowed(breaker)


def test_probe_released_when_the_ledger_denies(clock: FakeClock) -> None:
    breaker = CircuitBreaker(failure_threshold=1, recovery_timeout=5.0, clock=clock)
    ledger = LocalLedger()
    breaker.record_failure()
    clock.advance(5.0)
    ctx = ExecutionContext(ExecutionConfig(max_steps=0), PolicyPipeline([breaker]), ledger=ledger)
    ran: list[int] = []
    assert ctx.wrap_llm_call(lambda: ran.append(1)) is Decision.HALT
    assert ran == []
    assert ctx.snapshot().trip is not None
    assert ctx.snapshot().trip.reason == "steps"  # type: ignore[union-attr]
    assert breaker.state is CircuitState.HALF_OPEN
    assert _allowed(breaker), "the ledger's denial must give the probe slot back"


def test_breaker_in_a_context_feeds_outcomes(clock: FakeClock) -> None:
    breaker = CircuitBreaker(failure_threshold=2, recovery_timeout=10.0, clock=clock)
    ctx = ExecutionContext(pipeline=PolicyPipeline([breaker]), ledger=LocalLedger())

    def boom() -> None:
        raise ConnectionError("endpoint down")

    for _ in range(2):
        with pytest.raises(ConnectionError):
            ctx.wrap_llm_call(boom)
    assert breaker.state is CircuitState.OPEN
    calls: list[int] = []
    assert ctx.wrap_llm_call(lambda: calls.append(1)) is Decision.HALT
    assert calls == []
    clock.advance(10.0)
    assert ctx.wrap_llm_call(lambda: calls.append(1)) is Decision.ALLOW
    assert calls == [1]
    assert breaker.state is CircuitState.CLOSED


def test_late_success_does_not_close_an_open_circuit(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    early = PolicyContext()
    assert breaker.check(early).allowed  # sent while CLOSED
    _open(breaker)
    breaker.on_success(early)  # its success arrives after the circuit opened
    assert breaker.state is CircuitState.OPEN
    assert not _allowed(breaker)
    breaker.record_success()
    assert breaker.state is CircuitState.OPEN
    assert breaker.failure_count == 3
    clock.advance(30.0)
    assert breaker.state is CircuitState.HALF_OPEN


def test_late_success_does_not_close_a_half_open_circuit(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    early = PolicyContext()
    assert breaker.check(early).allowed  # sent while CLOSED
    _open(breaker)
    clock.advance(30.0)
    probe = PolicyContext()
    assert breaker.check(probe).allowed
    breaker.on_success(early)  # not the probe: it must not count
    assert breaker.state is CircuitState.HALF_OPEN
    assert not _allowed(breaker)


def test_reset_closes(breaker: CircuitBreaker) -> None:
    _open(breaker)
    breaker.reset()
    assert breaker.state is CircuitState.CLOSED
    assert breaker.failure_count == 0
    assert _allowed(breaker)


def test_zero_recovery_timeout_goes_straight_to_half_open(clock: FakeClock) -> None:
    breaker = CircuitBreaker(failure_threshold=1, recovery_timeout=0, clock=clock)
    breaker.record_failure()
    assert breaker.state is CircuitState.HALF_OPEN
    assert _allowed(breaker)
    assert not _allowed(breaker)


# -- concurrency ---------------------------------------------------------------


@pytest.mark.parametrize("round_", range(10))
def test_concurrent_half_open_admits_exactly_one_probe(clock: FakeClock, round_: int) -> None:
    breaker = CircuitBreaker(failure_threshold=1, recovery_timeout=1.0, clock=clock)
    breaker.record_failure()
    clock.advance(1.0)
    threads = 16
    barrier = threading.Barrier(threads)

    def attempt(_: int) -> bool:
        context = PolicyContext()
        barrier.wait(timeout=10)
        return breaker.check(context).allowed

    with ThreadPoolExecutor(max_workers=threads) as pool:
        results = list(pool.map(attempt, range(threads)))
    assert sum(results) == 1
    assert breaker.state is CircuitState.HALF_OPEN


def test_concurrent_failures_open_once(clock: FakeClock) -> None:
    breaker = CircuitBreaker(failure_threshold=50, recovery_timeout=1.0, clock=clock)
    barrier = threading.Barrier(8)

    def fail(_: int) -> None:
        barrier.wait(timeout=10)
        for _ in range(10):
            breaker.record_failure()

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(fail, range(8)))
    # Exactly the threshold is counted; failures arriving once OPEN are late
    # outcomes and neither count nor restart the recovery timeout.
    assert breaker.failure_count == 50
    assert breaker.state is CircuitState.OPEN


# -- model-based -----------------------------------------------------------------


class ReferenceBreaker:
    """The documented state machine, without locks."""

    def __init__(self, threshold: int, timeout: float, probe_ttl_s: float | None = None) -> None:
        self.threshold = threshold
        self.timeout = timeout
        self.probe_ttl_s = max(timeout, 60.0) if probe_ttl_s is None else probe_ttl_s
        self.state = CircuitState.CLOSED
        self.failures = 0
        self.opened_at = 0.0
        self.probe: object | None = None
        self.probe_expires = 0.0

    def advance(self, now: float) -> None:
        if self.state is CircuitState.OPEN and now - self.opened_at >= self.timeout:
            self.state = CircuitState.HALF_OPEN
            self.probe = None

    def check(self, now: float, owner: object) -> bool:
        self.advance(now)
        if self.state is CircuitState.CLOSED:
            return True
        if self.state is CircuitState.HALF_OPEN and (
            self.probe is None or now >= self.probe_expires
        ):
            self.probe = owner
            self.probe_expires = now + self.probe_ttl_s
            return True
        return False

    def _is_probe(self, owner: object | None) -> bool:
        if self.state is not CircuitState.HALF_OPEN:
            return True
        return owner is None or owner is self.probe

    def success(self, now: float, owner: object | None = None) -> None:
        self.advance(now)
        if self.state is CircuitState.OPEN or not self._is_probe(owner):
            return
        self.failures = 0
        self.state = CircuitState.CLOSED
        self.probe = None

    def failure(self, now: float, owner: object | None = None) -> None:
        self.advance(now)
        if self.state is CircuitState.OPEN or not self._is_probe(owner):
            return
        self.failures += 1
        if self.state is CircuitState.HALF_OPEN or self.failures >= self.threshold:
            self.state = CircuitState.OPEN
            self.opened_at = now
        self.probe = None

    def abandon(self, owner: object) -> None:
        if self.probe is owner:
            self.probe = None


class BreakerMachine(RuleBasedStateMachine):
    calls = Bundle("calls")

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(0.0)
        self.breaker = CircuitBreaker(clock=self.clock)
        self.model = ReferenceBreaker(5, 60.0)
        self.denied_while_open_since: float | None = None
        # Probes granted in HALF_OPEN and not yet resolved: owner -> expiry.
        self.in_flight: dict[int, float] = {}

    @initialize(
        threshold=st.integers(1, 4),
        timeout=st.sampled_from([0.0, 1.0, 5.0, 30.0]),
        probe_ttl_s=st.sampled_from([None, 0.5, 5.0, 45.0]),
    )
    def build(self, threshold: int, timeout: float, probe_ttl_s: float | None) -> None:
        self.breaker = CircuitBreaker(threshold, timeout, probe_ttl_s=probe_ttl_s, clock=self.clock)
        self.model = ReferenceBreaker(threshold, timeout, probe_ttl_s)

    def _resolve(self, owner: object | None) -> None:
        if owner is None or self.model.state is not CircuitState.HALF_OPEN:
            self.in_flight.clear()
        else:
            self.in_flight.pop(id(owner), None)

    @rule(target=calls)
    def check(self) -> PolicyContext:
        context = PolicyContext()
        was_open = self.model.state is CircuitState.OPEN
        opened_at = self.model.opened_at
        expected = self.model.check(self.clock.now, context)
        decision = self.breaker.check(context)
        assert decision.allowed == expected
        if was_open and self.clock.now - opened_at < self.model.timeout:
            assert not decision.allowed, "OPEN must deny until the recovery timeout"
        if not decision.allowed:
            assert decision.trip_reason == "circuit_open"
        if decision.allowed and self.model.state is CircuitState.HALF_OPEN:
            now = self.clock.now
            live = [e for e in self.in_flight.values() if e > now]
            assert not live, "a second probe while one is in flight and unexpired"
            self.in_flight[id(context)] = now + self.model.probe_ttl_s
        return context

    @rule()
    def success(self) -> None:
        self.model.success(self.clock.now)
        self.breaker.record_success()
        self._resolve(None)

    @rule()
    def failure(self) -> None:
        self.model.failure(self.clock.now)
        self.breaker.record_failure()
        self._resolve(None)

    @rule(context=calls)
    def outcome_success(self, context: PolicyContext) -> None:
        self.model.success(self.clock.now, context)
        self.breaker.on_success(context)
        self._resolve(context)

    @rule(context=calls)
    def outcome_failure(self, context: PolicyContext) -> None:
        self.model.failure(self.clock.now, context)
        self.breaker.on_failure(context, RuntimeError("boom"))
        self._resolve(context)

    @rule(context=calls)
    def abandon(self, context: PolicyContext) -> None:
        self.model.abandon(context)
        self.breaker.on_abandon(context)
        self.in_flight.pop(id(context), None)

    @rule(seconds=st.sampled_from([0.0, 0.5, 1.0, 4.999, 5.0, 29.0, 30.0, 61.0]))
    def advance_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def same_state(self) -> None:
        self.model.advance(self.clock.now)
        assert self.breaker.state is self.model.state
        assert self.breaker.failure_count == self.model.failures

    @invariant()
    def one_probe_at_most(self) -> None:
        # Whatever happened before, while a probe is out and unexpired no further
        # check is allowed.
        model = self.model
        if (
            model.state is CircuitState.HALF_OPEN
            and model.probe is not None
            and self.clock.now < model.probe_expires
        ):
            assert not self.breaker.check(PolicyContext()).allowed


TestBreakerMachine = BreakerMachine.TestCase
TestBreakerMachine.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)


# -- construction ------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [math.nan, math.inf, -math.inf, -1, 0, True, False, "3", 2.5, None, 10**16],
    ids=repr,
)
def test_bad_failure_threshold_is_rejected_by_name(value: object) -> None:
    with pytest.raises((ValueError, TypeError), match="failure_threshold"):
        CircuitBreaker(failure_threshold=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "value",
    [math.nan, math.inf, -math.inf, -0.5, -1, True, False, "60", None],
    ids=repr,
)
def test_bad_recovery_timeout_is_rejected_by_name(value: object) -> None:
    with pytest.raises((ValueError, TypeError), match="recovery_timeout"):
        CircuitBreaker(recovery_timeout=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(("threshold", "timeout"), [(1, 0), (1, 0.0), (10**6, 86400.5)])
def test_good_arguments_are_accepted(threshold: int, timeout: float) -> None:
    breaker = CircuitBreaker(threshold, timeout)
    assert breaker.failure_threshold == threshold
    assert breaker.recovery_timeout == float(timeout)
    assert breaker.state is CircuitState.CLOSED
