"""Property: however wrapped calls end, the ledger settles exactly (DESIGN G10).

Random sequences of wrapped calls that return, report usage, raise, are
interrupted, are cancelled while sent or while waiting on a rate limit, on the
fast path (no pipeline) and the general one: afterwards nothing is reserved,
the spend is exactly what the rule says (reported usage, else the
reservation; nothing for a call never sent), and calls are admitted exactly
while the ceiling allows.
"""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from veronica_otel import (
    Decision,
    ExecutionConfig,
    ExecutionContext,
    PolicyContext,
    PolicyDecision,
    PolicyPipeline,
    WrapOptions,
)
from veronica_otel._units import usd_to_nano

LIMIT_CENTS = 100


class WaitWhenAsked:
    """A rate-limit degradation for calls named ``wait``."""

    policy_type = "rate_limit"

    def check(self, context: PolicyContext) -> PolicyDecision:
        if context.operation_name == "wait":
            return PolicyDecision(True, self.policy_type, "slow", rate_limit_ms=600_000)
        return PolicyDecision(True, self.policy_type)

    def reset(self) -> None:
        pass  # stateless


SYNC_ENDINGS = ["ok", "raise", "interrupt"]
# KeyboardInterrupt in a task escapes asyncio.run itself: the sync test covers it.
ASYNC_ENDINGS = ["ok", "raise", "cancel_sent", "cancel_waiting"]

op = st.tuples(
    st.sampled_from(ASYNC_ENDINGS),
    st.integers(0, 40),  # reservation, cents
    st.none() | st.integers(0, 60),  # usage reported before the end, cents
)


class Boom(Exception):
    pass


async def _one(ctx: ExecutionContext, ending: str, hint: int, usage: int | None) -> Decision:
    name = "wait" if ending == "cancel_waiting" else "call"
    options = WrapOptions(operation_name=name, cost_estimate_hint=hint / 100)
    sent = asyncio.Event()

    async def fn() -> None:
        sent.set()
        if usage is not None:
            ctx.record_usage(cost_usd=usage / 100)
        if ending == "raise":
            raise Boom
        if ending == "cancel_sent":
            await asyncio.Event().wait()

    task = asyncio.ensure_future(ctx.awrap_llm_call(fn, options))
    if ending in ("cancel_sent", "cancel_waiting"):
        for _ in range(5):
            await asyncio.sleep(0)
        if not task.done():
            task.cancel()
    try:
        return await task
    except (Boom, asyncio.CancelledError):
        return Decision.ALLOW


def _expected(ops: list[tuple[str, int, int | None]], pipeline: bool) -> tuple[int, list[bool]]:
    spent, tripped, admitted = 0, False, []
    for ending, hint, usage in ops:
        if tripped or spent + hint > LIMIT_CENTS:
            tripped = True
            admitted.append(False)
            continue
        admitted.append(True)
        if ending == "cancel_waiting" and pipeline:
            continue  # never sent: released
        cost = hint if usage is None or ending == "cancel_waiting" else usage
        spent += cost
        tripped = spent > LIMIT_CENTS
    return spent, admitted


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(op, max_size=12), pipeline=st.booleans())
def test_async_wrapped_calls_settle_exactly(
    ops: list[tuple[str, int, int | None]], pipeline: bool
) -> None:
    if not pipeline:
        # Without a rate-limit policy there is no wait: the call is cancelled while sent.
        ops = [("cancel_sent" if e == "cancel_waiting" else e, h, u) for e, h, u in ops]
    ops = [(e, h, None) if e.startswith("cancel") else (e, h, u) for e, h, u in ops]
    ctx = ExecutionContext(
        ExecutionConfig(max_cost_usd=LIMIT_CENTS / 100),
        PolicyPipeline([WaitWhenAsked()]) if pipeline else None,
    )

    async def run() -> list[Decision]:
        return [await _one(ctx, *o) for o in ops]

    decisions = asyncio.run(run())
    spent, admitted = _expected(ops, pipeline)
    assert [d is Decision.ALLOW for d in decisions] == admitted
    state = ctx._state.ledger.snapshot(ctx.chain_id)
    assert state.reserved_nano == 0
    assert state.cost_nano == usd_to_nano(spent / 100)


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(SYNC_ENDINGS), st.integers(0, 40), st.none() | st.integers(0, 60)
        ),
        max_size=12,
    ),
    pipeline=st.booleans(),
)
def test_sync_wrapped_calls_settle_exactly(
    ops: list[tuple[str, int, int | None]], pipeline: bool
) -> None:
    ctx = ExecutionContext(
        ExecutionConfig(max_cost_usd=LIMIT_CENTS / 100),
        PolicyPipeline([WaitWhenAsked()]) if pipeline else None,
    )
    decisions = []
    for ending, hint, usage in ops:

        def fn(ending: str = ending, usage: int | None = usage) -> None:
            if usage is not None:
                ctx.record_usage(cost_usd=usage / 100)
            if ending == "raise":
                raise Boom
            if ending == "interrupt":
                raise KeyboardInterrupt

        try:
            decisions.append(ctx.wrap_llm_call(fn, WrapOptions(cost_estimate_hint=hint / 100)))
        except (Boom, KeyboardInterrupt):
            decisions.append(Decision.ALLOW)
    spent, admitted = _expected(ops, pipeline)
    assert [d is Decision.ALLOW for d in decisions] == admitted
    state = ctx._state.ledger.snapshot(ctx.chain_id)
    assert state.reserved_nano == 0
    assert state.cost_nano == usd_to_nano(spent / 100)
