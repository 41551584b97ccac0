"""DESIGN G10 in the kernel: what a wrapped or tool call that ends badly costs.

A call that ran (it may have reached the provider) and reported no usage is
committed at its reservation whether it returned, raised, was cancelled or
interrupted; a call that never started is released; usage reported before
the error is committed as reported. Every exit path frees a breaker probe.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections.abc import Callable

import pytest

from tests._clock import FakeClock
from veronica_otel import (
    BudgetExceededError,
    CircuitBreaker,
    CircuitState,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    PolicyContext,
    PolicyDecision,
    PolicyPipeline,
    ToolCall,
    WrapOptions,
    contained_tool,
)


class RateLimit:
    """Allows every call after a long wait (a rate-limit degradation)."""

    policy_type = "rate_limit"

    def check(self, context: PolicyContext) -> PolicyDecision:
        return PolicyDecision(True, self.policy_type, "slow down", rate_limit_ms=600_000)

    def reset(self) -> None:
        pass  # stateless


class Raises:
    """A policy whose check fails with a bug of its own."""

    policy_type = "buggy"

    def check(self, context: PolicyContext) -> PolicyDecision:
        raise RuntimeError("policy bug")

    def reset(self) -> None:
        pass  # stateless


def _half_open(clock: FakeClock) -> CircuitBreaker:
    breaker = CircuitBreaker(failure_threshold=1, recovery_timeout=10.0, clock=clock)
    breaker.record_failure()
    clock.advance(10.0)
    assert breaker.state is CircuitState.HALF_OPEN
    return breaker


def _spent(ctx: ExecutionContext) -> tuple[float, float, int]:
    snap = ctx.snapshot()
    return snap.cost_usd, snap.reserved_usd, snap.steps


# -- wrap_llm_call / wrap_tool_call ---------------------------------------------


def _plain() -> ExecutionContext:
    return ExecutionContext(ExecutionConfig(max_cost_usd=1.0))


def _with_pipeline() -> ExecutionContext:
    # A pipeline takes the general (not the fast) path through begin_call/_finish.
    return ExecutionContext(
        ExecutionConfig(max_cost_usd=1.0), PolicyPipeline([CircuitBreaker(clock=FakeClock())])
    )


@pytest.mark.parametrize("make", [_plain, _with_pipeline], ids=["fast", "general"])
@pytest.mark.parametrize(
    "error", [ConnectionError("lost"), ValueError("bad"), KeyboardInterrupt()], ids=repr
)
def test_a_wrapped_call_that_raises_commits_its_reservation(
    make: Callable[[], ExecutionContext], error: BaseException
) -> None:
    ctx = make()

    def fn() -> None:
        raise error

    with pytest.raises(type(error)) as raised:
        ctx.wrap_llm_call(fn, WrapOptions(cost_estimate_hint=0.3))
    assert raised.value is error  # re-raised unchanged
    assert _spent(ctx) == (0.3, 0.0, 1)


@pytest.mark.parametrize("make", [_plain, _with_pipeline], ids=["fast", "general"])
def test_an_inner_denial_halts_and_still_commits_the_reservation(
    make: Callable[[], ExecutionContext],
) -> None:
    # fn may have sent a request before the inner call was denied: fail closed.
    ctx = make()
    inner = ctx.spawn_child(ExecutionConfig(max_steps=0))

    def fn() -> None:
        inner.wrap_llm_call(lambda: None)  # HALT, no raise
        inner.ensure_active()  # the child is tripped: raises our denial

    assert ctx.wrap_tool_call(fn, WrapOptions(cost_estimate_hint=0.2)) is Decision.HALT
    assert _spent(ctx) == (0.2, 0.0, 1)


def test_usage_reported_before_the_raise_is_committed_as_reported() -> None:
    ctx = _plain()

    def fn() -> None:
        ctx.record_usage(cost_usd=0.05, input_tokens=10, output_tokens=2)
        raise ConnectionError("lost after the reply started")

    with pytest.raises(ConnectionError):
        ctx.wrap_llm_call(fn, WrapOptions(cost_estimate_hint=0.4))
    snap = ctx.snapshot()
    assert (snap.cost_usd, snap.tokens, snap.reserved_usd) == (0.05, 12, 0.0)


@pytest.mark.usefixtures("python_sigint")
def test_keyboard_interrupt_during_the_rate_limit_wait_releases() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0), PolicyPipeline([RateLimit()]))
    main = threading.main_thread()
    assert threading.current_thread() is main, "signals reach the main thread only"
    ran: list[bool] = []

    caught = threading.Event()

    def in_the_wait() -> bool:
        frame = sys._current_frames().get(main.ident or 0)
        return (
            frame is not None
            and frame.f_code.co_name == "_wait"
            and frame.f_code.co_filename.endswith("_wrap.py")
            and _in_sleep(frame)
            and ran == []
        )

    def interrupt_when_waiting() -> None:
        # Wait (in this helper thread) until the main thread sits in the
        # rate-limit sleep of _wait, then deliver SIGINT to it.
        while not in_the_wait():
            threading.Event().wait(0.001)
        signal.pthread_kill(main.ident or 0, signal.SIGINT)
        # A SIGINT that lands after time.sleep let go of the GIL but before its
        # system call is only noted, and the sleep then runs its 600 s (it did,
        # on a loaded machine): sent again while the main thread is still in
        # that system call. Both make one KeyboardInterrupt (noted once).
        while not caught.wait(0.5):
            if in_the_wait() and _in_nanosleep(main.native_id):
                signal.pthread_kill(main.ident or 0, signal.SIGINT)

    helper = threading.Thread(target=interrupt_when_waiting, daemon=True)
    helper.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            ctx.wrap_llm_call(lambda: ran.append(True), WrapOptions(cost_estimate_hint=0.5))
    finally:
        caught.set()
    helper.join(timeout=10)
    assert ran == []
    assert _spent(ctx) == (0.0, 0.0, 0)  # released: cost and step given back


def _in_nanosleep(thread: int | None) -> bool:
    """Whether ``thread`` is blocked in the kernel's sleep (Linux; else False)."""
    try:
        with open(f"/proc/self/task/{thread}/wchan") as wchan:
            return "nanosleep" in wchan.read()
    except OSError:
        return False


def _in_sleep(frame: object) -> bool:
    import linecache

    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)  # type: ignore[attr-defined]
    return "time.sleep(" in line


# -- awrap -----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_cancelled_during_the_rate_limit_wait_releases() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0), PolicyPipeline([RateLimit()]))
    ran: list[bool] = []

    async def fn() -> None:
        ran.append(True)

    task = asyncio.ensure_future(ctx.awrap_llm_call(fn, WrapOptions(cost_estimate_hint=0.5)))
    for _ in range(3):
        await asyncio.sleep(0)  # let it reach the rate-limit sleep
    assert ctx.snapshot().reserved_usd == 0.5
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ran == []
    assert _spent(ctx) == (0.0, 0.0, 0)


@pytest.mark.asyncio
async def test_cancelled_while_sent_commits_the_reservation() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0))
    started = asyncio.Event()

    async def fn() -> None:
        started.set()
        await asyncio.Event().wait()  # a reply that never comes

    task = asyncio.ensure_future(ctx.awrap_llm_call(fn, WrapOptions(cost_estimate_hint=0.25)))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _spent(ctx) == (0.25, 0.0, 1)


@pytest.mark.asyncio
async def test_wait_for_timeouts_are_charged_and_trip_the_ceiling() -> None:
    # The reproduction: timeouts used to cost $0 and never trip.
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=0.05))
    sent = 0

    async def slow() -> None:
        nonlocal sent
        sent += 1
        await asyncio.Event().wait()

    halted = 0
    for _ in range(20):
        try:
            decision = await asyncio.wait_for(
                ctx.awrap_llm_call(slow, WrapOptions(cost_estimate_hint=0.01)), 0.001
            )
        except TimeoutError:
            continue
        assert decision is Decision.HALT
        halted += 1
    assert sent == 5 and halted == 15
    assert _spent(ctx) == (0.05, 0.0, 5)


@pytest.mark.asyncio
async def test_awrap_error_commits_and_reraises_unchanged() -> None:
    ctx = _with_pipeline()
    error = ConnectionError("reset by peer")

    async def fn() -> None:
        raise error

    with pytest.raises(ConnectionError) as raised:
        await ctx.awrap_tool_call(fn, WrapOptions(cost_estimate_hint=0.125))
    assert raised.value is error
    assert _spent(ctx) == (0.125, 0.0, 1)


# -- breaker probes on every exit path --------------------------------------------


def test_a_policy_that_raises_frees_the_probe_taken_before_it() -> None:
    clock = FakeClock(100.0)
    breaker = _half_open(clock)
    ctx = ExecutionContext(pipeline=PolicyPipeline([breaker, Raises()]))
    with pytest.raises(RuntimeError, match="policy bug"):
        ctx.begin_call()
    assert breaker.check(PolicyContext()).allowed  # the slot came back
    assert ctx.snapshot().reserved_usd == 0 and ctx.snapshot().steps == 0


@pytest.mark.asyncio
async def test_a_cancelled_probe_is_freed_and_not_counted_as_a_failure() -> None:
    clock = FakeClock(100.0)
    breaker = _half_open(clock)
    ctx = ExecutionContext(pipeline=PolicyPipeline([breaker]))
    started = asyncio.Event()

    async def fn() -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.ensure_future(ctx.awrap_llm_call(fn))
    await started.wait()
    assert not breaker.check(PolicyContext()).allowed  # the probe is out
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert breaker.state is CircuitState.HALF_OPEN
    assert breaker.check(PolicyContext()).allowed


@pytest.mark.asyncio
async def test_cancelled_in_the_rate_limit_wait_frees_the_probe() -> None:
    clock = FakeClock(100.0)
    breaker = _half_open(clock)
    ctx = ExecutionContext(pipeline=PolicyPipeline([breaker, RateLimit()]))

    async def fn() -> None:
        pass  # never reached

    task = asyncio.ensure_future(ctx.awrap_llm_call(fn))
    for _ in range(3):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert breaker.check(PolicyContext()).allowed


# -- ToolCall / contained_tool ------------------------------------------------------


def test_a_tool_that_raises_commits_its_price() -> None:
    ctx = _plain()

    @contained_tool(cost_usd=0.2)
    def search(q: str) -> str:
        raise TimeoutError(q)

    with ctx, pytest.raises(TimeoutError):
        search("x")
    assert _spent(ctx) == (0.2, 0.0, 1)


@pytest.mark.asyncio
async def test_a_cancelled_async_tool_commits_its_price_and_frees_its_probe() -> None:
    ctx = _plain()
    clock = FakeClock(100.0)
    breaker = _half_open(clock)
    started = asyncio.Event()

    async def tool() -> None:
        with ToolCall("fetch", cost_usd=0.3, breaker=breaker, context=ctx):
            started.set()
            await asyncio.Event().wait()

    task = asyncio.ensure_future(tool())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _spent(ctx) == (0.3, 0.0, 1)
    assert breaker.state is CircuitState.HALF_OPEN  # no failure counted
    assert breaker.check(PolicyContext()).allowed


def test_a_tool_reporting_usage_then_raising_commits_the_usage() -> None:
    ctx = _plain()
    with pytest.raises(OSError), ToolCall("read", cost_usd=0.5, context=ctx):
        ctx.record_usage(cost_usd=0.01)
        raise OSError("disk")
    assert _spent(ctx) == (0.01, 0.0, 1)


def test_a_denied_tool_is_released() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=0.1))
    with pytest.raises(BudgetExceededError), ToolCall("big", cost_usd=0.5, context=ctx):
        raise AssertionError("must not run")
    assert _spent(ctx) == (0.0, 0.0, 0)


# -- the in-process breaker's probe expires ---------------------------------------


def test_a_probe_that_never_reports_back_expires_after_probe_ttl_s() -> None:
    clock = FakeClock(0.0)
    breaker = CircuitBreaker(1, 5.0, probe_ttl_s=20.0, clock=clock)
    breaker.record_failure()
    clock.advance(5.0)
    lost, second, late = PolicyContext(), PolicyContext(), PolicyContext()
    assert breaker.check(lost).allowed
    clock.advance(19.999)
    decision = breaker.check(late)
    assert not decision.allowed and "next probe in 0.0s" in decision.reason
    clock.advance(0.001)
    assert breaker.check(second).allowed  # the lost probe's slot expired
    assert not breaker.check(late).allowed  # and the new one holds it
    breaker.on_success(lost)  # the expired probe's late outcome no longer counts
    assert breaker.state is CircuitState.HALF_OPEN
    breaker.on_success(second)
    assert breaker.state is CircuitState.CLOSED


def test_the_default_probe_ttl_s_matches_the_redis_breaker() -> None:
    assert CircuitBreaker(recovery_timeout=5.0).probe_ttl_s == 60.0
    assert CircuitBreaker(recovery_timeout=300.0).probe_ttl_s == 300.0


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), True, "5"], ids=repr)
def test_a_bad_probe_ttl_s_is_rejected_by_name(value: object) -> None:
    with pytest.raises(ValueError, match="probe_ttl_s"):
        CircuitBreaker(probe_ttl_s=value)  # type: ignore[arg-type]
