"""``multiprocessing.pool.ThreadPool`` work runs in the chain that submitted it.

The issue's repro: a ``ThreadPool`` made before the chain ran its work with no
chain (4 requests reached the server under ``max_steps=1``), and one made
inside chain A charged chain B's calls to A. What reached the fake server,
read from its ``GET /stats``, is the truth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from multiprocessing import dummy
from multiprocessing.pool import ThreadPool
from typing import Any

import openai
import pytest

from tests.integration._outcomes import chat, sent
from veronica_otel import ExecutionConfig, ExecutionContext, current_context
from veronica_otel.testing import FakeLLMServer

CALLS = 4


def _caller(client: openai.OpenAI) -> Callable[..., str]:
    def call(*_: object) -> str:
        return chat(client)

    return call


def _apply(pool: ThreadPool, call: Callable[..., str]) -> list[str]:
    return [pool.apply(call) for _ in range(CALLS)]


def _apply_async(pool: ThreadPool, call: Callable[..., str]) -> list[str]:
    return [r.get(10) for r in [pool.apply_async(call) for _ in range(CALLS)]]


def _map(pool: ThreadPool, call: Callable[..., str]) -> list[str]:
    return pool.map(call, range(CALLS))


def _map_async(pool: ThreadPool, call: Callable[..., str]) -> list[str]:
    return pool.map_async(call, range(CALLS), chunksize=1).get(10)


def _imap(pool: ThreadPool, call: Callable[..., str]) -> list[str]:
    return list(pool.imap(call, range(CALLS)))


def _imap_unordered(pool: ThreadPool, call: Callable[..., str]) -> list[str]:
    return list(pool.imap_unordered(call, range(CALLS)))


def _starmap(pool: ThreadPool, call: Callable[..., str]) -> list[str]:
    return pool.starmap(call, [(i, i) for i in range(CALLS)])


def _starmap_async(pool: ThreadPool, call: Callable[..., str]) -> list[str]:
    return pool.starmap_async(call, [(i,) for i in range(CALLS)]).get(10)


ENTRY_POINTS = pytest.mark.parametrize(
    "run",
    [_apply, _apply_async, _map, _map_async, _imap, _imap_unordered, _starmap, _starmap_async],
)
POOLS = pytest.mark.parametrize("make", [ThreadPool, dummy.Pool], ids=["ThreadPool", "dummy"])


@pytest.fixture
def pool_before_chain(make: Callable[[int], ThreadPool]) -> Iterator[ThreadPool]:
    pool = make(2)
    try:
        yield pool
    finally:
        pool.terminate()
        pool.join()


@POOLS
@ENTRY_POINTS
def test_a_pool_made_before_the_chain_runs_its_work_in_the_chain(
    server: FakeLLMServer,
    client: openai.OpenAI,
    pool_before_chain: ThreadPool,
    run: Callable[[ThreadPool, Callable[..., str]], list[str]],
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=1)) as ctx:
        outcomes = run(pool_before_chain, _caller(client))
    assert sorted(outcomes) == ["sent"] + ["steps"] * (CALLS - 1)
    assert sent(server) == 1
    assert ctx.snapshot().steps == 1


@POOLS
def test_a_pool_made_in_chain_a_charges_chain_b_calls_to_b(
    server: FakeLLMServer, client: openai.OpenAI, make: Callable[[int], ThreadPool]
) -> None:
    call = _caller(client)
    with ExecutionContext(ExecutionConfig(max_steps=10)) as a:
        pool = make(2)
        assert pool.apply(call) == "sent"
    try:
        with ExecutionContext(ExecutionConfig(max_steps=2)) as b:
            outcomes = pool.map(call, range(CALLS)) + list(pool.imap(call, range(CALLS)))
            seen = pool.apply(current_context)
        assert pool.apply(current_context) is None  # submitted outside any chain
    finally:
        pool.terminate()
        pool.join()
    assert seen is b
    assert sorted(outcomes) == ["sent"] * 2 + ["steps"] * (2 * CALLS - 2)
    assert (a.snapshot().steps, b.snapshot().steps) == (1, 2)
    assert sent(server) == 3


def test_callbacks_run_in_the_submitting_chain(client: openai.OpenAI) -> None:
    seen: list[Any] = []
    with ThreadPool(1) as pool, ExecutionContext(ExecutionConfig(max_steps=3)) as ctx:
        pool.apply_async(int, (), {}, lambda _: seen.append(current_context())).get(10)
        pool.map_async(
            int, [1], error_callback=None, callback=lambda _: seen.append(current_context())
        ).get(10)
        pool.apply_async(_raise, error_callback=lambda _: seen.append(current_context())).wait(10)
    pool.join()
    assert seen == [ctx, ctx, ctx]


def _raise() -> None:
    raise RuntimeError("task failed")


def test_uninstrumenting_restores_the_pool_methods() -> None:
    from multiprocessing import pool as mp_pool

    from veronica_otel.instrumentors.threading import ThreadingInstrumentor

    names = ("apply_async", "_map_async", "imap", "imap_unordered")
    before = [mp_pool.Pool.__dict__[name] for name in names]
    ThreadingInstrumentor().instrument()
    try:  # (a wrapt wrapper compares equal to what it wraps: compare identities)
        assert not any(mp_pool.Pool.__dict__[n] is f for n, f in zip(names, before, strict=True))
    finally:
        ThreadingInstrumentor().uninstrument()
    assert all(mp_pool.Pool.__dict__[n] is f for n, f in zip(names, before, strict=True))
