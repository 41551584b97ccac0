"""A hypothesis state machine for the endpoint breaker table.

Random calls that are sent and fail or succeed, calls denied at admission,
new endpoints and the passing of time, on a small table (6 endpoints, swept
down to 4) so it fills often. After every step: the table stays bounded, an
OPEN breaker is the one kept for its endpoint until its recovery window has
passed, a half-open probe out is never forgotten, a denial leaves no breaker
behind, and a breaker that counts failures goes only when nothing that
remembers nothing was left to go first.
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from veronica_otel import CircuitBreaker
from veronica_otel._breaker import CircuitState
from veronica_otel.instrumentors import _breakers

MAX, SWEEP_TO = 6, 4
KEYS = [("openai", f"m{i}") for i in range(14)]
RECOVERY = 10.0
keys = st.sampled_from(KEYS)


class BreakerTableMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.saved = (_breakers._MAX_ENDPOINTS, _breakers._SWEEP_TO)
        _breakers._MAX_ENDPOINTS, _breakers._SWEEP_TO = MAX, SWEEP_TO
        _breakers.configure_endpoint_breakers(
            lambda provider, model: CircuitBreaker(2, RECOVERY, clock=lambda: self.now)
        )
        self.kept: dict[tuple[str, str], CircuitBreaker] = {}  # what must still be there
        self.probes: dict[tuple[str, str], object] = {}

    def teardown(self) -> None:
        _breakers._MAX_ENDPOINTS, _breakers._SWEEP_TO = self.saved
        _breakers.configure_endpoint_breakers(None)

    def _table(self) -> dict[tuple[str, str], CircuitBreaker]:
        return dict(_breakers._breakers)

    def _get(self, key: tuple[str, str]) -> CircuitBreaker:
        before = self._table()
        breaker = _breakers.endpoint_breaker(*key)
        self._judge_evictions(before, key)
        return breaker

    def _judge_evictions(
        self, before: dict[tuple[str, str], Any], new: tuple[str, str] | None
    ) -> None:
        after = self._table()
        gone = [k for k in before if k not in after]
        counting = [k for k in gone if _breakers._rank(before[k]) != 0]
        if counting:  # those that remember nothing went first, all of them
            assert all(_breakers._rank(b) != 0 for k, b in after.items() if k != new)

    @rule(key=keys)
    def sent_and_failed(self, key: tuple[str, str]) -> None:
        breaker = self._get(key)
        probe = object()
        if breaker.check(probe).allowed:
            breaker.record_failure(probe)
            if breaker.state is CircuitState.OPEN and _breakers._breakers.get(key) is breaker:
                self.kept[key] = breaker
                self.probes.pop(key, None)

    @rule(key=keys)
    def sent_and_succeeded(self, key: tuple[str, str]) -> None:
        breaker = self._get(key)
        probe = object()
        if breaker.check(probe).allowed:
            breaker.record_success(probe)

    @rule(key=keys)
    def probe_goes_out(self, key: tuple[str, str]) -> None:
        breaker = self._get(key)
        if breaker.state is CircuitState.HALF_OPEN and key not in self.probes:
            probe = object()
            if breaker.check(probe).allowed and _breakers._breakers.get(key) is breaker:
                self.probes[key] = probe
                self.kept[key] = breaker

    @rule(key=keys)
    def denied_at_admission(self, key: tuple[str, str]) -> None:
        existed = key in _breakers._breakers
        breaker = self._get(key)
        probe = object()
        breaker.check(probe)
        breaker.release_probe(probe)
        before = self._table()
        _breakers.forget_unused(*key, breaker)
        self._judge_evictions(before, None)
        if not existed:
            assert key not in _breakers._breakers  # a denial makes no breaker

    @rule(seconds=st.sampled_from([0.5, 3.0, 9.9, 10.0, 25.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @invariant()
    def bounded(self) -> None:
        assert len(_breakers._breakers) <= MAX

    @invariant()
    def open_and_probing_breakers_are_kept(self) -> None:
        for key, breaker in list(self.kept.items()):
            window_open = breaker._state is CircuitState.OPEN and (
                self.now - breaker._opened_at < RECOVERY
            )
            probing = key in self.probes and breaker._probe_owner is self.probes[key]
            if window_open or probing:
                assert _breakers._breakers.get(key) is breaker, (key, breaker._state)
            else:
                del self.kept[key]
                self.probes.pop(key, None)


BreakerTableMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=60, deadline=None
)
test_breaker_table = BreakerTableMachine.TestCase
