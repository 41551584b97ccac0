"""A chain on a real Valkey never starts again at zero (DESIGN G11).

Each test loses the store's copy of a chain a different way: a restart
without persistence, FLUSHALL, DEL and EXPIRE by hand, an older copy restored
(DUMP/RESTORE), eviction under ``allkeys-lru``. Every time the client that
saw the chain re-seeds it from its marks: what was committed is still
counted (exactly once across clients), a trip survives, and the total
dispatched spend (FakeLLMServer's count, for real ``openai`` calls) stays
within the ceiling. Also: the warning for a store that can lose keys, the
fail-open fallback seeded from the marks, ``on_loss="fail"`` and the override
of a chain that does not exist.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import redis

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext, TripEvent
from veronica_otel._ledger import Level, Limits, Reservation
from veronica_otel._units import NANO_PER_USD, usd_to_nano
from veronica_otel.cli import main as cli_main
from veronica_otel.cli._override import apply_override
from veronica_otel.distributed import LedgerLostError, RedisLedger
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer, RedisServerProcess

CHAT = "/v1/chat/completions"
ONE_USD = Limits(cost_nano=NANO_PER_USD)


@pytest.fixture
def valkey(redis_binary: str, tmp_path: Path) -> Iterator[RedisServerProcess]:
    """A server of this test's own, without persistence: a restart empties it."""
    server = RedisServerProcess(tmp_path / "valkey", binary=redis_binary, durable=False)
    with server:
        yield server


def _ledger(server: RedisServerProcess, on_loss: str = "reseed") -> RedisLedger:
    client = redis.Redis.from_url(server.url, socket_timeout=2.0, socket_connect_timeout=1.0)
    return RedisLedger(client, fail_open=False, on_loss=on_loss)


def _restart(server: RedisServerProcess, *ledgers: RedisLedger) -> None:
    server.restart()
    for ledger in ledgers:  # drop the sockets to the old process
        ledger.client.connection_pool.disconnect()


def _spend(ledger: RedisLedger, path: tuple[Level, ...], usd: float) -> None:
    reservation = ledger.reserve(path, usd_to_nano(usd), 0)
    assert isinstance(reservation, Reservation), reservation
    assert ledger.commit(path, reservation, usd_to_nano(usd), 0) is None


# -- real calls across a restart ---------------------------------------------------------


@pytest.fixture
def oai() -> Iterator[tuple[openai.OpenAI, FakeLLMServer]]:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    try:
        with (
            FakeLLMServer(input_tokens=1000, output_tokens=200) as server,
            openai.OpenAI(base_url=server.openai_base_url, api_key="t", max_retries=0) as client,
        ):
            yield client, server
    finally:
        instrumentor.uninstrument()


def _call(client: openai.OpenAI) -> None:
    client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=200
    )


def _calls_until_denied(ctx: ExecutionContext, client: openai.OpenAI, limit: int = 200) -> int:
    ran = 0
    with ctx:
        for _ in range(limit):
            try:
                _call(client)
            except BudgetExceededError:
                return ran
            ran += 1
    raise AssertionError(f"no denial after {limit} calls")


def test_restart_without_persistence_neither_refunds_spend_nor_lifts_the_trip(
    valkey: RedisServerProcess, oai: tuple[openai.OpenAI, FakeLLMServer]
) -> None:
    client, server = oai
    ledger = _ledger(valkey)
    config = ExecutionConfig(max_cost_usd=0.05)
    # How many calls the ceiling admits, on a chain nothing happens to.
    fits = _calls_until_denied(ExecutionContext(config, chain_id="base", ledger=ledger), client)
    assert fits >= 4
    server.reset()

    ctx = ExecutionContext(config, chain_id="job", ledger=ledger)
    with ctx:
        for _ in range(fits // 2):
            _call(client)
    spent = ledger.snapshot("job").cost_nano
    _restart(valkey, ledger)  # the store comes back empty
    assert ledger.client.keys("*") == []
    rest = _calls_until_denied(ctx, client)
    assert fits // 2 + rest == fits == server.count(CHAT)  # not one call more
    state = ledger.snapshot("job")
    assert state.cost_nano > spent
    assert state.cost_nano <= usd_to_nano(0.05)
    assert state.trip is not None and state.trip.reason == "cost"

    _restart(valkey, ledger)  # empty again: the trip still holds ...
    with pytest.raises(BudgetExceededError), ctx:
        _call(client)
    fresh = ExecutionContext(config, chain_id="job", ledger=ledger)
    with pytest.raises(BudgetExceededError), fresh:
        _call(client)  # ... for a new context on the chain too (re-seeded)
    assert server.count(CHAT) == fits
    assert ledger.snapshot("job").cost_nano == state.cost_nano


# -- FLUSHALL, DEL, EXPIRE, an older copy -------------------------------------------------


def test_flushall_does_not_hand_the_budget_out_again(valkey: RedisServerProcess) -> None:
    """The issue's case: $1 ceiling, $0.95 spent, store emptied, 10 more $0.10 calls."""
    ledger = _ledger(valkey)
    path = (Level("flushed", ONE_USD),)
    for _ in range(19):
        _spend(ledger, path, 0.05)
    ledger.client.flushall()
    outcomes = [ledger.reserve(path, usd_to_nano(0.10), 0) for _ in range(10)]
    assert all(isinstance(o, TripEvent) for o in outcomes)
    trip = outcomes[0]
    assert isinstance(trip, TripEvent) and trip.reason == "cost" and trip.sticky
    assert ledger.snapshot("flushed").cost_nano == usd_to_nano(0.95)
    ledger.client.flushall()
    again = ledger.reserve(path, usd_to_nano(0.01), 0)  # it would fit: the trip holds
    assert again == trip
    assert ledger.snapshot("flushed").trip == trip


def test_two_clients_reseed_a_deleted_chain_counting_each_spend_once(
    valkey: RedisServerProcess,
) -> None:
    a, b = _ledger(valkey), _ledger(valkey)  # two processes: marks of their own
    path = (Level("twice", ONE_USD),)
    _spend(a, path, 0.30)
    _spend(b, path, 0.20)  # b saw 0.50, a saw 0.30
    a.client.delete(a.key("twice"))
    _spend(a, path, 0.10)  # a re-seeds 0.30, then adds 0.10
    assert a.snapshot("twice").cost_nano == usd_to_nano(0.40)
    _spend(b, path, 0.0)  # b adds only what it saw beyond a: 0.20
    assert b.snapshot("twice").cost_nano == usd_to_nano(0.60)  # exactly 0.5 + 0.1
    for client in (a, b):  # and once more: nothing is counted twice
        _spend(client, path, 0.0)
    assert a.snapshot("twice").cost_nano == usd_to_nano(0.60)


def test_a_chain_lost_under_a_call_never_comes_back_under_its_old_epoch(
    valkey: RedisServerProcess,
) -> None:
    """The reserve that creates a chain names its epoch after its reservation
    id; that call's commit after a flush must not re-create the same epoch, or
    other clients' marks of the old one read as current (their spend lost)."""
    first, other = _ledger(valkey), _ledger(valkey)
    path = (Level("named", ONE_USD),)
    slow = first.reserve(path, usd_to_nano(0.4), 0)  # creates the chain
    assert isinstance(slow, Reservation)
    _spend(other, path, 0.25)  # other saw 0.25 committed
    first.client.flushall()
    assert first.commit(path, slow, usd_to_nano(0.05), 0) is None  # re-seeds from first's marks
    _spend(other, path, 0.0)  # re-seeds what only other saw
    assert other.snapshot("named").cost_nano == usd_to_nano(0.30)


def test_an_expired_key_and_an_older_copy_are_both_repaired(valkey: RedisServerProcess) -> None:
    ledger = _ledger(valkey)
    path = (Level("aged", Limits(cost_nano=NANO_PER_USD, steps=100)),)
    key = ledger.key("aged")
    _spend(ledger, path, 0.20)
    ledger.client.expire(key, 0)  # an expiry, by hand
    assert not ledger.client.exists(key)
    _spend(ledger, path, 0.10)
    assert ledger.snapshot("aged").cost_nano == usd_to_nano(0.30)
    assert ledger.snapshot("aged").steps == 2
    old = ledger.client.dump(key)
    _spend(ledger, path, 0.20)
    ledger.client.restore(key, 0, old, replace=True)  # a backup from before the 0.20
    assert ledger.snapshot("aged").cost_nano == usd_to_nano(0.50)  # never reported lower
    _spend(ledger, path, 0.0)
    raw = ledger.client.hget(key, "c")
    assert raw is not None and int(raw) == usd_to_nano(0.50)
    assert ledger.snapshot("aged").steps == 4


def test_a_snapshot_of_a_lost_chain_never_reports_less(valkey: RedisServerProcess) -> None:
    ledger = _ledger(valkey)
    path = (Level("snap", Limits(steps=2)),)
    for _ in range(3):
        ledger.reserve(path, 0, 0)
    ledger.client.flushall()
    state = ledger.snapshot("snap")
    assert state.steps == 2 and state.trip is not None and state.trip.reason == "steps"


# -- eviction, and the warning ----------------------------------------------------------


def test_eviction_under_allkeys_lru_is_repaired_and_was_warned_about(
    valkey: RedisServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = _ledger(valkey)
    raw = redis.Redis.from_url(valkey.url)
    raw.config_set("maxmemory-policy", "allkeys-lru")
    path = (Level("evicted", ONE_USD),)
    with caplog.at_level(logging.WARNING, "veronica_otel.distributed"):
        _spend(ledger, path, 0.70)
    warnings = [r.getMessage() for r in caplog.records]
    assert any("maxmemory-policy allkeys-lru" in w for w in warnings)
    assert any("no persistence" in w for w in warnings)
    used = int(raw.info("memory")["used_memory"])
    raw.config_set("maxmemory", used + 2_000_000)
    junk = 0
    while raw.exists(ledger.key("evicted")):  # fill memory until our chain goes
        with raw.pipeline(transaction=False) as pipe:
            for _ in range(200):
                pipe.set(f"junk:{junk}", "x" * 1000)
                junk += 1
            pipe.execute()
        assert junk < 200_000, "the chain key was never evicted"
    raw.config_set("maxmemory", 0)
    assert isinstance(ledger.reserve(path, usd_to_nano(0.40), 0), TripEvent)
    assert ledger.snapshot("evicted").cost_nano == usd_to_nano(0.70)


def test_a_store_whose_config_is_disabled_is_tolerated(
    valkey: RedisServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    admin = redis.Redis.from_url(valkey.url)
    admin.execute_command("ACL", "SETUSER", "app", "on", "nopass", "~*", "+@all", "-config")
    url = valkey.url.replace("redis://", "redis://app:x@")
    ledger = RedisLedger.from_url(url, fail_open=False)
    with caplog.at_level(logging.INFO, "veronica_otel.distributed"):
        _spend(ledger, (Level("acl", ONE_USD),), 0.1)
    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert any(level == logging.INFO and "CONFIG is disabled" in m for level, m in messages)
    assert not any(level >= logging.WARNING for level, _ in messages)


# -- fail open, fail closed, override --------------------------------------------------


def test_failing_open_seeds_the_local_ledger_from_the_marks(valkey: RedisServerProcess) -> None:
    ledger = RedisLedger.from_url(valkey.url, fail_open=True)
    path = (Level("open", ONE_USD),)
    _spend(ledger, path, 0.90)
    valkey.kill()
    assert isinstance(ledger.reserve(path, usd_to_nano(0.05), 0), Reservation)
    assert ledger.is_local
    denied = ledger.reserve(path, usd_to_nano(0.10), 0)  # the local ledger knows 0.90
    assert isinstance(denied, TripEvent) and denied.reason == "cost"


def test_on_loss_fail_denies_with_ledger_lost_error(valkey: RedisServerProcess) -> None:
    ledger = _ledger(valkey, on_loss="fail")
    path = (Level("strict", ONE_USD),)
    _spend(ledger, path, 0.95)
    ledger.client.flushall()
    with pytest.raises(LedgerLostError) as info:
        ledger.reserve(path, usd_to_nano(0.01), 0)
    assert "chain strict" in str(info.value)
    assert "the chain is gone" in info.value.lost and "0.95 USD -> 0 USD" in info.value.lost
    assert isinstance(info.value, BudgetExceededError)
    assert ledger.client.keys("*") == []  # nothing was written


def test_a_flush_does_not_lift_a_trip_and_override_of_an_unknown_chain_fails(
    valkey: RedisServerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = _ledger(valkey)
    ctx = ExecutionContext(ExecutionConfig(max_steps=1), chain_id="held", ledger=ledger)
    ctx.begin_call().finish()
    with pytest.raises(BudgetExceededError):
        ctx.begin_call()
    ledger.client.flushall()
    with pytest.raises(BudgetExceededError):
        ctx.begin_call()  # "no trip in the store" is not an override
    args = ["override", "--chain", "nope", "--reason", "x", "--duration", "1m"]
    assert cli_main([*args, "--redis-url", valkey.url]) != 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'nope' does not exist" in err
    assert not ledger.client.exists(ledger.key("nope"))
    # Once a client that knew the chain re-seeds it, the override works and lifts it.
    ExecutionContext(ExecutionConfig(max_steps=1), chain_id="held", ledger=ledger).snapshot()
    with pytest.raises(BudgetExceededError):
        ExecutionContext(ExecutionConfig(max_steps=1), chain_id="held", ledger=ledger).begin_call()
    held = argparse.Namespace(
        chain="held", reason="x", duration=60.0, add_usd=0.0, add_steps=1, redis=valkey.url
    )
    assert apply_override(held) == 0
    assert "lifted a steps trip" in capsys.readouterr().out
    ctx.begin_call().finish()  # lifted by an explicit override


def test_a_chain_lost_twice_counts_its_first_epoch_once(valkey: RedisServerProcess) -> None:
    """The simulation's seed 52 on a real Valkey: the first epoch's spend went
    into the second through one client's marks; once the second is lost too, a
    client still holding marks of the first must not count it again."""
    old, a, b = _ledger(valkey), _ledger(valkey), _ledger(valkey)
    path = (Level("lineage", ONE_USD),)
    _spend(old, path, 0.25)  # old saw epoch 1 with 0.25, then goes quiet
    _spend(a, path, 0.0)  # a saw it too
    a.client.flushall()
    _spend(a, path, 0.15)  # epoch 2: 0.25 re-seeded from a, + 0.15
    _spend(b, path, 0.10)  # b saw epoch 2 at 0.50
    a.client.flushall()
    _spend(b, path, 0.0)  # epoch 3: re-seeded from b (0.50, epoch 1 included)
    _spend(old, path, 0.0)  # old's marks of epoch 1 are absorbed already
    _spend(a, path, 0.0)  # and so are a's of epoch 2
    assert b.snapshot("lineage").cost_nano == usd_to_nano(0.50)
    _spend(old, path, 0.50)  # the rest of the dollar still fits ...
    assert isinstance(old.reserve(path, 1, 0), TripEvent)  # ... and nothing more


def test_a_replay_after_its_chain_expired_counts_again(valkey: RedisServerProcess) -> None:
    """A commit whose reply was lost is remembered as applied with its chain's
    epoch: once the chain expired (and came back from marks that never saw that
    commit), the replay is counted instead of dropped."""
    ledger = _ledger(valkey)
    path = (Level("expired", ONE_USD),)
    _spend(ledger, path, 0.20)
    held = ledger.reserve(path, usd_to_nano(0.30), 0)
    assert isinstance(held, Reservation)
    args: list[Any] = []
    script = ledger._plan.scripts.commit

    def lost_reply(keys: list[str], argv: list[str]) -> Any:
        args[:] = [keys, list(argv)]
        script(keys, argv)  # applied ...
        raise redis.ConnectionError("reply lost")  # ... but its reply never came

    ledger._plan.scripts.commit = lost_reply  # type: ignore[assignment]
    assert ledger.commit(path, held, usd_to_nano(0.30), 0) is None
    assert ledger.pending == 1
    ledger._plan.scripts.commit = script  # type: ignore[assignment]
    ledger._link.pending[0] = ledger._link.pending[0]._replace(script=script)
    ledger.client.delete(ledger.key("expired"))  # the chain expires; `ad` is still there
    assert ledger.flush() == 0  # the replay: re-seeds 0.20 from marks, applies 0.30
    assert ledger.snapshot("expired").cost_nano == usd_to_nano(0.50)
    assert ledger.flush() == 0
    _spend(ledger, path, 0.0)
    assert ledger.snapshot("expired").cost_nano == usd_to_nano(0.50)
