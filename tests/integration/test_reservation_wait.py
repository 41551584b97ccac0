"""A call refused only by other calls' in-flight reservations waits for them to settle.

``reservation_wait_s`` / ``VERONICA_RESERVATION_WAIT_S``: validated (NaN,
negative, absurd refused, naming the value), bounded by the chain's
deadline, and only on the refusal path: a call refused on committed spend
never waits. Threads on the in-process ledger and on a real Valkey.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any

import pytest

from veronica_otel import (
    BudgetExceededError,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
)
from veronica_otel._config import DEFAULT_RESERVATION_WAIT_S
from veronica_otel._policy_schema import PolicyFileError, parse_policy


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (math.nan, ValueError),
        (math.inf, ValueError),
        (-0.5, ValueError),
        (3601, ValueError),
        (True, ValueError),  # a bool is a ValueError, as for every number (DESIGN)
        ("5", TypeError),
    ],
)
def test_a_bad_wait_cannot_be_constructed(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="reservation_wait_s") as info:
        ExecutionConfig(reservation_wait_s=value)
    assert repr(value) in str(info.value)


def test_the_wait_reads_from_the_environment_and_the_policy_file() -> None:
    assert ExecutionConfig().reservation_wait_s is None  # the default applies
    assert DEFAULT_RESERVATION_WAIT_S == 10.0
    config = ExecutionConfig.from_env({"VERONICA_RESERVATION_WAIT_S": "2.5"})
    assert config.reservation_wait_s == 2.5
    with pytest.raises(ValueError, match=r"VERONICA_RESERVATION_WAIT_S='-3'"):
        ExecutionConfig.from_env({"VERONICA_RESERVATION_WAIT_S": "-3"})
    spec = parse_policy({"limits": {"reservation_wait_s": 0.5}}, "p.toml")
    assert spec.limits.reservation_wait_s == 0.5
    with pytest.raises(PolicyFileError, match="reservation_wait_s"):
        parse_policy({"limits": {"reservation_wait_s": -1}}, "p.toml")


HOLD = 6 * 10**8  # 0.6 USD held by another thread's call in flight
CALL = 5 * 10**8  # 0.5 USD: fits beside the committed spend, not beside the hold


def test_a_call_waits_for_another_thread_s_hold_to_settle(ledger: Any) -> None:
    config = ExecutionConfig(max_cost_usd=1.0, reservation_wait_s=30)
    with ExecutionContext(config, ledger=ledger) as ctx:
        held = ctx.begin_call(cost_nano=HOLD)
        settled = threading.Timer(0.2, lambda: held.commit(10**8, 0))
        settled.start()
        started = time.monotonic()
        call = ctx.begin_call(cost_nano=CALL)  # waits; fits once the hold commits 0.1
        waited = time.monotonic() - started
        settled.join()
        call.finish(sent=False)
        assert waited >= 0.15 and ctx.trip is None


def test_a_call_refused_on_committed_spend_after_the_wait_trips_the_chain(ledger: Any) -> None:
    config = ExecutionConfig(max_cost_usd=1.0, reservation_wait_s=30)
    with ExecutionContext(config, ledger=ledger) as ctx:
        held = ctx.begin_call(cost_nano=HOLD)
        settled = threading.Timer(0.1, lambda: held.commit(HOLD, 0))  # the whole hold
        settled.start()
        with pytest.raises(BudgetExceededError) as denied:
            ctx.begin_call(cost_nano=CALL)
        settled.join()
        assert denied.value.trip.sticky and ctx.trip is not None


@pytest.mark.parametrize("bound", ["wait", "deadline"])
def test_the_wait_is_bounded(ledger: Any, bound: str) -> None:
    limits = (
        {"reservation_wait_s": 0.3}
        if bound == "wait"
        else {"timeout_ms": 300, "reservation_wait_s": 30}
    )
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, **limits), ledger=ledger) as ctx:
        held = ctx.begin_call(cost_nano=HOLD)  # never settles while we wait
        started = time.monotonic()
        with pytest.raises(BudgetExceededError) as denied:
            ctx.begin_call(cost_nano=CALL)
        waited = time.monotonic() - started
        held.finish(sent=False)
    assert 0.25 <= waited < 10
    assert denied.value.trip.sticky is False or denied.value.reason == "timeout"


def test_a_call_refused_on_committed_spend_does_not_wait(ledger: Any) -> None:
    config = ExecutionConfig(max_cost_usd=1.0, reservation_wait_s=30)
    with ExecutionContext(config, ledger=ledger) as ctx:
        ctx.begin_call(cost_nano=HOLD).commit(HOLD, 0)
        started = time.monotonic()
        with pytest.raises(BudgetExceededError) as denied:
            ctx.begin_call(cost_nano=CALL)
        assert time.monotonic() - started < 5 and denied.value.trip.sticky


@pytest.mark.asyncio
async def test_an_async_wrapped_call_awaits_the_room_in_process() -> None:
    # awrap_llm_call on the in-process ledger: the wait is awaited, so the call
    # holding the budget (on the same event loop) can settle meanwhile.
    config = ExecutionConfig(max_cost_usd=1.0, reservation_wait_s=30)
    with ExecutionContext(config) as ctx:
        held = ctx.begin_call(cost_nano=HOLD)

        async def settle() -> None:
            await asyncio.sleep(0.1)
            held.commit(10**8, 0)

        async def call() -> str:
            return "sent"

        options = WrapOptions(operation_name="x", cost_estimate_hint=0.5)
        settling = asyncio.create_task(settle())
        assert await ctx.awrap_llm_call(call, options) is Decision.ALLOW
        await settling
        assert ctx.trip is None
