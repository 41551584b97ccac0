"""RedisCircuitBreaker against a real server: same semantics as CircuitBreaker.

The scenario table runs on the in-process breaker (fake clock) and on the
Redis one, whose clock is the server's: tests "advance" it by moving the
stored timestamps back, never by sleeping. Then: eight processes race for the
half-open probe and exactly one gets it; each operation is one round trip; an
unreachable store fails closed; a corrupted state raises.
"""

from __future__ import annotations

import logging
import re
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.context import ForkServerContext
from typing import Any

import pytest
import redis

from tests._clock import FakeClock
from tests.integration import _redis_workers as workers
from tests.integration.test_redis_ledger import CountingRedis, _spawn
from veronica_otel import (
    CircuitBreaker,
    CircuitState,
    Decision,
    ExecutionContext,
    PolicyContext,
    PolicyPipeline,
)
from veronica_otel.distributed import (
    LedgerCorruptedError,
    LedgerUnavailableError,
    RedisCircuitBreaker,
)


@dataclass
class Kit:
    """A breaker and a way to move its clock forward."""

    breaker: CircuitBreaker | RedisCircuitBreaker
    advance: Callable[[float], None]


@pytest.fixture
def client(redis_url: str) -> Iterator[CountingRedis]:
    counting = CountingRedis.from_url(redis_url)
    yield counting
    counting.close()


def _redis_kit(
    client: redis.Redis, prefix: str, threshold: int, recovery: float, **kwargs: Any
) -> Kit:
    breaker = RedisCircuitBreaker(
        client, "endpoint", threshold, recovery, key_prefix=prefix, fail_open=False, **kwargs
    )

    def advance(seconds: float) -> None:
        # The server's clock cannot move: move the stored instants back instead.
        shift = -round(seconds * 1_000_000)
        for field in ("at", "pe"):
            if client.hexists(breaker.key, field):
                client.hincrby(breaker.key, field, shift)

    return Kit(breaker, advance)


@pytest.fixture(params=["local", "redis"])
def make_kit(request: pytest.FixtureRequest, redis_prefix: str) -> Callable[..., Kit]:
    """Build the same breaker on either side: make_kit(threshold, recovery, **kw)."""

    def make(threshold: int = 3, recovery: float = 30.0, **kwargs: Any) -> Kit:
        if request.param == "local":
            clock = FakeClock(1000.0)

            def advance(seconds: float) -> None:
                clock.now += seconds

            return Kit(CircuitBreaker(threshold, recovery, clock=clock), advance)
        client: CountingRedis = request.getfixturevalue("client")
        return _redis_kit(client, redis_prefix, threshold, recovery, **kwargs)

    return make


def _call() -> PolicyContext:
    return PolicyContext(chain_id="c", operation_name="chat")


# -- the same scenarios on both breakers -------------------------------------------


def test_threshold_failures_open_the_circuit(make_kit: Callable[..., Kit]) -> None:
    breaker = make_kit(3, 30.0).breaker
    assert breaker.check(_call()).allowed
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state is CircuitState.CLOSED
    assert breaker.failure_count == 2
    breaker.record_failure()
    assert breaker.state is CircuitState.OPEN
    denied = breaker.check(_call())
    assert not denied.allowed
    assert (denied.trip_reason, denied.limit, denied.observed) == ("circuit_open", 3.0, 3.0)
    assert re.fullmatch(
        r"circuit open after 3 failures; next probe in (30\.0|29\.9)s", denied.reason
    )


def test_success_resets_the_count_while_closed(make_kit: Callable[..., Kit]) -> None:
    breaker = make_kit(2, 30.0).breaker
    breaker.record_failure()
    breaker.record_success()
    breaker.record_failure()
    assert (breaker.state, breaker.failure_count) == (CircuitState.CLOSED, 1)


def test_half_open_lets_exactly_one_probe_through(make_kit: Callable[..., Kit]) -> None:
    kit = make_kit(1, 30.0)
    breaker = kit.breaker
    breaker.record_failure()
    kit.advance(29.0)
    assert breaker.state is CircuitState.OPEN
    kit.advance(1.0)
    assert breaker.state is CircuitState.HALF_OPEN
    probe, other = _call(), _call()
    assert breaker.check(probe).allowed
    denied = breaker.check(other)
    assert not denied.allowed
    assert denied.reason == "circuit half_open after 1 failures; next probe in 0.0s"
    breaker.record_success(probe)
    assert (breaker.state, breaker.failure_count) == (CircuitState.CLOSED, 0)
    assert breaker.check(other).allowed


def test_failed_probe_opens_again(make_kit: Callable[..., Kit]) -> None:
    kit = make_kit(2, 30.0)
    breaker = kit.breaker
    breaker.record_failure()
    breaker.record_failure()
    kit.advance(30.0)
    probe = _call()
    assert breaker.check(probe).allowed
    breaker.record_failure(probe)
    assert (breaker.state, breaker.failure_count) == (CircuitState.OPEN, 3)
    kit.advance(30.0)
    assert breaker.state is CircuitState.HALF_OPEN


def test_late_outcomes_are_ignored(make_kit: Callable[..., Kit]) -> None:
    kit = make_kit(1, 30.0)
    breaker = kit.breaker
    early = _call()
    assert breaker.check(early).allowed  # sent while CLOSED
    breaker.record_failure()  # another call opens the circuit
    breaker.record_failure(early)  # late: neither counts nor restarts OPEN
    assert (breaker.state, breaker.failure_count) == (CircuitState.OPEN, 1)
    kit.advance(30.0)
    probe = _call()
    assert breaker.check(probe).allowed
    breaker.record_success(early)  # late success: not the probe
    breaker.record_failure(early)
    assert breaker.state is CircuitState.HALF_OPEN
    assert not breaker.check(_call()).allowed  # the probe is still out
    breaker.record_success(probe)
    assert breaker.state is CircuitState.CLOSED


def test_abandoned_probe_frees_the_slot(make_kit: Callable[..., Kit]) -> None:
    kit = make_kit(1, 30.0)
    breaker = kit.breaker
    breaker.record_failure()
    kit.advance(30.0)
    probe, stranger, next_probe = _call(), _call(), _call()
    assert breaker.check(probe).allowed
    breaker.release_probe(stranger)  # not the holder: nothing happens
    assert not breaker.check(_call()).allowed
    breaker.on_abandon(probe)  # a later policy denied the probe's call
    assert breaker.check(next_probe).allowed
    breaker.on_success(next_probe)
    assert breaker.state is CircuitState.CLOSED


def test_owner_none_is_a_hand_managed_probe(make_kit: Callable[..., Kit]) -> None:
    kit = make_kit(1, 30.0)
    breaker = kit.breaker
    breaker.record_failure()
    kit.advance(30.0)
    assert breaker.check().allowed
    assert not breaker.check().allowed
    breaker.record_success()
    assert breaker.state is CircuitState.CLOSED


def test_reset_closes(make_kit: Callable[..., Kit]) -> None:
    breaker = make_kit(1, 30.0).breaker
    breaker.record_failure()
    breaker.reset()
    assert (breaker.state, breaker.failure_count) == (CircuitState.CLOSED, 0)
    assert breaker.policy_type == "circuit_breaker"


# -- what only the shared breaker does ----------------------------------------------


def test_state_is_shared_between_breakers(client: CountingRedis, redis_prefix: str) -> None:
    first = _redis_kit(client, redis_prefix, 2, 30.0).breaker
    second = _redis_kit(client, redis_prefix, 2, 30.0).breaker
    pipeline = PolicyPipeline([first])

    def fail() -> None:
        raise RuntimeError("endpoint down")

    ctx = ExecutionContext(pipeline=pipeline, chain_id=f"b{uuid.uuid4().hex[:6]}")
    for _ in range(2):
        with pytest.raises(RuntimeError):
            ctx.wrap_llm_call(fail)
    assert second.state is CircuitState.OPEN  # another process sees it
    assert ctx.wrap_llm_call(lambda: None) is Decision.HALT


def test_crashed_probers_slot_expires(client: CountingRedis, redis_prefix: str) -> None:
    kit = _redis_kit(client, redis_prefix, 1, 30.0, probe_ttl_s=10.0)
    breaker = kit.breaker
    breaker.record_failure()
    kit.advance(30.0)
    crashed, rescuer = _call(), _call()
    assert breaker.check(crashed).allowed  # its process dies with the slot
    assert not breaker.check(rescuer).allowed
    kit.advance(10.0)
    assert breaker.check(rescuer).allowed  # the slot expired
    breaker.record_success(crashed)  # a late word from the first: ignored
    assert breaker.state is CircuitState.HALF_OPEN
    breaker.record_failure(rescuer)
    assert breaker.state is CircuitState.OPEN


def test_half_open_probe_slot_across_processes(redis_url: str, redis_prefix: str) -> None:
    """Eight processes ask a half-open breaker at once: exactly one may probe."""
    setup = RedisCircuitBreaker.from_url(redis_url, "race", 1, 0.0, key_prefix=redis_prefix)
    setup.record_failure()
    assert setup.state is CircuitState.HALF_OPEN

    def make_args(ctx: ForkServerContext) -> list[tuple[Any, ...]]:
        start = ctx.Barrier(8)
        return [(redis_url, redis_prefix, "race", start)] * 8

    allowed = _spawn(workers.race_probe, make_args)
    assert allowed.count(True) == 1
    assert not setup.check().allowed  # the winner's probe is still out


def test_each_operation_is_one_round_trip(client: CountingRedis, redis_prefix: str) -> None:
    kit = _redis_kit(client, redis_prefix, 1, 30.0)
    breaker = kit.breaker
    breaker.check()  # loads the script
    operations: list[Callable[[], object]] = [
        lambda: breaker.check(_call()),
        breaker.record_failure,
        lambda: breaker.state,
        lambda: breaker.failure_count,
        lambda: breaker.check(_call()),
        breaker.release_probe,
        breaker.record_success,
    ]
    for operation in operations:
        client.commands.clear()
        operation()
        assert client.commands == ["EVALSHA"]
    assert all(client.suppressed)


def test_unreachable_store_fails_closed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("VERONICA_FAIL_OPEN", raising=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"redis://127.0.0.1:{port}/0"
    breaker = RedisCircuitBreaker.from_url(url, "gone", 1, 30.0)
    with caplog.at_level(logging.WARNING, logger="veronica_otel.distributed"):
        denied = breaker.check(_call())
        breaker.record_failure()  # dropped with a warning, never raised
        breaker.record_success(_call())
    assert not denied.allowed
    assert denied.trip_reason == "circuit_open"
    assert f"127.0.0.1:{port}" in denied.reason
    assert sum("unreachable" in r.getMessage() for r in caplog.records) == 1
    with pytest.raises(LedgerUnavailableError):
        _ = breaker.state
    opened = RedisCircuitBreaker.from_url(url, "gone", 1, 30.0, fail_open=True)
    assert opened.check(_call()).allowed


@pytest.mark.parametrize(("field", "value"), [("st", "weird"), ("f", "x"), ("at", "1.5")])
def test_corrupted_state_is_an_error(
    client: CountingRedis, redis_prefix: str, field: str, value: str
) -> None:
    breaker = _redis_kit(client, redis_prefix, 1, 30.0).breaker
    client.hset(breaker.key, field, value)
    with pytest.raises(LedgerCorruptedError) as info:
        breaker.check(_call())
    assert (info.value.key, info.value.field) == (breaker.key, field)


def test_bad_arguments_are_rejected(client: CountingRedis) -> None:
    for kwargs in (
        {"failure_threshold": 0},
        {"recovery_timeout": -1.0},
        {"recovery_timeout": float("inf")},
        {"probe_ttl_s": -1.0},
    ):
        with pytest.raises(ValueError):
            RedisCircuitBreaker(client, "x", **kwargs)
    with pytest.raises(ValueError):
        RedisCircuitBreaker(client, "")


def test_zero_recovery_still_lets_one_probe_at_a_time(
    client: CountingRedis, redis_prefix: str
) -> None:
    breaker = RedisCircuitBreaker(client, "zero", 1, 0.0, key_prefix=redis_prefix)
    breaker.record_failure()
    probe = _call()
    assert breaker.check(probe).allowed
    assert not breaker.check(_call()).allowed  # the slot outlives a zero recovery timeout
    breaker.record_failure(probe)
    assert breaker.check(_call()).allowed  # reopened, and at once half-open again
