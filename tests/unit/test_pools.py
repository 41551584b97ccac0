"""Budget pools on the in-process ledger (issue 15).

A chain's reservation is made in the chain and every one of its pools under
one lock: all fit or nothing is held anywhere. A pool's denial names the pool
and, for a windowed pool, when the window will have freed enough; it stops
the chain and never the pool. Windows slide under an injected clock.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests._clock import FakeClock
from veronica_otel import (
    BudgetExceededError,
    BudgetPool,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    PoolSnapshot,
    TripEvent,
    WrapOptions,
)
from veronica_otel._ledger import (
    DEFAULT_LEDGER,
    Level,
    Limits,
    LocalLedger,
    PoolLevel,
    Reservation,
)
from veronica_otel._pools import MAX_POOLS_PER_CHAIN, parse_window
from veronica_otel._units import nano_to_usd, usd_to_nano

CENT = WrapOptions(cost_estimate_hint=0.01)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1000.0)


@pytest.fixture
def ledger(clock: FakeClock) -> LocalLedger:
    return LocalLedger(clock=clock)


def spend(ctx: ExecutionContext, options: WrapOptions = CENT) -> Decision:
    return ctx.wrap_llm_call(lambda: None, options)


def chain(ledger: LocalLedger, *pools: BudgetPool, max_cost_usd: float = 10.0) -> ExecutionContext:
    # No waiting for room: a hold these tests make is settled by the same thread.
    config = ExecutionConfig(max_cost_usd=max_cost_usd, reservation_wait_s=0)
    return ExecutionContext(config, ledger=ledger, pools=list(pools))


# -- arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30.0), ("15m", 900.0), ("1h", 3600.0), ("1d", 86400.0), ("30d", 2_592_000.0),
     (" 1.5h ", 5400.0), (90, 90.0), (2.5, 2.5), (None, None)],
)  # fmt: skip
def test_windows_parse(text: str | float | None, seconds: float | None) -> None:
    assert parse_window(text) == seconds


@pytest.mark.parametrize(
    ("kwargs", "error", "names"),
    [
        ({"max_cost_usd": math.nan}, ValueError, "max_cost_usd"),
        ({"max_cost_usd": math.inf}, ValueError, "max_cost_usd"),
        ({"max_cost_usd": -1.0}, ValueError, "max_cost_usd"),
        ({"max_cost_usd": True}, ValueError, "max_cost_usd"),
        ({"max_cost_usd": "5"}, TypeError, "max_cost_usd"),
        ({"max_cost_usd": 1e12}, ValueError, "max_cost_usd"),
        ({"max_steps": -1}, ValueError, "max_steps"),
        ({"max_steps": 1.5}, ValueError, "max_steps"),
        ({"max_steps": False}, ValueError, "max_steps"),
        ({"max_steps": 10**16}, ValueError, "max_steps"),
        ({"max_tokens": -3}, ValueError, "max_tokens"),
        ({"max_tokens": "9"}, TypeError, "max_tokens"),
        ({"window": 0}, ValueError, "window"),
        ({"window": "0s"}, ValueError, "window"),
        ({"window": -60}, ValueError, "window"),
        ({"window": math.nan}, ValueError, "window"),
        ({"window": math.inf}, ValueError, "window"),
        ({"window": 0.2}, ValueError, "window"),
        ({"window": "400d"}, ValueError, "window"),
        ({"window": "1w"}, ValueError, "window"),
        ({"window": "h"}, ValueError, "window"),
        ({"window": "-1h"}, ValueError, "window"),
        ({"window": True}, TypeError, "window"),
        ({"window": [60]}, TypeError, "window"),
        ({"ledger": object()}, TypeError, "ledger"),
    ],
)
def test_bad_pool_arguments_name_the_argument(
    kwargs: dict[str, object], error: type[Exception], names: str
) -> None:
    with pytest.raises(error, match=names):
        BudgetPool("tenant:acme", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "a b", "x" * 129, "tenant{acme}", "é", "a\nb"])
def test_bad_pool_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="name"):
        BudgetPool(name, max_steps=1)


def test_a_pool_name_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="name"):
        BudgetPool(42)  # type: ignore[arg-type]


def test_pool_defaults_to_the_default_ledger_chains_use() -> None:
    pool = BudgetPool("user:alice@example.com/eu", max_cost_usd=5, window="1h")
    assert pool.ledger is DEFAULT_LEDGER
    assert ExecutionContext(pools=[pool]).pools == (pool,)
    assert pool.level == PoolLevel(
        "user:alice@example.com/eu", Limits(cost_nano=usd_to_nano(5.0)), 3600.0, 60.0
    )
    assert pool.window_s == 3600.0 and pool.max_cost_usd == 5.0
    assert "user:alice" in repr(pool)


def test_a_pool_on_another_ledger_is_refused_naming_both(ledger: LocalLedger) -> None:
    pool = BudgetPool("tenant:acme", max_steps=3, ledger=ledger)
    with pytest.raises(ValueError, match="tenant:acme") as refused:
        ExecutionContext(pools=[pool])  # the chain is on the default ledger
    assert repr(ledger) in str(refused.value) and repr(DEFAULT_LEDGER) in str(refused.value)


def test_chain_pools_argument_is_checked(ledger: LocalLedger) -> None:
    pool = BudgetPool("p", max_steps=3, ledger=ledger)
    with pytest.raises(TypeError, match="pools"):
        ExecutionContext(ledger=ledger, pools=pool)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pools"):
        ExecutionContext(ledger=ledger, pools=["p"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="twice"):
        ExecutionContext(ledger=ledger, pools=[pool, BudgetPool("p", ledger=ledger)])
    many = [BudgetPool(f"p{i}", ledger=ledger) for i in range(MAX_POOLS_PER_CHAIN + 1)]
    with pytest.raises(ValueError, match="at most"):
        ExecutionContext(ledger=ledger, pools=many)


# -- one atomic step --------------------------------------------------------------------------


def test_a_call_that_fits_the_chain_but_not_the_pool_holds_nothing(ledger: LocalLedger) -> None:
    roomy = BudgetPool("roomy", max_cost_usd=1.0, max_steps=100, ledger=ledger)
    tight = BudgetPool("tight", max_cost_usd=0.005, ledger=ledger)
    with chain(ledger, roomy, tight) as ctx:
        with pytest.raises(BudgetExceededError) as denied:
            ctx.begin_call(options=CENT)
        assert denied.value.pool == "tight"
        assert denied.value.reason == "cost"
        assert denied.value.retry_after_s is None  # a lifetime pool never frees
        # Nothing anywhere: not in the chain, not in the pool that had room.
        state = ledger.snapshot(ctx.chain_id)
        assert (state.reserved_nano, state.steps, state.cost_nano) == (0, 0, 0)
        for pool in (roomy, tight):
            assert pool.snapshot() == PoolSnapshot(name=pool.name)


def test_a_chain_denial_holds_nothing_in_the_pools(ledger: LocalLedger) -> None:
    pool = BudgetPool("p", max_cost_usd=1.0, max_steps=10, ledger=ledger)
    with chain(ledger, pool, max_cost_usd=0.005) as ctx:
        assert spend(ctx) is Decision.HALT
        assert ctx.trip is not None and ctx.trip.pool is None
    assert pool.snapshot() == PoolSnapshot(name="p")


def test_ledger_reserve_commit_release_settle_every_pool(ledger: LocalLedger) -> None:
    a = BudgetPool("a", max_cost_usd=1.0, window="1h", ledger=ledger).level
    b = BudgetPool("b", max_tokens=1000, ledger=ledger).level
    path = (Level("c", Limits(cost_nano=10**9)),)
    held = ledger.reserve(path, 300, 40, pools=(a, b))
    assert not isinstance(held, BudgetExceededError) and held.pools == (a, b)  # type: ignore[union-attr]
    snap = ledger.pool_snapshot(a)
    assert (snap.reserved_cost_usd, snap.reserved_tokens, snap.reserved_steps) == (3e-7, 40, 1)
    ledger.commit(path, held, 100, 25)  # type: ignore[arg-type]
    for level in (a, b):
        snap = ledger.pool_snapshot(level)
        assert (snap.cost_usd, snap.tokens, snap.steps) == (1e-7, 25, 1)
        assert (snap.reserved_cost_usd, snap.reserved_tokens, snap.reserved_steps) == (0, 0, 0)
    again = ledger.reserve(path, 300, 40, pools=(a, b))
    ledger.release(path, again)  # type: ignore[arg-type]
    assert ledger.pool_snapshot(b) == PoolSnapshot(name="b", cost_usd=1e-7, steps=1, tokens=25)
    assert ledger.snapshot("c").steps == 1


def test_a_carve_commits_only_the_steps_it_used_in_the_pools(ledger: LocalLedger) -> None:
    level = BudgetPool("p", max_steps=10, ledger=ledger).level
    path = (Level("c", Limits()),)
    held = ledger.reserve(path, 0, 0, steps=5, pools=(level,))
    assert ledger.pool_snapshot(level).reserved_steps == 5
    ledger.commit(path, held, 0, 0, release_steps=3)  # type: ignore[arg-type]
    assert ledger.pool_snapshot(level) == PoolSnapshot(name="p", steps=2)


# -- denial: the chain trips, the pool does not -----------------------------------------------


def test_a_pool_denial_trips_the_chain_and_not_the_pool(ledger: LocalLedger) -> None:
    pool = BudgetPool("tenant:acme", max_steps=3, ledger=ledger)
    with chain(ledger, pool) as first:
        assert [spend(first) for _ in range(3)] == [Decision.ALLOW] * 3
        with pytest.raises(BudgetExceededError) as denied:
            first.begin_call(options=CENT)
        assert denied.value.pool == "tenant:acme" and denied.value.reason == "steps"
        assert denied.value.limit == 3 and denied.value.observed == 4
        assert "pool tenant:acme" in str(denied.value)
        # Sticky on the chain (stored in the ledger) ...
        assert ledger.snapshot(first.chain_id).trip == denied.value.trip
        assert first.trip == denied.value.trip
    # ... while the pool holds no trip: with new limits it admits at once.
    bigger = BudgetPool("tenant:acme", max_steps=5, ledger=ledger)
    with chain(ledger, bigger) as second:
        assert spend(second) is Decision.ALLOW
    with chain(ledger, bigger) as third:
        assert spend(third) is Decision.ALLOW
        assert spend(third) is Decision.HALT
    assert bigger.snapshot().steps == 5
    assert first.trip is not None  # the first chain's trip is its own, like any ceiling's


def test_a_denied_chain_stays_stopped_for_small_calls(ledger: LocalLedger) -> None:
    pool = BudgetPool("p", max_cost_usd=0.015, ledger=ledger)
    with chain(ledger, pool) as ctx:
        assert spend(ctx) is Decision.ALLOW
        assert spend(ctx) is Decision.HALT  # 0.02 > 0.015
        assert spend(ctx, WrapOptions(cost_estimate_hint=0.001)) is Decision.HALT  # sticky
    with chain(ledger, pool) as other:  # the pool itself still admits what fits
        assert spend(other, WrapOptions(cost_estimate_hint=0.005)) is Decision.ALLOW


def test_denied_only_by_in_flight_reservations_is_not_a_trip(ledger: LocalLedger) -> None:
    pool = BudgetPool("p", max_cost_usd=0.03, window="1m", ledger=ledger)
    with chain(ledger, pool) as holder, chain(ledger, pool) as ctx:
        held = holder.begin_call(options=WrapOptions(cost_estimate_hint=0.025))
        with pytest.raises(BudgetExceededError) as denied:
            ctx.begin_call(options=CENT)  # fits the committed spend (0), not beside the hold
        assert denied.value.pool == "p" and not denied.value.trip.sticky
        assert ctx.trip is None
        held.finish(sent=False)
        assert spend(ctx) is Decision.ALLOW


def test_children_inherit_their_parents_pools(ledger: LocalLedger) -> None:
    pool = BudgetPool("org", max_steps=4, ledger=ledger)
    with chain(ledger, pool) as parent:
        assert spend(parent) is Decision.ALLOW
        child = parent.spawn_child(ExecutionConfig(max_steps=10))
        assert child.pools == (pool,)
        with child:
            assert [spend(child) for _ in range(4)] == [Decision.ALLOW] * 3 + [Decision.HALT]
        assert child.trip is not None and child.trip.pool == "org"
    assert pool.snapshot().steps == 4
    assert ledger.snapshot(parent.chain_id).steps == 4  # the child's steps count in the parent


def test_usage_reported_outside_a_call_counts_in_the_pools(ledger: LocalLedger) -> None:
    pool = BudgetPool("p", max_cost_usd=1.0, ledger=ledger)
    with chain(ledger, pool) as ctx:
        ctx.record_usage(cost_usd=0.25, input_tokens=10, output_tokens=5)
    assert pool.snapshot() == PoolSnapshot(name="p", cost_usd=0.25, tokens=15)


def test_wrapped_calls_commit_what_they_report_into_the_pool(ledger: LocalLedger) -> None:
    pool = BudgetPool("p", max_cost_usd=1.0, max_tokens=10_000, ledger=ledger)
    with chain(ledger, pool) as ctx:

        def call() -> None:
            ctx.record_usage(cost_usd=0.004, input_tokens=100, output_tokens=20)

        assert ctx.wrap_llm_call(call, CENT) is Decision.ALLOW
    assert pool.snapshot() == PoolSnapshot(name="p", cost_usd=0.004, steps=1, tokens=120)


def test_a_unpriced_chain_under_a_priced_pool_prices_its_calls(ledger: LocalLedger) -> None:
    pool = BudgetPool("p", max_cost_usd=1.0, ledger=ledger)
    ctx = ExecutionContext(ledger=ledger, pools=[pool])  # no chain cost ceiling
    assert ctx.has_cost_ceiling
    with ctx:
        handle = ctx.begin_call(options=WrapOptions(model="gpt-4o-mini", max_tokens=100))
        assert handle.reservation.cost_nano > 0  # the worst case, reserved in the pool
        assert pool.snapshot().reserved_cost_usd > 0
        handle.finish(sent=False)


# -- windows ----------------------------------------------------------------------------------


def test_a_two_second_window_refuses_then_admits_after_it_slides(
    ledger: LocalLedger, clock: FakeClock
) -> None:
    pool = BudgetPool("burst", max_cost_usd=0.03, window="2s", ledger=ledger)
    with chain(ledger, pool) as first:
        assert spend(first) is Decision.ALLOW  # t = 1000.0
        clock.advance(0.5)
        assert spend(first) is Decision.ALLOW  # t = 1000.5
        clock.advance(0.5)
        assert spend(first) is Decision.ALLOW  # t = 1001.0: 0.03 within 2 s
        with pytest.raises(BudgetExceededError) as denied:
            first.begin_call(options=CENT)
    # The oldest cent leaves at 1002.0: one second from now.
    assert denied.value.retry_after_s == pytest.approx(1.0, abs=1e-6)
    assert denied.value.retry_after_s >= 1.0
    with chain(ledger, pool) as early:
        clock.advance(0.999)
        assert spend(early) is Decision.HALT
        assert early.trip is not None
        assert early.trip.retry_after_s == pytest.approx(0.001, abs=1e-6)
    clock.now = 1002.0
    with chain(ledger, pool) as later:
        assert spend(later) is Decision.ALLOW
        assert spend(later) is Decision.HALT  # one cent freed, one cent spent
    assert pool.snapshot().cost_usd == pytest.approx(0.03)
    clock.advance(2.0)
    assert pool.snapshot() == PoolSnapshot(name="burst", window_s=2.0)


def test_retry_after_covers_every_measure_that_denied(
    ledger: LocalLedger, clock: FakeClock
) -> None:
    pool = BudgetPool("p", max_steps=2, max_cost_usd=0.02, window="10s", ledger=ledger)
    with chain(ledger, pool) as ctx:
        assert spend(ctx) is Decision.ALLOW
        clock.advance(3.0)
        assert spend(ctx) is Decision.ALLOW
        denied = ledger.reserve(ctx._state.path, usd_to_nano(0.02), 0, pools=(pool.level,))
    assert isinstance(denied, TripEvent) and denied.pool == "p"
    assert denied.reason == "steps"
    # One step frees at 1010 (7 s), but the cost needs both cents gone: 1013.
    assert denied.retry_after_s == pytest.approx(10.0, abs=1e-6)


def test_a_call_bigger_than_the_window_has_no_retry_time(ledger: LocalLedger) -> None:
    pool = BudgetPool("p", max_cost_usd=0.01, window="1m", ledger=ledger)
    with chain(ledger, pool) as ctx, pytest.raises(BudgetExceededError) as denied:
        ctx.begin_call(options=WrapOptions(cost_estimate_hint=0.02))
    assert denied.value.retry_after_s is None


def test_new_limits_apply_from_the_next_call(ledger: LocalLedger, clock: FakeClock) -> None:
    """A hot reload makes a new level; the spend already in the pool is kept."""
    name = "tenant:acme"
    with chain(ledger, BudgetPool(name, max_cost_usd=0.05, window="1h", ledger=ledger)) as a:
        assert [spend(a) for _ in range(3)] == [Decision.ALLOW] * 3
    lowered = BudgetPool(name, max_cost_usd=0.03, window="1h", ledger=ledger)
    with chain(ledger, lowered) as b:
        assert spend(b) is Decision.HALT
    # A longer window keeps the spend it held (re-bucketed) ...
    longer = BudgetPool(name, max_cost_usd=0.04, window="1d", ledger=ledger)
    assert longer.snapshot().cost_usd == pytest.approx(0.03)  # now a day's window
    clock.advance(3600.0)  # past the old window, inside the new one
    assert longer.snapshot().cost_usd == pytest.approx(0.03)
    with chain(ledger, longer) as c:
        assert spend(c) is Decision.ALLOW
        assert spend(c) is Decision.HALT
    # ... and a lifetime budget keeps what the window held.
    lifetime = BudgetPool(name, max_cost_usd=1.0, ledger=ledger)
    assert lifetime.snapshot() == PoolSnapshot(name=name, cost_usd=0.04, steps=4)
    clock.advance(10 * 86400.0)
    assert lifetime.snapshot().cost_usd == pytest.approx(0.04)


def test_same_name_and_ledger_is_one_budget(ledger: LocalLedger) -> None:
    one = BudgetPool("shared", max_steps=2, ledger=ledger)
    two = BudgetPool("shared", max_steps=2, ledger=ledger)
    elsewhere = BudgetPool("shared", max_steps=2, ledger=LocalLedger())
    with chain(ledger, one) as a, chain(ledger, two) as b:
        assert spend(a) is Decision.ALLOW and spend(b) is Decision.ALLOW
        assert spend(b) is Decision.HALT
    assert one.snapshot() == two.snapshot()
    assert elsewhere.snapshot().steps == 0


def test_idle_pools_are_forgotten_past_a_thousand(ledger: LocalLedger, clock: FakeClock) -> None:
    path = (Level("c", Limits()),)
    for i in range(1100):
        level = BudgetPool(f"user:{i}", max_steps=5, window="1m", ledger=ledger).level
        ledger.commit(path, ledger.reserve(path, 0, 0, pools=(level,)), 0, 0)  # type: ignore[arg-type]
    lifetime = BudgetPool("forever", max_steps=5, ledger=ledger).level
    ledger.commit(path, ledger.reserve(path, 0, 0, pools=(lifetime,)), 0, 0)  # type: ignore[arg-type]
    assert len(ledger._pools) == 1101  # all active: none may go
    clock.advance(61.0)  # the first 1100 windows are empty now
    for i in range(1000):
        level = BudgetPool(f"later:{i}", max_steps=5, window="1m", ledger=ledger).level
        ledger.commit(path, ledger.reserve(path, 0, 0, pools=(level,)), 0, 0)  # type: ignore[arg-type]
    assert len(ledger._pools) < 1100  # swept once 2048 were held
    assert ledger.pool_snapshot(lifetime).steps == 1  # lifetime spend is never forgotten
    assert ledger.pool_snapshot(level).steps == 1


def test_a_forked_child_admits_nothing_from_an_inherited_pool(ledger: LocalLedger) -> None:
    pool = BudgetPool("p", max_steps=10, ledger=ledger)
    with chain(ledger, pool) as ctx:
        assert spend(ctx) is Decision.ALLOW
    ledger.after_fork_in_child(4242)  # what os.register_at_fork runs in the child
    with (
        chain(ledger, pool) as child_chain,
        pytest.raises(BudgetExceededError, match=r"os\.fork.*RedisLedger") as denied,
    ):
        child_chain.begin_call(options=CENT)
    assert denied.value.pool == "p"
    fresh = BudgetPool("made-after-fork", max_steps=1, ledger=ledger)
    with chain(ledger, fresh) as ctx2:
        assert spend(ctx2) is Decision.ALLOW


# -- threads ----------------------------------------------------------------------------------


def test_eight_threads_on_one_pool_spend_exactly_its_steps(ledger: LocalLedger) -> None:
    pool = BudgetPool("p", max_steps=1000, max_cost_usd=7.77, ledger=ledger)
    admitted: list[int] = []
    start = threading.Barrier(8)

    def worker() -> None:
        count = 0
        with chain(ledger, pool, max_cost_usd=100.0) as ctx:
            start.wait()
            while spend(ctx) is Decision.ALLOW:
                count += 1
        admitted.append(count)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(admitted) == 777  # $7.77 in cents: exact, whatever the interleaving
    snap = pool.snapshot()
    assert (snap.steps, snap.reserved_steps, snap.reserved_cost_usd) == (777, 0, 0.0)


# -- spans ------------------------------------------------------------------------------------


@pytest.fixture
def spans(span_exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    yield span_exporter


def test_the_trip_event_names_the_pool(ledger: LocalLedger, spans: InMemorySpanExporter) -> None:
    pool = BudgetPool("tenant:acme", max_steps=1, window="1m", ledger=ledger)
    with chain(ledger, pool) as ctx:
        spend(ctx)
        spend(ctx)
    trips = [e for s in spans.get_finished_spans() for e in s.events if e.name == "veronica.trip"]
    assert len(trips) == 1
    attributes = dict(trips[0].attributes or {})
    assert attributes["veronica.pool"] == "tenant:acme"
    assert attributes["veronica.trip.retry_after_s"] == pytest.approx(60.0)


# -- grants to downstream services ------------------------------------------------------------


def test_a_grant_carves_no_more_than_the_pool_has_and_settles_there(ledger: LocalLedger) -> None:
    from veronica_otel._grants import Spent
    from veronica_otel._remote import issue_grant, settle

    pool = BudgetPool("tenant:acme", max_cost_usd=0.3, max_steps=4, ledger=ledger)
    with chain(ledger, pool, max_cost_usd=1.0) as ctx:
        assert spend(ctx) is Decision.ALLOW  # 0.01 and one step in the pool
        grant, carve = issue_grant(ctx, audience="svc")
        assert carve is not None
        # The chain has 0.99 left, the pool 0.29 and three steps: the pool's room.
        assert (grant.cost_nano, grant.steps) == (usd_to_nano(0.29), 3)
        snap = pool.snapshot()
        assert (snap.reserved_cost_usd, snap.reserved_steps) == (pytest.approx(0.29), 3)
        settle(carve, Spent(cost_nano=usd_to_nano(0.05), tokens=9, steps=2))
    assert pool.snapshot() == PoolSnapshot(
        name="tenant:acme", cost_usd=pytest.approx(0.06), steps=3, tokens=9
    )


# -- the ledger against a plain reference -----------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from([0.0, 0.01, 0.5, 1.0, 3.3, 9.99, 10.0]),  # advance the clock
            st.integers(1, 400),  # the call's reservation (nano)
            st.integers(0, 100),  # percent of it actually spent
            st.booleans(),  # settle it now (else it stays in flight)
        ),
        max_size=60,
    )
)
def test_a_windowed_pool_admits_exactly_what_fits(ops: list[tuple[float, int, int, bool]]) -> None:
    """Admission against a reference list of (time, amount) commits and held amounts.

    Never more than the limit within any window (exact reference, reservations
    included); never a denial when even the reference counted a bucket late
    leaves room; after a windowed denial, waiting retry_after_s admits it.
    """
    clock = FakeClock(10.0)
    ledger = LocalLedger(clock=clock)
    limit, window = 1000, 10.0
    level = PoolLevel("p", Limits(cost_nano=limit), window, window / 60)
    path = (Level("c", Limits()),)
    committed: list[tuple[float, int]] = []
    in_flight: list[tuple[Reservation, int]] = []

    def exact(slack: float = 0.0) -> int:
        return sum(a for t, a in committed if clock.now < t + window + slack)

    for dt, amount, percent, settle_now in ops:
        clock.advance(dt)
        held = sum(r.cost_nano for r, _ in in_flight)
        got = ledger.reserve(path, amount, 0, step=False, pools=(level,))
        if isinstance(got, TripEvent):
            assert got.pool == "p"
            assert exact(window / 60 * (1 + 1e-9)) + held + amount > limit  # no needless denial
            if got.retry_after_s is not None:
                start = clock.now
                clock.now = start + got.retry_after_s
                again = ledger.reserve(path, amount, 0, step=False, pools=(level,))
                assert isinstance(again, Reservation)  # waiting that long was enough
                ledger.release(path, again)
        else:
            assert exact() + held + amount <= limit  # never over, within any window
            in_flight.append((got, amount * percent // 100))
        if settle_now and in_flight:
            reservation, actual = in_flight.pop(0)
            ledger.commit(path, reservation, actual, 0)
            if actual:
                committed.append((clock.now, actual))
        snap = ledger.pool_snapshot(level)
        assert snap.reserved_cost_usd == nano_to_usd(sum(r.cost_nano for r, _ in in_flight))
