"""RetryContainer (chain-wide retry budget, backoff) and the counting guards.

Sleeps are injected recording fakes; nothing here waits on the wall clock.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from veronica_otel import (
    AgentStepGuard,
    BudgetEnforcer,
    BudgetExceededError,
    ExecutionConfig,
    ExecutionContext,
    LocalLedger,
    LoopGuard,
    PolicyContext,
    PolicyDecision,
    PolicyPipeline,
    RetryContainer,
    TripEvent,
    _retry,
    current_context,
)
from veronica_otel._ledger import SIGNATURE_MEMORY
from veronica_otel._units import usd_to_nano

THREADS = 8


class Flaky(Exception):
    """The user's own error: retried, and re-raised unchanged."""


class RecordingSleep:
    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


class RecordingAsyncSleep:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


class AlwaysFails:
    """A callable that fails every time and keeps each error it raised."""

    def __init__(self) -> None:
        self.errors: list[Flaky] = []

    @property
    def calls(self) -> int:
        return len(self.errors)

    def __call__(self) -> None:
        error = Flaky(f"attempt {self.calls + 1}")
        self.errors.append(error)
        raise error


@pytest.fixture
def sleep() -> RecordingSleep:
    return RecordingSleep()


@pytest.fixture
def async_sleep() -> RecordingAsyncSleep:
    return RecordingAsyncSleep()


@pytest.fixture
def ledger() -> LocalLedger:
    return LocalLedger()


@pytest.fixture
def failing() -> AlwaysFails:
    return AlwaysFails()


def _container(sleep: RecordingSleep, max_retries: int = 3, **kwargs: Any) -> RetryContainer:
    return RetryContainer(max_retries, sleep=sleep, **kwargs)


# -- RetryContainer.execute ---------------------------------------------------


def test_succeeds_after_transient_failures(sleep: RecordingSleep) -> None:
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise Flaky("not yet")
        return "ok"

    container = _container(sleep, max_retries=5)
    assert container.execute(flaky) == "ok"
    assert len(attempts) == 3
    assert len(sleep.delays) == 2
    assert container.retries_made == 2


def test_passes_arguments_through(sleep: RecordingSleep) -> None:
    def add(a: int, b: int, *, c: int) -> int:
        return a + b + c

    assert _container(sleep).execute(add, 1, 2, c=3) == 6


@pytest.mark.parametrize("max_retries", [0, 1, 3, 7])
def test_retries_up_to_max_then_reraises_the_original_error(
    sleep: RecordingSleep, failing: AlwaysFails, max_retries: int
) -> None:
    assert current_context() is None
    container = _container(sleep, max_retries=max_retries)
    with pytest.raises(Flaky) as raised:
        container.execute(failing)
    assert failing.calls == max_retries + 1
    assert raised.value is failing.errors[-1]
    assert len(sleep.delays) == max_retries
    assert container.retries_made == max_retries


def test_never_retries_budget_exceeded(sleep: RecordingSleep, ledger: LocalLedger) -> None:
    calls: list[int] = []
    trip = TripEvent("cost", 1.0, 2.0, "c", "over")

    def denied() -> None:
        calls.append(1)
        raise BudgetExceededError(trip)

    with ExecutionContext(ExecutionConfig(max_retries_total=10), ledger=ledger) as ctx:
        with pytest.raises(BudgetExceededError) as raised:
            _container(sleep, max_retries=5).execute(denied)
        assert ctx.snapshot().retries == 0
    assert raised.value.trip is trip
    assert calls == [1]
    assert sleep.delays == []


def test_base_exceptions_are_not_retried(sleep: RecordingSleep) -> None:
    calls: list[int] = []

    def interrupted() -> None:
        calls.append(1)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _container(sleep).execute(interrupted)
    assert calls == [1]


def test_execute_rejects_a_coroutine_function(sleep: RecordingSleep) -> None:
    async def coro_fn() -> None:
        return None

    with pytest.raises(TypeError, match="aexecute"):
        _container(sleep).execute(coro_fn)


def test_each_retry_draws_on_the_chain(
    sleep: RecordingSleep, failing: AlwaysFails, ledger: LocalLedger
) -> None:
    with ExecutionContext(ExecutionConfig(max_retries_total=10), ledger=ledger) as ctx:
        with pytest.raises(Flaky):
            _container(sleep, max_retries=3).execute(failing)
        snap = ctx.snapshot()
    assert snap.retries == 3
    assert snap.steps == 0  # a drawn retry is not a step
    assert failing.calls == 4


def _nest(containers: list[RetryContainer], fn: Callable[[], None]) -> Callable[[], None]:
    call = fn
    for container in reversed(containers):
        call = functools.partial(container.execute, call)
    return call


def test_nested_containers_without_a_chain_multiply(
    sleep: RecordingSleep, failing: AlwaysFails
) -> None:
    assert current_context() is None
    containers = [_container(sleep, max_retries=3) for _ in range(3)]
    with pytest.raises(Flaky):
        _nest(containers, failing)()
    assert failing.calls == (1 + 3) ** 3 == 64


def test_nested_containers_share_the_chain_retry_budget(
    sleep: RecordingSleep, failing: AlwaysFails, ledger: LocalLedger
) -> None:
    # outer(3) -> middle(3) -> inner(3) -> failing, chain max_retries_total=5.
    # inner: call 1, retry#1, call 2, retry#2, call 3, retry#3, call 4 -> gives up (Flaky).
    # middle catches it: retry#4, runs inner again: call 5, retry#5, call 6,
    # inner asks for retry#6 -> the chain denies -> BudgetExceededError("retries"),
    # which neither middle nor outer retries. So: 6 invocations, 5 retries drawn.
    outer, middle, inner = (_container(sleep, max_retries=3) for _ in range(3))
    with ExecutionContext(ExecutionConfig(max_retries_total=5), ledger=ledger) as ctx:
        with pytest.raises(BudgetExceededError) as raised:
            _nest([outer, middle, inner], failing)()
        snap = ctx.snapshot()
    assert failing.calls == 6
    assert snap.retries == 5
    assert (outer.retries_made, middle.retries_made, inner.retries_made) == (0, 1, 4)
    assert outer.retries_made + middle.retries_made + inner.retries_made == 5
    assert len(sleep.delays) == 5
    error = raised.value
    assert error.reason == "retries"
    assert error.limit == 5
    assert error.observed == 6
    assert error.chain_id == ctx.chain_id
    assert error.__cause__ is failing.errors[-1]
    # The chain is tripped: every later call is denied without running.
    assert snap.aborted
    with pytest.raises(BudgetExceededError):
        ctx.begin_call()


def test_retry_budget_of_a_child_counts_in_the_parent(
    sleep: RecordingSleep, failing: AlwaysFails, ledger: LocalLedger
) -> None:
    with ExecutionContext(ExecutionConfig(max_retries_total=2), ledger=ledger) as parent:
        child = parent.spawn_child(ExecutionConfig(max_retries_total=100))
        with child, pytest.raises(BudgetExceededError) as raised:
            _container(sleep, max_retries=10).execute(failing)
    assert raised.value.reason == "retries"
    assert failing.calls == 3
    assert parent.snapshot().retries == 2
    assert child.snapshot().retries == 2


def test_explicit_context_is_used_outside_a_with_block(
    sleep: RecordingSleep, failing: AlwaysFails, ledger: LocalLedger
) -> None:
    ctx = ExecutionContext(ExecutionConfig(max_retries_total=1), ledger=ledger)
    assert current_context() is None
    container = _container(sleep, max_retries=4, context=ctx)
    with pytest.raises(BudgetExceededError) as raised:
        container.execute(failing)
    assert raised.value.reason == "retries"
    assert failing.calls == 2
    assert ctx.snapshot().retries == 1


# -- RetryContainer.aexecute ----------------------------------------------------


@pytest.mark.asyncio
async def test_aexecute_retries_then_reraises(async_sleep: RecordingAsyncSleep) -> None:
    errors: list[Flaky] = []

    async def fails() -> None:
        errors.append(Flaky(str(len(errors))))
        raise errors[-1]

    container = RetryContainer(2, async_sleep=async_sleep)
    with pytest.raises(Flaky) as raised:
        await container.aexecute(fails)
    assert len(errors) == 3
    assert raised.value is errors[-1]
    assert len(async_sleep.delays) == 2


@pytest.mark.asyncio
async def test_aexecute_never_retries_budget_exceeded(async_sleep: RecordingAsyncSleep) -> None:
    calls: list[int] = []

    async def denied() -> None:
        calls.append(1)
        raise BudgetExceededError(TripEvent("steps", 1, 2, "c"))

    with pytest.raises(BudgetExceededError):
        await RetryContainer(5, async_sleep=async_sleep).aexecute(denied)
    assert calls == [1]
    assert async_sleep.delays == []


@pytest.mark.asyncio
async def test_aexecute_nested_containers_share_the_chain_retry_budget(
    async_sleep: RecordingAsyncSleep, ledger: LocalLedger
) -> None:
    errors: list[Flaky] = []

    async def fails() -> None:
        errors.append(Flaky(str(len(errors))))
        raise errors[-1]

    outer, middle, inner = (RetryContainer(3, async_sleep=async_sleep) for _ in range(3))
    async with ExecutionContext(ExecutionConfig(max_retries_total=5), ledger=ledger) as ctx:
        with pytest.raises(BudgetExceededError) as raised:
            await outer.aexecute(lambda: middle.aexecute(lambda: inner.aexecute(fails)))
        snap = ctx.snapshot()
    assert len(errors) == 6  # same arithmetic as the sync case
    assert snap.retries == 5
    assert len(async_sleep.delays) == 5
    assert raised.value.reason == "retries"
    assert raised.value.__cause__ is errors[-1]


@pytest.mark.asyncio
async def test_aexecute_returns_the_result(async_sleep: RecordingAsyncSleep) -> None:
    attempts: list[int] = []

    async def flaky() -> int:
        attempts.append(1)
        if len(attempts) == 1:
            raise Flaky("once")
        return 42

    assert await RetryContainer(1, async_sleep=async_sleep).aexecute(flaky) == 42
    assert async_sleep.delays and len(async_sleep.delays) == 1


# -- backoff ------------------------------------------------------------------------


def test_backoff_doubles_and_is_capped_without_jitter(
    sleep: RecordingSleep, failing: AlwaysFails
) -> None:
    container = RetryContainer(7, backoff_base=0.5, backoff_max=5.0, jitter=0.0, sleep=sleep)
    with pytest.raises(Flaky):
        container.execute(failing)
    assert sleep.delays == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]


@pytest.mark.parametrize("jitter", [0.1, 0.25, 0.5, 1.0])
def test_backoff_stays_within_jitter_bounds(
    sleep: RecordingSleep, failing: AlwaysFails, jitter: float
) -> None:
    base, cap, retries = 0.1, 3.0, 8
    for _ in range(50):
        failing.errors.clear()
        sleep.delays.clear()
        container = RetryContainer(
            retries, backoff_base=base, backoff_max=cap, jitter=jitter, sleep=sleep
        )
        with pytest.raises(Flaky):
            container.execute(failing)
        assert len(sleep.delays) == retries
        for attempt, delay in enumerate(sleep.delays, start=1):
            nominal = min(base * 2 ** (attempt - 1), cap)
            assert nominal * (1 - jitter) - 1e-12 <= delay <= nominal * (1 + jitter) + 1e-12
            assert delay >= 0


def test_backoff_grows_exponentially_with_jitter(
    sleep: RecordingSleep, failing: AlwaysFails
) -> None:
    # With jitter 0.25 a delay is within [0.75, 1.25] of nominal; nominal doubles,
    # so each delay is at least 0.75*2/1.25 = 1.2 times the one before (below the cap).
    container = RetryContainer(6, backoff_base=0.01, backoff_max=100.0, jitter=0.25, sleep=sleep)
    with pytest.raises(Flaky):
        container.execute(failing)
    for earlier, later in zip(sleep.delays, sleep.delays[1:], strict=False):
        assert later >= 1.2 * earlier - 1e-12


def test_backoff_never_exceeds_backoff_max(
    sleep: RecordingSleep, failing: AlwaysFails, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_retry.random, "random", lambda: 0.999)  # the top of the jitter range
    container = RetryContainer(6, backoff_base=1.0, backoff_max=4.0, jitter=0.25, sleep=sleep)
    with pytest.raises(Flaky):
        container.execute(failing)
    assert max(sleep.delays) <= 4.0, sleep.delays


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": True}, "max_retries"),
        ({"max_retries": 1.5}, "max_retries"),
        ({"backoff_base": float("nan")}, "backoff_base"),
        ({"backoff_base": -0.1}, "backoff_base"),
        ({"backoff_max": float("inf")}, "backoff_max"),
        ({"backoff_max": "1"}, "backoff_max"),
        ({"jitter": 1.5}, "jitter"),
        ({"jitter": True}, "jitter"),
    ],
    ids=repr,
)
def test_bad_retry_arguments_are_rejected_by_name(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises((ValueError, TypeError), match=name):
        RetryContainer(**kwargs)


# -- guards: stand-alone ------------------------------------------------------------


def _hammer(worker: Callable[[], bool], threads: int = THREADS, per_thread: int = 100) -> int:
    """Run ``worker`` ``per_thread`` times in each of ``threads`` threads at once."""
    barrier = threading.Barrier(threads)

    def run(_: int) -> int:
        barrier.wait(timeout=10)
        return sum(1 for _ in range(per_thread) if worker())

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return sum(pool.map(run, range(threads)))


def test_step_guard_exact_under_threads() -> None:
    guard = AgentStepGuard(max_steps=333)
    assert _hammer(guard.step) == 333
    assert guard.current_step == 333
    assert guard.step() is False


def test_step_guard_check_exact_under_threads() -> None:
    guard = AgentStepGuard(max_steps=250)
    assert _hammer(lambda: guard.check(PolicyContext()).allowed) == 250
    assert guard.current_step == 250
    denial = guard.check(PolicyContext())
    assert not denial.allowed
    assert (denial.limit, denial.observed, denial.trip_reason) == (250, 251, "steps")


def test_step_guard_keeps_the_partial_result() -> None:
    guard = AgentStepGuard(max_steps=2)
    assert guard.step("first") and guard.step("second")
    assert not guard.step("third")
    assert guard.last_result == "second"
    assert guard.check(PolicyContext()).partial_result == "second"


def test_budget_spend_exact_under_threads() -> None:
    budget = BudgetEnforcer(limit_usd=1.0)
    assert _hammer(lambda: budget.spend(0.01)) == 100
    assert budget.spent_usd == 1.0
    assert budget.exceeded


def test_budget_check_exact_under_threads() -> None:
    budget = BudgetEnforcer(limit_usd=0.5)
    admitted: list[PolicyContext] = []
    lock = threading.Lock()

    def worker() -> bool:
        context = PolicyContext(estimated_cost_usd=0.01)
        allowed = budget.check(context).allowed
        if allowed:
            with lock:
                admitted.append(context)
        return allowed

    assert _hammer(worker) == 50
    for context in admitted:
        context.actual_cost_usd = 0.005
        budget.on_success(context)
    assert budget.spent_usd == 0.25
    assert budget._reserved == 0


def test_budget_spend_refuses_what_does_not_fit() -> None:
    budget = BudgetEnforcer(limit_usd=0.3)
    assert budget.spend(0.1) and budget.spend(0.1) and budget.spend(0.1)
    assert budget.spent_usd == 0.3  # integer nano-USD: exactly, not 0.30000000000000004
    assert not budget.spend(1e-9)
    assert budget.spent_usd == 0.3


def test_loop_guard_exact_under_threads() -> None:
    guard = LoopGuard(max_repeats=7)
    assert _hammer(lambda: guard.observe("same call")) == 7
    assert guard.count("same call") == 7


def test_loop_guard_check_exact_under_threads() -> None:
    guard = LoopGuard(max_repeats=5)
    assert _hammer(lambda: guard.check(PolicyContext(signature="sig")).allowed) == 5
    assert guard.check(PolicyContext(signature=None)).allowed  # unsigned calls pass


def test_loop_guard_memory_is_bounded() -> None:
    guard = LoopGuard(max_repeats=1)
    for i in range(50_000):
        assert guard.observe(f"signature-{i}")
    assert len(guard._seen) <= SIGNATURE_MEMORY
    for i in range(50_000, 60_000):
        context = PolicyContext(signature=f"signature-{i}")
        assert guard.check(context).allowed
        guard.on_success(context)
    assert len(guard._seen) <= SIGNATURE_MEMORY
    assert guard._pending == {}
    assert not guard.observe("signature-59999")  # recent ones are still remembered


# -- abandon gives back what check took ---------------------------------------------


def test_step_guard_abandon_gives_back_the_step() -> None:
    guard = AgentStepGuard(max_steps=1)
    context = PolicyContext()
    assert guard.check(context).allowed
    guard.on_abandon(context)
    assert guard.current_step == 0
    guard.on_abandon(context)  # twice gives back nothing more
    assert guard.current_step == 0
    finished = PolicyContext()
    assert guard.check(finished).allowed
    guard.on_success(finished)
    guard.on_abandon(finished)  # after an outcome there is nothing to give back
    assert guard.current_step == 1
    assert not guard.check(PolicyContext()).allowed


def test_budget_abandon_releases_the_reservation() -> None:
    budget = BudgetEnforcer(limit_usd=1.0)
    context = PolicyContext(estimated_cost_usd=0.8)
    assert budget.check(context).allowed
    assert budget._reserved == usd_to_nano(0.8)
    budget.on_abandon(context)
    assert budget._reserved == 0
    budget.on_abandon(context)  # twice gives back nothing more
    assert budget._reserved == 0
    assert budget.spend(1.0)  # the whole dollar is free again
    assert budget.spent_usd == 1.0


def test_budget_reservation_holds_until_settled() -> None:
    budget = BudgetEnforcer(limit_usd=1.0)
    assert budget.check(PolicyContext(estimated_cost_usd=0.8)).allowed
    assert not budget.spend(0.3)  # 0.8 reserved + 0.3 > 1.0
    assert budget.exceeded


def test_budget_failure_releases_and_success_commits_actual() -> None:
    budget = BudgetEnforcer(limit_usd=1.0)
    failed = PolicyContext(estimated_cost_usd=0.6)
    assert budget.check(failed).allowed
    budget.on_failure(failed, Flaky("x"))
    succeeded = PolicyContext(estimated_cost_usd=0.6)
    assert budget.check(succeeded).allowed
    succeeded.actual_cost_usd = 0.25
    budget.on_success(succeeded)
    assert budget.spent_usd == 0.25
    assert budget.spend(0.75)
    assert not budget.spend(1e-9)


def test_loop_guard_abandon_gives_back_the_count() -> None:
    guard = LoopGuard(max_repeats=1)
    context = PolicyContext(signature="s")
    assert guard.check(context).allowed
    assert guard.count("s") == 1
    guard.on_abandon(context)
    assert guard.count("s") == 0
    assert guard.check(PolicyContext(signature="s")).allowed
    assert not guard.check(PolicyContext(signature="s")).allowed


class DenyAll:
    policy_type = "custom"

    def check(self, context: PolicyContext) -> PolicyDecision:
        return PolicyDecision(False, self.policy_type, "no", trip_reason="depth")

    def reset(self) -> None:
        return None


def test_pipeline_denial_abandons_every_earlier_guard() -> None:
    steps = AgentStepGuard(max_steps=1)
    budget = BudgetEnforcer(limit_usd=1.0)
    loop = LoopGuard(max_repeats=1)
    pipeline = PolicyPipeline([steps, budget, loop, DenyAll()])
    for _ in range(20):
        decision = pipeline.evaluate(PolicyContext(estimated_cost_usd=1.0, signature="s"))
        assert not decision.allowed
        assert decision.trip_reason == "depth"
    assert steps.current_step == 0
    assert budget._reserved == 0
    assert budget.spend(1.0)
    assert loop.count("s") == 0


def test_pipeline_first_denial_wins_and_later_policies_are_not_charged() -> None:
    steps = AgentStepGuard(max_steps=0)
    loop = LoopGuard(max_repeats=1)
    pipeline = PolicyPipeline([steps, loop])
    decision = pipeline.evaluate(PolicyContext(signature="s"))
    assert not decision.allowed
    assert decision.policy_type == "step_guard"
    assert loop.count("s") == 0


def test_pipeline_exact_under_threads_with_abandon() -> None:
    # The step guard admits up to 400, the budget only 50 (0.01 each of 0.5 USD):
    # calls the budget denies must give their step back, so exactly 50 steps remain.
    steps = AgentStepGuard(max_steps=400)
    budget = BudgetEnforcer(limit_usd=0.5)
    pipeline = PolicyPipeline([steps, budget])

    def worker() -> bool:
        return pipeline.evaluate(PolicyContext(estimated_cost_usd=0.01)).allowed

    assert _hammer(worker) == 50
    assert steps.current_step == 50


def test_pipeline_step_limit_exact_under_threads() -> None:
    steps = AgentStepGuard(max_steps=123)
    loop = LoopGuard(max_repeats=10_000)
    pipeline = PolicyPipeline([loop, steps])
    assert _hammer(lambda: pipeline.evaluate(PolicyContext(signature="s")).allowed) == 123
    assert steps.current_step == 123
    # The loop guard admitted 123 calls and got back every one the step guard denied.
    assert loop.count("s") == 123


@pytest.mark.parametrize(
    ("factory", "name"),
    [
        (lambda: AgentStepGuard(max_steps=-1), "max_steps"),
        (lambda: AgentStepGuard(max_steps=True), "max_steps"),
        (lambda: AgentStepGuard(max_steps=2.0), "max_steps"),
        (lambda: LoopGuard(max_repeats=0), "max_repeats"),
        (lambda: LoopGuard(max_repeats=float("nan")), "max_repeats"),
        (lambda: BudgetEnforcer(limit_usd=float("nan")), "limit_usd"),
    ],
)
def test_bad_guard_arguments_are_rejected_by_name(factory: Callable[[], object], name: str) -> None:
    with pytest.raises((ValueError, TypeError), match=name):
        factory()
