"""One kernel entry for an LLM call: described once (CallSpec), answered once (admit_call)."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace

from veronica_otel import (
    BudgetExceededError,
    BudgetPool,
    ExecutionConfig,
    ExecutionContext,
    _agents,
    agent,
)
from veronica_otel._call import PlainCall
from veronica_otel._call_spec import Admitted, CallSpec
from veronica_otel._clamp import OutputClamp
from veronica_otel._ledger import LocalLedger
from veronica_otel._pricing import PriceTable, UnitPrices, default_price_table
from veronica_otel._units import MAX_COUNT, nano_to_usd

MODEL = "gpt-4o-mini"
BOUND = 40
PRICES = default_price_table().lookup("openai", MODEL)
assert PRICES is not None
LIMIT = PRICES.output_limit(BOUND)  # the most one uncapped call may ask for


def uncapped(choices: int = 1) -> CallSpec:
    return CallSpec("openai", "chat", MODEL, BOUND, None, True, choices)


def cost_of(output: int) -> int:
    assert PRICES is not None
    return PRICES.max_cost_nano(BOUND, output)


@pytest.fixture
def switch_often() -> Iterator[None]:
    # Threads switch every microsecond: a read-then-reserve race shows up.
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


# -- the arithmetic: one place, equal to UnitPrices' own ------------------------------

prices_st = st.builds(
    UnitPrices,
    input=st.integers(0, 10**11),
    output=st.integers(0, 10**11),
    cached_input=st.integers(0, 10**11),
    reasoning=st.integers(0, 10**11),
    max_output=st.one_of(st.none(), st.integers(1, 200_000)),
    context_window=st.one_of(st.none(), st.integers(1, 2_000_000)),
)
tiered_st = st.builds(
    lambda base, tier, threshold: UnitPrices(
        base.input, base.output, base.cached_input, base.reasoning, tiers=((threshold, tier),)
    ),
    prices_st,
    prices_st,
    st.integers(1, 300_000),
)
rooms = st.one_of(st.none(), st.integers(0, 10**13))


@given(
    st.one_of(prices_st, tiered_st),
    st.integers(0, 400_000),
    rooms,
    rooms,
    st.integers(1, 8),
)
def test_a_clamp_buys_what_unit_prices_say_the_room_buys(
    prices: UnitPrices, bound: int, cost_left: int | None, tokens_left: int | None, choices: int
) -> None:
    wi, wo = prices._worst_prices(bound)
    clamp = OutputClamp(bound, wi, wo, True, choices, prices.output_limit(bound))
    clamp.room(cost_left, tokens_left)
    cost, tokens = clamp.size()
    # The same figures by UnitPrices' public methods (what the instrumentors used before).
    affordable: int | None = None
    if cost_left is not None:
        affordable = prices.max_output_tokens_for(cost_left, bound)
    if tokens_left is not None:
        left = max(0, tokens_left - bound)
        affordable = left if affordable is None else min(affordable, left)
    if affordable is None:
        assert clamp.cap is None
        assert (cost, tokens) == (prices.max_cost_nano(bound, 0), bound)
        return
    expected = max(1, min(affordable, prices.output_limit(bound)) // choices)
    assert clamp.cap == expected
    output = min(expected * choices, MAX_COUNT)
    assert (cost, tokens) == (prices.max_cost_nano(bound, output), bound + expected * choices)


def test_a_pool_is_credited_only_when_strictly_tightest() -> None:
    clamp = OutputClamp(10, 0, 0, False, 1, 1000)
    clamp.room(None, 110)
    clamp.room(None, 110, "team")  # as tight as the chain: the chain set it
    clamp.room(None, 500, "wide")
    clamp.size()
    assert (clamp.cap, clamp.pool) == (100, None)
    clamp = OutputClamp(10, 0, 0, False, 1, 1000)
    clamp.room(None, 110)
    clamp.room(None, 60, "team")
    clamp.size()
    assert (clamp.cap, clamp.pool) == (50, "team")


# -- the kernel's one answer ----------------------------------------------------------


def test_a_capped_call_reserves_its_worst_case_and_is_not_clamped() -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        answer = ctx.admit_call(CallSpec("openai", "chat", MODEL, BOUND, 7, True, 3))
        assert isinstance(answer, Admitted)
        assert (answer.cap, answer.clamped, answer.pool, answer.fallback) == (7, None, None, None)
        assert answer.prices == PRICES
        assert answer.handle.reservation.cost_nano == cost_of(21)
        assert answer.handle.reservation.tokens == BOUND + 21
        answer.handle.finish(sent=False)
        assert ctx.snapshot().steps == 0


def test_an_uncapped_call_is_sized_to_the_room_under_the_ledgers_lock() -> None:
    ceiling = cost_of(500)
    with ExecutionContext(ExecutionConfig(max_cost_usd=nano_to_usd(ceiling))) as ctx:
        answer = ctx.admit_call(uncapped(choices=2))
        assert answer.cap == answer.clamped == 250
        assert answer.handle.reservation.cost_nano == cost_of(500) <= ceiling
        answer.handle.finish(sent=False)


def test_a_pool_with_less_room_clamps_and_is_named() -> None:
    ledger = LocalLedger()
    pool = BudgetPool("team", max_cost_usd=nano_to_usd(cost_of(100)), ledger=ledger)
    config = ExecutionConfig(max_cost_usd=1.0)
    with ExecutionContext(config, ledger=ledger, pools=[pool]) as ctx:
        answer = ctx.admit_call(uncapped())
        assert (answer.clamped, answer.pool) == (100, "team")
        answer.handle.finish(sent=False)


def test_an_agents_own_ceiling_clamps_its_uncapped_call() -> None:
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
        agent("writer", config=ExecutionConfig(max_cost_usd=nano_to_usd(cost_of(80)))),
    ):
        answer = ctx.admit_call(uncapped())
        assert answer.clamped == 80
        assert answer.handle.agents is not None and answer.handle.agents[1] == "writer"
        answer.handle.finish(sent=False)


class _CountingLock:
    """The ledger's lock, counting acquisitions and telling whether it is held."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.acquired = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        self.acquired += got
        return got

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()


class _WatchedClamp(OutputClamp):
    __slots__ = ("held",)

    def room(self, cost_left: int | None, tokens_left: int | None, pool: str | None = None) -> None:
        self.held.append(LOCK.locked())
        super().room(cost_left, tokens_left, pool)


LOCK = _CountingLock()


def test_the_room_is_read_and_reserved_under_one_lock_acquisition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ledger = LocalLedger()
    pool = BudgetPool("team", max_tokens=10_000, ledger=ledger)
    config = ExecutionConfig(max_cost_usd=nano_to_usd(cost_of(300)), max_tokens=50_000)
    held: list[bool] = []

    def watched(*args: object) -> _WatchedClamp:
        clamp = _WatchedClamp(*args)  # type: ignore[arg-type]
        clamp.held = held
        return clamp

    monkeypatch.setattr("veronica_otel._llm_admission.OutputClamp", watched)
    with ExecutionContext(config, ledger=ledger, pools=[pool]) as ctx:
        monkeypatch.setattr(ledger, "_lock", LOCK)
        before = LOCK.acquired
        answer = ctx.admit_call(uncapped())
        assert LOCK.acquired - before == 1  # no read of the room before the reservation
        assert held == [True, True]  # the chain's room and the pool's, read under it
        assert answer.clamped == 300
        answer.handle.finish(sent=False)


def _side_by_side(
    ctx: ExecutionContext, threads: int
) -> tuple[list[Admitted], list[BudgetExceededError]]:
    barrier = threading.Barrier(threads)
    answers: list[Admitted] = []
    denied: list[BudgetExceededError] = []

    def call() -> None:
        barrier.wait()
        try:
            answers.append(ctx.admit_call(uncapped()))
        except BudgetExceededError as exc:
            denied.append(exc)

    workers = [threading.Thread(target=call) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return answers, denied


def test_uncapped_calls_side_by_side_fill_the_room_exactly(switch_often: None) -> None:
    # Room for 2.5 calls at the model's limit: whatever the order, the first two
    # take the limit, the third the half left, and the rest are denied without
    # tripping the chain.
    ceiling = 2 * cost_of(LIMIT) + cost_of(LIMIT // 2)
    for _ in range(5):
        # No waiting for room: the answers hold theirs until every thread is done.
        config = ExecutionConfig(max_cost_usd=nano_to_usd(ceiling), reservation_wait_s=0)
        with ExecutionContext(config) as ctx:
            answers, denied = _side_by_side(ctx, 8)
            clamps = sorted(a.clamped or 0 for a in answers)
            assert clamps[1:] == [LIMIT, LIMIT]
            assert abs(clamps[0] - LIMIT // 2) <= 1
            assert len(denied) == 5
            assert not any(exc.trip.sticky for exc in denied)
            assert ctx.trip is None
            for answer in answers:
                answer.handle.finish(sent=False)


@pytest.mark.asyncio
async def test_the_async_entry_in_process_is_the_same_answer() -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=nano_to_usd(cost_of(300)))) as ctx:
        answer = await ctx.aadmit_call(uncapped())
        assert answer.clamped == 300
        await answer.handle.afinish(sent=False)


# -- the plain lane (an in-process root chain with nothing to check) and the general path


@pytest.fixture(autouse=False)
def no_agent_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    # An agent given limits in code (an earlier test's) turns the lane off for
    # the process; none is alive in these chains.
    monkeypatch.setattr(_agents, "_limited_in_code", False)


@contextlib.contextmanager
def _chain(table: PriceTable, lane: bool, cost_usd: float = 1e6) -> Iterator[ExecutionContext]:
    # A deadline makes a chain "checked": its calls take begin_priced_call's way.
    # Entered under a span, a root chain opens no span of its own: its calls
    # record no per-call metric through it, so the plain lane takes them.
    config = ExecutionConfig(max_cost_usd=cost_usd, timeout_ms=None if lane else 600_000)
    with (
        trace.get_tracer(__name__).start_as_current_span("request"),
        ExecutionContext(config, price_table=table) as ctx,
    ):
        yield ctx


@pytest.mark.usefixtures("no_agent_limits")
@given(
    st.one_of(prices_st, tiered_st),
    st.integers(0, 400_000),
    st.one_of(st.none(), st.integers(0, 300_000)),
    st.integers(1, 4),
    st.booleans(),
    st.booleans(),
)
def test_the_plain_lane_reserves_and_settles_as_the_general_path(
    prices: UnitPrices,
    bound: int,
    cap: int | None,
    choices: int,
    cache_writes: bool,
    lane: bool,
) -> None:
    table = PriceTable({"openai:m": prices})
    table.lookup("openai", "m")  # priced once: the lane reads the table's cache
    spec = CallSpec("openai", "chat", "m", bound, cap, False, choices, cache_writes=cache_writes)
    output = 0 if cap is None else cap * choices
    with _chain(table, lane) as ctx:
        answer = ctx.admit_call(spec)
        handle = answer.handle
        assert (type(handle) is PlainCall) is lane
        assert answer.prices == prices
        assert handle.reservation.cost_nano == prices.max_cost_nano(bound, output, cache_writes)
        assert handle.reservation.tokens == bound + output
        handle.add_usage(3, 4)  # record_usage into the running call adds to its commit
        handle.commit(5, 7)
        handle.commit(100, 100)  # settled once
        snapshot = ctx.snapshot()
        assert (snapshot.steps, snapshot.tokens, snapshot.reserved_usd) == (1, 11, 0.0)
        assert snapshot.cost_usd == nano_to_usd(8)


@pytest.mark.usefixtures("no_agent_limits")
@pytest.mark.parametrize("lane", [True, False])
def test_a_lane_commit_past_the_ceiling_trips_the_chain_as_the_general_one(lane: bool) -> None:
    prices = UnitPrices(1_000_000, 1_000_000, 1_000_000, 1_000_000)  # 1 nano-USD a token
    table = PriceTable({"openai:m": prices})
    table.lookup("openai", "m")
    with _chain(table, lane, cost_usd=nano_to_usd(100)) as ctx:
        handle = ctx.admit_call(CallSpec("openai", "chat", "m", 10, 10, False)).handle
        assert (type(handle) is PlainCall) is lane
        handle.commit(150, 20)  # reported more than reserved, past the ceiling
        assert ctx.snapshot().aborted
        with pytest.raises(BudgetExceededError):
            ctx.admit_call(CallSpec("openai", "chat", "m", 1, 1, False))


@pytest.mark.parametrize("lane", [True, False])
def test_an_out_of_range_count_is_refused_on_either_path(lane: bool) -> None:
    table = PriceTable({"openai:m": UnitPrices(1, 1, 1, 1)})
    table.lookup("openai", "m")
    with _chain(table, lane) as ctx, pytest.raises(ValueError, match="output_tokens"):
        ctx.admit_call(CallSpec("openai", "chat", "m", 10, MAX_COUNT + 1, False))
    with _chain(table, lane) as ctx:
        answer = ctx.admit_call(CallSpec("openai", "chat", "m", 10, 5, False))
        answer.handle.finish(sent=False)  # released: the step given back
        assert ctx.snapshot().steps == 0


@pytest.mark.usefixtures("no_agent_limits")
def test_the_lanes_handle_holds_every_field_new_call_sets() -> None:
    # admit_call builds its PlainCall field by field (new_call's, inline):
    # every slot new_call fills holds what new_call would have put there.
    from veronica_otel._call import CallHandle, new_call

    table = PriceTable({"openai:m": UnitPrices(1, 1, 1, 1)})
    table.lookup("openai", "m")
    with _chain(table, True) as ctx:
        handle = ctx.admit_call(CallSpec("openai", "chat", "m", 10, 5, False)).handle
        assert type(handle) is PlainCall
        made = new_call(PlainCall, handle.context, handle.reservation, None, handle.decision)
        made.model, made.metrics = "m", handle.metrics
        filled = [name for name in CallHandle.__slots__ if hasattr(made, name)]
        assert set(CallHandle.__slots__) - set(filled) == {"joined"}  # set only on a join
        assert {name: getattr(handle, name) for name in filled} == {
            name: getattr(made, name) for name in filled
        }
        assert not hasattr(handle, "joined")
        handle.commit(3, 4)
        assert ctx.snapshot().tokens == 4


@pytest.mark.usefixtures("no_agent_limits")
def test_admits_call_holds_every_field_contained_call_sets() -> None:
    # admit builds its ContainedCall field by field (__init__'s, inline): it
    # must hold what ContainedCall(...) holds, and the breaker and probe.
    from veronica_otel.instrumentors._admit import admit
    from veronica_otel.instrumentors._common import UNTRACED_SPAN, ContainedCall

    table = PriceTable({"openai:m": UnitPrices(1, 1, 1, 1)})
    table.lookup("openai", "m")
    with _chain(table, True) as ctx:
        spec = CallSpec("openai", "chat", "m", 10, 5, False)
        call, _, _ = admit(ctx, UNTRACED_SPAN, True, spec)
        made = ContainedCall(
            ctx, call.handle, UNTRACED_SPAN, True, "openai", "m", call.prices, 10, 5
        )
        made.breaker, made.probe = call.breaker, call.probe
        assert vars(call) == vars(made)
        call.finish(sent=False)
        assert ctx.snapshot().steps == 0
