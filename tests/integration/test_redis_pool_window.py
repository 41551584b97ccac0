"""The pools' rolling window in Lua against a plain reference (a list of
timestamped amounts), on a real Valkey, under an injected clock.

The pool scripts take their time from ``PoolStore.clock`` when a test sets
it (the server's ``TIME`` otherwise), so any sequence of instants can be
replayed exactly. The reference counts an amount committed at ``t`` until
``now >= (t // bucket + 1) * bucket + window``: never before it is older
than the window, at most one bucket after.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from veronica_otel._ledger import Level, Limits, PoolLevel, Reservation
from veronica_otel._units import usd_to_nano as _nano
from veronica_otel.distributed import RedisLedger

U = 1_000_000  # one unit of cost in nano-USD
WINDOW_US = 15_000_000
BUCKET_US = WINDOW_US // 60
LIMIT = 20  # units
BASE_US = 1_796_000_000_000_000  # a server-like clock (2026), far from 0


class Reference:
    """Timestamped amounts; what a window of WINDOW_US in BUCKET_US buckets holds."""

    def __init__(self) -> None:
        self.spent: list[tuple[int, int]] = []

    @staticmethod
    def leaves(at: int) -> int:
        return (at // BUCKET_US + 1) * BUCKET_US + WINDOW_US

    def held(self, now: int) -> int:
        return sum(amount for at, amount in self.spent if now < self.leaves(at))

    def retry_after_us(self, now: int, amount: int) -> int | None:
        """When enough has left for ``amount`` to fit, or None if it never will."""
        if amount > LIMIT:
            return None
        need = self.held(now) + amount - LIMIT
        freed = 0
        for leave, value in sorted(
            (self.leaves(at), value) for at, value in self.spent if now < self.leaves(at)
        ):
            freed += value
            if freed >= need:
                return leave - now
        return None


@pytest.fixture
def ledger(redis_url: str) -> Iterator[RedisLedger]:
    made = RedisLedger.from_url(redis_url, key_prefix=f"w{uuid.uuid4().hex[:10]}:")
    yield made
    made.close()
    made.client.close()


steps = st.lists(
    st.tuples(
        st.one_of(
            st.integers(0, 2 * WINDOW_US),
            st.integers(0, 3 * BUCKET_US),
            st.sampled_from([BUCKET_US - 1, BUCKET_US, WINDOW_US - 1, WINDOW_US, WINDOW_US + 1]),
        ),
        st.integers(1, 8),
    ),
    min_size=1,
    max_size=25,
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps=steps, start=st.integers(0, 10 * WINDOW_US))
def test_window_matches_the_reference(
    ledger: RedisLedger, steps: list[tuple[int, int]], start: int
) -> None:
    name = f"p{uuid.uuid4().hex[:8]}"
    pool = PoolLevel(
        name, Limits(cost_nano=LIMIT * U), window_s=WINDOW_US / 1e6, bucket_s=BUCKET_US / 1e6
    )
    path = [Level(f"c{name}", Limits())]
    now = [BASE_US + start]
    ledger._pools.clock = lambda: now[0]
    reference = Reference()
    for advance, amount in steps:
        now[0] += advance
        expected = reference.held(now[0])
        got = ledger.reserve(path, amount * U, 0, pools=[pool])
        if expected + amount <= LIMIT:
            assert isinstance(got, Reservation), (got, expected, amount)
            ledger.commit(path, got, amount * U, 0)
            reference.spent.append((now[0], amount))
        else:
            assert not isinstance(got, Reservation), (expected, amount)
            assert got.pool == name
            retry = reference.retry_after_us(now[0], amount)
            assert got.retry_after_s == (None if retry is None else retry / 1e6)
        snap = ledger.pool_snapshot(pool)
        assert _nano(snap.cost_usd) == reference.held(now[0]) * U
        assert (_nano(snap.reserved_cost_usd), snap.steps) == (
            0,
            len([1 for at, _ in reference.spent if now[0] < reference.leaves(at)]),
        )
        live = [reference.leaves(at) for at, _ in reference.spent if now[0] < reference.leaves(at)]
        assert snap.free_in_s == (None if not live else (min(live) - now[0]) / 1e6)
