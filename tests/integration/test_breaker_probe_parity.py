"""The half-open probe expires the same way on the in-process and the Redis breaker.

A probe whose caller never reports back holds the slot for ``probe_ttl_s``
(default ``max(recovery_timeout, 60 s)``); then the next call probes, and the
lost probe's late outcome no longer counts. Time moves by hand on both sides.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests._clock import FakeClock
from tests.integration.test_redis_breaker import Kit, _redis_kit
from veronica_otel import CircuitBreaker, CircuitState, PolicyContext


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(redis_url)
    yield conn
    conn.close()


@pytest.fixture(params=["local", "redis"])
def kit_for(request: pytest.FixtureRequest, redis_prefix: str) -> object:
    def make(recovery: float, probe_ttl_s: float | None = None) -> Kit:
        if request.param == "local":
            clock = FakeClock(1000.0)
            breaker = CircuitBreaker(1, recovery, probe_ttl_s=probe_ttl_s, clock=clock)
            return Kit(breaker, clock.advance)
        client: redis.Redis = request.getfixturevalue("client")
        kwargs = {} if probe_ttl_s is None else {"probe_ttl_s": probe_ttl_s}
        return _redis_kit(client, redis_prefix, 1, recovery, **kwargs)

    return make


@pytest.mark.parametrize(
    ("recovery", "ttl", "expected_ttl"), [(5.0, None, 60.0), (30.0, 10.0, 10.0)]
)
def test_a_lost_probe_expires_after_its_ttl(
    kit_for: object, recovery: float, ttl: float | None, expected_ttl: float
) -> None:
    kit: Kit = kit_for(recovery, ttl)  # type: ignore[operator]
    breaker = kit.breaker
    breaker.record_failure()
    kit.advance(recovery)
    lost, rescuer, other = PolicyContext(), PolicyContext(), PolicyContext()
    assert breaker.check(lost).allowed
    kit.advance(expected_ttl - 0.5)
    assert not breaker.check(other).allowed
    kit.advance(0.5)
    assert breaker.check(rescuer).allowed  # the lost probe's slot expired
    assert not breaker.check(other).allowed  # one probe in flight again
    breaker.record_success(lost)  # a late outcome of the lost probe: ignored
    assert breaker.state is CircuitState.HALF_OPEN
    breaker.record_success(rescuer)
    assert breaker.state is CircuitState.CLOSED
