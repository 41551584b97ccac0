"""Late and replayed commits on a real Valkey are counted exactly once (DESIGN G11).

* A call that outlives ``reservation_ttl_s`` keeps its budget held: the
  client's heartbeat renews its reservation, so no other call is admitted
  against it (without the heartbeat, one is: the test's own control).
* A commit queued while the store was down, and replayed after it restarted
  empty, is applied as spend; so is any commit whose reservation record is
  gone. Real ``openai`` calls against FakeLLMServer: its count is the truth.
* A replayed commit, with or without a reservation, counts once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import redis

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext, TripEvent
from veronica_otel._ledger import Level, Limits, Reservation
from veronica_otel._units import NANO_PER_USD, usd_to_nano
from veronica_otel.distributed import LedgerUnavailableError, RedisLedger
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer, RedisServerProcess
from veronica_otel.testing._server import RecordedRequest

CHAT = "/v1/chat/completions"
MODEL = "gpt-4o"


@pytest.fixture
def valkey(redis_binary: str, tmp_path: Path) -> Iterator[RedisServerProcess]:
    """A server of this test's own, without persistence: a restart empties it."""
    server = RedisServerProcess(tmp_path / "valkey", binary=redis_binary, durable=False)
    with server:
        yield server


@pytest.fixture
def oai() -> Iterator[tuple[openai.OpenAI, FakeLLMServer]]:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    try:
        with (
            FakeLLMServer(output_tokens=200) as server,
            openai.OpenAI(base_url=server.openai_base_url, api_key="t", max_retries=0) as client,
        ):
            yield client, server
    finally:
        instrumentor.uninstrument()


def _ledger(server: RedisServerProcess, **kwargs: float) -> RedisLedger:
    client = redis.Redis.from_url(server.url, socket_timeout=2.0, socket_connect_timeout=1.0)
    return RedisLedger(client, fail_open=False, **kwargs)


def _call(client: openai.OpenAI) -> None:
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=200
    )


def _estimate_usd(ledger: RedisLedger, client: openai.OpenAI) -> float:
    """What one call reserves: the denial of a 1 nano-USD chain says it."""
    with (
        pytest.raises(BudgetExceededError) as info,
        ExecutionContext(ExecutionConfig(max_cost_usd=1e-9), chain_id="probe", ledger=ledger),
    ):
        _call(client)
    return info.value.trip.observed


# -- a call outliving the reservation TTL ----------------------------------------------


def _outlive(
    valkey: RedisServerProcess, oai: tuple[openai.OpenAI, FakeLLMServer], beat: bool
) -> int:
    """One slow call (1.6 s, TTL 1 s) under a ceiling of 1.5 reservations, while
    the provider works on it another client keeps asking for one reservation.
    Returns how many times that client was admitted during the slow call."""
    client, server = oai
    ledger = _ledger(valkey, reservation_ttl_s=1.0)
    other = _ledger(valkey, reservation_ttl_s=1.0)
    if not beat:
        ledger.close()  # no heartbeat: as if the holder had frozen
    estimate = _estimate_usd(ledger, client)
    limit = round(estimate * 1.5, 9)
    path = (Level("late", Limits(cost_nano=usd_to_nano(limit))),)
    admitted = []

    def meanwhile(request: RecordedRequest) -> None:
        end = time.monotonic() + 1.6  # the call outlives the TTL: that is the scenario
        while time.monotonic() < end:
            got = other.reserve(path, usd_to_nano(estimate), 0)
            if isinstance(got, Reservation):
                admitted.append(got)
                other.release(path, got)
            else:  # once reaped, the charge is spent: the denial may be sticky
                assert isinstance(got, TripEvent) and (not beat or not got.sticky)
            time.sleep(0.05)  # pacing of the other client's attempts

    server.set_responder(meanwhile)
    with ExecutionContext(ExecutionConfig(max_cost_usd=limit), chain_id="late", ledger=ledger):
        _call(client)
    server.set_responder(None)
    state = ledger.snapshot("late")
    assert server.count(CHAT) == 1
    assert state.reserved_nano == 0 and 0 < state.cost_nano <= usd_to_nano(limit)
    ledger.close()
    return len(admitted)


def test_a_call_outliving_the_reservation_ttl_keeps_its_budget_held(
    valkey: RedisServerProcess, oai: tuple[openai.OpenAI, FakeLLMServer]
) -> None:
    assert _outlive(valkey, oai, beat=True) == 0


def test_without_the_heartbeat_the_reaper_charges_and_hands_nothing_out_again(
    valkey: RedisServerProcess, oai: tuple[openai.OpenAI, FakeLLMServer]
) -> None:
    # The same scenario, heartbeat stopped (a frozen holder): the reaper counts
    # the reservation as spent instead of giving it back, so nothing fits.
    assert _outlive(valkey, oai, beat=False) == 0


def test_the_heartbeat_renews_only_live_reservations(valkey: RedisServerProcess) -> None:
    ledger = _ledger(valkey)
    path = (Level("beat", Limits(cost_nano=NANO_PER_USD)),)
    held = ledger.reserve(path, 10, 0)
    assert isinstance(held, Reservation)
    expiries = ledger.key("beat").replace(":c:beat", ":rz")
    before = ledger.client.zscore(expiries, held.id)
    ledger.client.pexpire(ledger.key("beat"), 5_000)  # as if its last write were long ago
    assert ledger.heartbeat() == 1
    after = ledger.client.zscore(expiries, held.id)
    assert before is not None and after is not None and after >= before
    assert ledger.client.pttl(ledger.key("beat")) > 5_000  # the chain outlives the call
    ledger.commit(path, held, 10, 0)
    assert ledger.heartbeat() == 0
    ledger.close()


# -- an outage with queued commits, then a restart that lost everything --------------------


def test_a_commit_queued_in_an_outage_counts_after_an_empty_restart(
    valkey: RedisServerProcess, oai: tuple[openai.OpenAI, FakeLLMServer]
) -> None:
    client, server = oai
    ledger = _ledger(valkey)
    config = ExecutionConfig(max_cost_usd=0.05)
    fits = 0
    with ExecutionContext(config, chain_id="base", ledger=ledger):
        while True:
            try:
                _call(client)
            except BudgetExceededError:
                break
            fits += 1
    per_call = ledger.snapshot("base").cost_nano // fits
    assert fits >= 4 and per_call * fits == ledger.snapshot("base").cost_nano
    server.reset()

    seen = []

    def store_dies(request: RecordedRequest) -> None:
        seen.append(request)
        if len(seen) == 2:
            valkey.kill()  # the reply is on its way; its commit finds no store

    server.set_responder(store_dies)
    ctx = ExecutionContext(config, chain_id="job", ledger=ledger)
    with ctx:
        _call(client)
        _call(client)
    server.set_responder(None)
    assert ledger.pending == 1  # the second call's commit waits
    valkey.start()  # empty: no persistence
    ledger.client.connection_pool.disconnect()
    ran = 2
    with ctx:
        while True:
            try:
                _call(client)
            except BudgetExceededError:
                break
            ran += 1
    assert ledger.pending == 0
    assert ran == fits == server.count(CHAT)  # not one call more than the ceiling admits
    assert ledger.snapshot("job").cost_nano == per_call * fits  # nothing committed was lost


# -- commits without a record, replays ----------------------------------------------------


def test_a_commit_whose_record_is_gone_is_applied_as_spend(valkey: RedisServerProcess) -> None:
    ledger = _ledger(valkey)
    path = (Level("gone", Limits(cost_nano=NANO_PER_USD)),)
    first = ledger.reserve(path, usd_to_nano(0.5), 0)
    assert isinstance(first, Reservation)
    ledger.client.flushall()  # the record and the chain, lost
    assert ledger.commit(path, first, usd_to_nano(0.7), 0) is None
    assert ledger.snapshot("gone").cost_nano == usd_to_nano(0.7)
    assert ledger.commit(path, first, usd_to_nano(0.7), 0) is None  # replay: once
    assert ledger.snapshot("gone").cost_nano == usd_to_nano(0.7)
    second = ledger.reserve(path, usd_to_nano(0.2), 0)
    assert isinstance(second, Reservation)
    ledger.client.flushall()
    trip = ledger.commit(path, second, usd_to_nano(0.4), 0)  # 1.1: checked, it trips
    assert trip is not None and trip.reason == "cost"
    state = ledger.snapshot("gone")
    assert state.cost_nano == usd_to_nano(1.1) and state.trip == trip


def test_the_issue_case_late_commit_after_a_one_second_ttl(valkey: RedisServerProcess) -> None:
    """1.8 committed against 1.0 before: the slow call's reservation was reaped
    and re-spent, then its late commit was dropped. Now the reaper charges the
    reservation (fail closed): its budget is never handed out again, and the
    late commit replaces the charge with what the call cost, once."""
    ledger = _ledger(valkey, reservation_ttl_s=0)  # expired at once: a frozen holder
    path = (Level("reaped", Limits(cost_nano=NANO_PER_USD)),)
    slow = ledger.reserve(path, usd_to_nano(0.9), 0)
    assert isinstance(slow, Reservation)
    fast = ledger.reserve(path, usd_to_nano(0.9), 0)  # reaps (charges) the slow one
    assert isinstance(fast, TripEvent) and fast.reason == "cost"
    assert ledger.snapshot("reaped").cost_nano == usd_to_nano(0.9)  # charged, not given back
    assert ledger.commit(path, slow, usd_to_nano(0.4), 0) is None
    assert ledger.commit(path, slow, usd_to_nano(0.4), 0) is None  # a replay: once
    state = ledger.snapshot("reaped")
    assert (state.cost_nano, state.reserved_nano) == (usd_to_nano(0.4), 0)


def test_replayed_commits_count_once_with_or_without_a_reservation(
    valkey: RedisServerProcess,
) -> None:
    ledger = _ledger(valkey)
    path = (Level("replayed", Limits(cost_nano=NANO_PER_USD)),)
    held = ledger.reserve(path, usd_to_nano(0.1), 0)
    assert isinstance(held, Reservation)
    valkey.kill()
    ledger.commit(path, held, usd_to_nano(0.1), 0)  # queued
    ledger.commit(path, Reservation("", 0, 0), usd_to_nano(0.2), 0)  # record_usage: queued
    queued = list(ledger._link.pending)
    assert len(queued) == 2
    valkey.start()
    ledger.client.connection_pool.disconnect()
    assert ledger.flush() == 0
    assert ledger.snapshot("replayed").cost_nano == usd_to_nano(0.3)
    for op in queued:  # their replies were lost: the client sends them again
        op.script(op.keys, op.args)
    state = ledger.snapshot("replayed")
    assert (state.cost_nano, state.reserved_nano) == (usd_to_nano(0.3), 0)


def test_record_usage_outside_a_call_is_replay_safe(valkey: RedisServerProcess) -> None:
    ledger = _ledger(valkey)
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0), chain_id="usage", ledger=ledger)
    ctx.record_usage(cost_usd=0.25)
    ids = ledger.client.zrange(ledger.key("usage").replace(":c:usage", ":ad"), 0, -1)
    assert len(ids) == 1  # the commit without a reservation carried an id
    assert ledger.snapshot("usage").cost_nano == usd_to_nano(0.25)


def test_a_call_in_flight_when_the_store_is_lost_stays_held(valkey: RedisServerProcess) -> None:
    a, b = _ledger(valkey), _ledger(valkey)
    path = (Level("inflight", Limits(cost_nano=NANO_PER_USD)),)
    running = a.reserve(path, usd_to_nano(0.6), 0)  # a's call is out at the provider
    assert isinstance(running, Reservation)
    quick = b.reserve(path, usd_to_nano(0.1), 0)
    assert isinstance(quick, Reservation)
    b.commit(path, quick, usd_to_nano(0.1), 0)  # b saw 0.6 held by a
    b.client.flushall()
    denied = b.reserve(path, usd_to_nano(0.5), 0)  # 0.1 + 0.6 (ghost) + 0.5 > 1
    assert isinstance(denied, TripEvent) and not denied.sticky
    assert a.commit(path, running, usd_to_nano(0.6), 0) is None  # no record: applied
    state = b.snapshot("inflight")
    assert (state.cost_nano, state.reserved_nano) == (usd_to_nano(0.7), 0)  # ghost settled
    assert isinstance(b.reserve(path, usd_to_nano(0.3), 0), Reservation)
    assert isinstance(b.reserve(path, 1, 0), TripEvent)


# -- the reaper charges; duplicated reserves --------------------------------------------


def test_a_reserve_delivered_twice_holds_once(valkey: RedisServerProcess) -> None:
    ledger = _ledger(valkey)
    script, sent = ledger._plan.scripts.reserve, []

    def twice(keys: list[str], args: list[str]) -> object:
        sent.append((keys, args))
        script(keys, args)  # a retried request: the store runs it twice
        return script(keys, args)

    ledger._plan.scripts.reserve = twice  # type: ignore[assignment]
    path = (Level("twice", Limits(cost_nano=NANO_PER_USD, steps=5)),)
    held = ledger.reserve(path, usd_to_nano(0.3), 5)
    assert isinstance(held, Reservation)
    state = ledger.snapshot("twice")
    assert (state.reserved_nano, state.reserved_tokens, state.steps) == (usd_to_nano(0.3), 5, 1)
    ledger.commit(path, held, usd_to_nano(0.1), 2)
    script(*sent[0])  # the same reserve once more, after its commit: nothing again
    state = ledger.snapshot("twice")
    assert (state.cost_nano, state.tokens, state.steps) == (usd_to_nano(0.1), 2, 1)
    assert (state.reserved_nano, state.reserved_tokens) == (0, 0)


def test_a_late_release_gives_the_charge_back_once(valkey: RedisServerProcess) -> None:
    ledger = _ledger(valkey, reservation_ttl_s=0)
    path = (Level("unsent", Limits(cost_nano=NANO_PER_USD)),)
    slow = ledger.reserve(path, usd_to_nano(0.7), 3)
    assert isinstance(slow, Reservation)
    assert isinstance(ledger.reserve(path, 0, 0, step=False), Reservation)  # reaps it
    state = ledger.snapshot("unsent")
    assert (state.cost_nano, state.tokens, state.steps) == (usd_to_nano(0.7), 3, 1)
    ledger.release(path, slow)  # it was never sent after all
    ledger.release(path, slow)  # a replay gives nothing back twice
    state = ledger.snapshot("unsent")
    assert (state.cost_nano, state.tokens, state.steps, state.reserved_nano) == (0, 0, 0, 0)


def test_a_charge_replaced_by_a_smaller_commit_is_not_a_loss(valkey: RedisServerProcess) -> None:
    """Another client saw the charge; the late commit lowers the spend below
    its mark. That is no lost store: it neither re-seeds nor reports more."""
    holder, other = _ledger(valkey, reservation_ttl_s=0), _ledger(valkey, reservation_ttl_s=0)
    path = (Level("lowered", Limits(cost_nano=NANO_PER_USD)),)
    slow = holder.reserve(path, usd_to_nano(0.9), 0)
    assert isinstance(slow, Reservation)
    assert isinstance(other.reserve(path, 0, 0, step=False), Reservation)  # charges 0.9
    assert other.snapshot("lowered").cost_nano == usd_to_nano(0.9)
    assert holder.commit(path, slow, usd_to_nano(0.2), 0) is None
    assert other.snapshot("lowered").cost_nano == usd_to_nano(0.2)
    fits = other.reserve(path, usd_to_nano(0.8), 0)  # no re-seed back to 0.9
    assert isinstance(fits, Reservation)
    other.commit(path, fits, usd_to_nano(0.8), 0)
    assert other.snapshot("lowered").cost_nano == NANO_PER_USD


def test_a_reserve_whose_reply_was_lost_is_cancelled_once(valkey: RedisServerProcess) -> None:
    ledger = _ledger(valkey)
    script = ledger._plan.scripts.reserve

    def applied_then_lost(keys: list[str], args: list[str]) -> object:
        script(keys, args)  # the store applied it; the reply never came
        raise redis.ConnectionError("reply lost")

    ledger._plan.scripts.reserve = applied_then_lost  # type: ignore[assignment]
    path = (Level("lost-reply", Limits(cost_nano=NANO_PER_USD)),)
    with pytest.raises(LedgerUnavailableError):
        ledger.reserve(path, usd_to_nano(0.6), 0)
    assert ledger.pending == 1  # its cancel, queued
    ledger._plan.scripts.reserve = script  # type: ignore[assignment]
    state = ledger.snapshot("lost-reply")  # the cancel is replayed first
    assert (state.reserved_nano, state.steps, state.cost_nano) == (0, 0, 0)
    assert ledger.pending == 0
    valkey.kill()  # a store that is down: retries add nothing more to the queue
    for _ in range(5):
        with pytest.raises(LedgerUnavailableError):
            ledger.reserve(path, usd_to_nano(0.1), 0)
    assert ledger.pending == 1


def test_the_store_record_says_how_many_steps_a_carve_holds(valkey: RedisServerProcess) -> None:
    """A grant's carve reserves k steps in one reservation; its record keeps k,
    so a release (or a reaped carve's late release) gives back exactly k, even
    when the settlement names fewer (a cancel, an older client)."""
    ledger = _ledger(valkey, reservation_ttl_s=0)
    path = (Level("carve", Limits(cost_nano=NANO_PER_USD, steps=10)),)
    carve = ledger.reserve(path, usd_to_nano(0.3), 0, steps=3)
    assert isinstance(carve, Reservation)
    assert ledger.snapshot("carve").steps == 3
    ledger.release(path, Reservation(carve.id, carve.cost_nano, 0, 1))
    state = ledger.snapshot("carve")
    assert (state.steps, state.reserved_nano, state.cost_nano) == (0, 0, 0)
    late = ledger.reserve(path, usd_to_nano(0.3), 0, steps=4)
    assert isinstance(late, Reservation)
    assert isinstance(ledger.reserve(path, 0, 0, step=False), Reservation)  # reaps: charged
    state = ledger.snapshot("carve")
    assert (state.steps, state.cost_nano, state.reserved_nano) == (4, usd_to_nano(0.3), 0)
    ledger.release(path, Reservation(late.id, late.cost_nano, 0, 1))  # never sent after all
    state = ledger.snapshot("carve")
    assert (state.steps, state.cost_nano) == (0, 0)
    # A commit gives back at most the record's steps, whatever it asks for.
    used = ledger.reserve(path, usd_to_nano(0.1), 0, steps=2)
    assert isinstance(used, Reservation)
    ledger.commit(
        path, Reservation(used.id, used.cost_nano, 0, 5), usd_to_nano(0.1), 0, release_steps=5
    )
    assert ledger.snapshot("carve").steps == 0
