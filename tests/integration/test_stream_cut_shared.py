"""A trip reaches a stream in flight (DESIGN G10): real ``openai`` streams, FakeLLMServer.

In-process, a stream is cut at its next chunk when its chain or any ancestor
trips, wherever in the process the trip happened. On a shared Redis/Valkey
ledger, a trip of the same chain made by another process is read from the
store at most every 16 chunks or 250 ms (``ExecutionContext.ensure_active``).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from tests._clock import FakeClock, patch_chain_clock
from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel.distributed import RedisLedger
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer, RedisServerProcess

CHAT = "/v1/chat/completions"
MODEL = "gpt-4o-mini"
WORDS = 60  # one word a chunk: long enough that an uncut stream is obvious


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=WORDS) as fake:
        fake.set_chunk_delay(0.002)  # a stream still running while the trip happens
        yield fake


@pytest.fixture
def client(server: FakeLLMServer) -> Iterator[openai.OpenAI]:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    try:
        with openai.OpenAI(base_url=server.openai_base_url, api_key="t", max_retries=0) as oai:
            yield oai
    finally:
        instrumentor.uninstrument()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    # Start at the real clock: the shared deadline timer compares with time.monotonic().
    fake = FakeClock(time.monotonic())
    patch_chain_clock(monkeypatch, fake)
    return fake


def _stream(client: openai.OpenAI) -> Any:
    return client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "count"}],
        stream=True,
        stream_options={"include_usage": True},
    )


def _read_until_cut(stream: Any, after: int, trip: Callable[[], None]) -> tuple[int, int]:
    """Read ``stream``; after ``after`` words call ``trip`` (in another thread or
    process). Returns (words before the trip, words after it) once cut."""
    words = 0
    tripped_at = -1
    with pytest.raises(BudgetExceededError):
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                words += 1
            if words == after and tripped_at < 0:
                tripped_at = words
                trip()
    assert tripped_at == after, "the stream was cut before the trip"
    return tripped_at, words - tripped_at


def _in_thread(fn: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        thread = threading.Thread(target=fn)
        thread.start()
        thread.join(timeout=30)
        assert not thread.is_alive()

    return run


# -- in-process: ancestors ------------------------------------------------------------


def test_a_child_stream_is_cut_at_its_next_chunk_when_the_parent_trips(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    parent = ExecutionContext(ExecutionConfig(max_cost_usd=1.0), chain_id="parent")
    child = parent.spawn_child(ExecutionConfig(max_cost_usd=0.5))
    with child:
        stream = _stream(client)
        # The parent overspends in another thread (a manual commit past its ceiling).
        _, after = _read_until_cut(stream, 2, _in_thread(lambda: parent.record_usage(cost_usd=2)))
        snap = child.snapshot()
    assert after == 0  # cut at the very next chunk
    assert stream.response.is_closed
    assert server.count(CHAT) == 1
    assert child.trip is not None and child.trip.chain_id == "parent"
    assert snap.reserved_usd == 0


def test_a_grandchild_stream_is_cut_when_a_sibling_trips_the_root(
    client: openai.OpenAI, server: FakeLLMServer
) -> None:
    # The root's own context never sees the trip: only its ledger level does.
    root = ExecutionContext(ExecutionConfig(max_cost_usd=1.0), chain_id="root")
    streaming = root.spawn_child().spawn_child()
    sibling = root.spawn_child()
    with streaming:
        stream = _stream(client)
        _, after = _read_until_cut(stream, 3, _in_thread(lambda: sibling.record_usage(cost_usd=2)))
    assert root._state.trip is None  # the trip lives in the ledger, not in the root object
    assert after == 0
    assert stream.response.is_closed
    assert streaming.trip is not None and streaming.trip.chain_id == "root"
    assert streaming.snapshot().reserved_usd == 0


@pytest.mark.asyncio
async def test_an_async_child_stream_is_cut_when_the_parent_trips(server: FakeLLMServer) -> None:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    try:
        async with openai.AsyncOpenAI(
            base_url=server.openai_base_url, api_key="t", max_retries=0
        ) as aclient:
            parent = ExecutionContext(ExecutionConfig(max_cost_usd=1.0), chain_id="aparent")
            words = 0
            async with parent.spawn_child() as child:
                stream = await aclient.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "count"}], stream=True
                )
                with pytest.raises(BudgetExceededError) as info:
                    async for chunk in stream:
                        if chunk.choices and chunk.choices[0].delta.content:
                            words += 1
                        if words == 2:
                            parent.record_usage(cost_usd=5)
                assert child.snapshot().reserved_usd == 0
    finally:
        instrumentor.uninstrument()
    assert words == 2
    assert info.value.chain_id == "aparent"
    assert server.count(CHAT) == 1


# -- shared store: a trip made by another process ---------------------------------------

_TRIP_ELSEWHERE = """
import sys
from veronica_otel import ExecutionConfig, ExecutionContext
from veronica_otel.distributed import RedisLedger

url, prefix, chain_id = sys.argv[1:4]
ledger = RedisLedger.from_url(url, key_prefix=prefix)
ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0), chain_id=chain_id, ledger=ledger)
ctx.record_usage(cost_usd=3.0)  # past the shared ceiling: the chain trips in the store
assert ledger.snapshot(chain_id).trip is not None
"""


def _trip_in_another_process(url: str, prefix: str, chain_id: str) -> Callable[[], None]:
    def run() -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        subprocess.run(
            [sys.executable, "-c", _TRIP_ELSEWHERE, url, prefix, chain_id],
            check=True,
            env=env,
            timeout=60,
        )

    return run


@pytest.fixture
def shared(redis_server: RedisServerProcess, redis_prefix: str) -> Iterator[RedisLedger]:
    ledger = RedisLedger.from_url(redis_server.url, key_prefix=redis_prefix)
    yield ledger
    ledger.client.close()


def test_a_stream_is_cut_within_16_chunks_of_a_trip_in_another_process(
    client: openai.OpenAI,
    server: FakeLLMServer,
    shared: RedisLedger,
    redis_server: RedisServerProcess,
    redis_prefix: str,
    clock: FakeClock,
) -> None:
    # The clock stands still: only the chunk count bounds how late the cut is.
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0), chain_id="shared", ledger=shared)
    with ctx:
        stream = _stream(client)
        trip = _trip_in_another_process(redis_server.url, redis_prefix, "shared")
        before, after = _read_until_cut(stream, 2, trip)
        snap = ctx.snapshot()
    assert after <= 16
    assert before + after < WORDS
    assert stream.response.is_closed
    assert server.count(CHAT) == 1
    assert ctx.trip is not None and ctx.trip.chain_id == "shared"
    assert snap.reserved_usd == 0


def test_a_stream_is_cut_at_the_next_chunk_250ms_after_a_trip_elsewhere(
    client: openai.OpenAI,
    server: FakeLLMServer,
    shared: RedisLedger,
    redis_server: RedisServerProcess,
    redis_prefix: str,
    clock: FakeClock,
) -> None:
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0), chain_id="timed", ledger=shared)
    trip = _trip_in_another_process(redis_server.url, redis_prefix, "timed")

    def trip_then_wait() -> None:
        trip()
        clock.advance(0.25)  # the poll interval passes before the next chunk

    with ctx:
        stream = _stream(client)
        _, after = _read_until_cut(stream, 1, trip_then_wait)
    assert after == 0
    assert stream.response.is_closed
    assert ctx.snapshot().reserved_usd == 0


def test_a_child_stream_is_cut_when_its_parent_trips_in_another_process(
    client: openai.OpenAI,
    shared: RedisLedger,
    redis_server: RedisServerProcess,
    redis_prefix: str,
    clock: FakeClock,
) -> None:
    parent = ExecutionContext(ExecutionConfig(max_cost_usd=1.0), chain_id="up", ledger=shared)
    with parent.spawn_child() as child:
        stream = _stream(client)
        trip = _trip_in_another_process(redis_server.url, redis_prefix, "up")
        _, after = _read_until_cut(stream, 2, trip)
    assert after <= 16
    assert child.trip is not None and child.trip.chain_id == "up"


def test_a_store_down_mid_stream_does_not_cut_it_and_is_logged_once(
    client: openai.OpenAI,
    server: FakeLLMServer,
    restartable_redis: RedisServerProcess,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The stream is paid for already: an unreadable store does not waste it;
    # the next call fails closed when it reserves.
    ledger = RedisLedger.from_url(restartable_redis.url, key_prefix="down:", fail_open=False)
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0), chain_id="down", ledger=ledger)
    failed_reads = 0
    read = ledger.snapshot

    def counted(chain_id: str) -> Any:
        nonlocal failed_reads
        try:
            return read(chain_id)
        except Exception:
            if words < WORDS:  # the stream's polls; not the span's read when it ends
                failed_reads += 1
            raise

    words = 0
    with caplog.at_level(logging.WARNING, logger="veronica_otel"), ctx:
        ledger.snapshot = counted  # type: ignore[method-assign]
        for chunk in _stream(client):
            if chunk.choices and chunk.choices[0].delta.content:
                words += 1
                if words == 2:
                    restartable_redis.kill()
                if words == 40:
                    assert failed_reads == 1  # then no read for 5 s, however many chunks
                    clock.advance(5.0)
        ledger.snapshot = read  # type: ignore[method-assign]
    assert words == WORDS  # read to the end, through the failed reads
    assert failed_reads == 2
    warned = [r for r in caplog.records if "could not read the store for trips" in r.getMessage()]
    assert len(warned) == 1
    restartable_redis.start()
    assert ledger.flush() == 0  # the settlement queued while down is applied
    snap = ctx.snapshot()
    assert snap.reserved_usd == 0 and snap.cost_usd > 0
    ledger.client.close()
