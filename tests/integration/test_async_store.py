"""Async calls on a Valkey-backed chain use the ledger's asyncio client, never the sync one.

Real Valkey (``redis_url`` / ``restartable_redis``), the real ``openai`` SDK
against FakeLLMServer, real tasks and cancellations. The ledger's sync client
counts the commands it sends (a ``redis.Redis`` subclass, nothing mocked):
async calls must leave it at zero while the store's own counters move.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any

import openai
import pytest
import pytest_asyncio
import redis
from openai.types.chat import ChatCompletionMessageParam
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket, WebSocketDisconnect

from tests._bounds import input_bound
from veronica_otel import (
    BudgetExceededError,
    BudgetPool,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    LocalLedger,
    WrapOptions,
    agent,
    contained_tool,
    current_context,
)
from veronica_otel._agent_limits import agent_level_id
from veronica_otel._grants import Spent, verify_spent
from veronica_otel._ledger import Level, Limits, Reservation
from veronica_otel._pricing import default_price_table
from veronica_otel._tools import ToolCall
from veronica_otel._units import nano_to_usd
from veronica_otel.distributed import LedgerUnavailableError, RedisLedger
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.middleware import VeronicaASGIMiddleware
from veronica_otel.testing import FakeLLMServer, RedisClusterProcess, RedisServerProcess

CHAT = "/v1/chat/completions"
MODEL = "gpt-4o-mini"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]
HINT = WrapOptions(cost_estimate_hint=0.1)


class CountingRedis(redis.Redis):
    """A real client that remembers every command it sends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[str] = []

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent.append(str(args[0]))
        return super().execute_command(*args, **options)


def counting_ledger(
    url: str, prefix: str, *, timeout: float = 2.0, **options: Any
) -> tuple[RedisLedger, CountingRedis]:
    # A dead store refuses at once; a long connect wait only spares a busy machine
    # (200 connections opened at once) a "Timeout connecting" that is not the code.
    client = CountingRedis.from_url(url, socket_timeout=timeout, socket_connect_timeout=10.0)
    return RedisLedger(client, key_prefix=prefix, **options), client


@pytest.fixture
def ledger(redis_url: str, redis_prefix: str) -> Iterator[tuple[RedisLedger, CountingRedis]]:
    found = counting_ledger(redis_url, redis_prefix)
    yield found
    found[0].close()


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=6) as fake:
        yield fake


@pytest_asyncio.fixture
async def aclient(server: FakeLLMServer) -> AsyncIterator[openai.AsyncOpenAI]:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    try:
        async with openai.AsyncOpenAI(
            base_url=server.openai_base_url, api_key="test", max_retries=0
        ) as client:
            yield client
    finally:
        instrumentor.uninstrument()


async def noop() -> str:
    return "done"


# -- the async path is the one used -------------------------------------------------


@pytest.mark.asyncio
async def test_async_openai_calls_use_the_async_client(
    ledger: tuple[RedisLedger, CountingRedis], aclient: openai.AsyncOpenAI, server: FakeLLMServer
) -> None:
    store, sync = ledger
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=10), ledger=store) as ctx:
        await aclient.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=20)
        await aclient.chat.completions.create(model=MODEL, messages=MESSAGES)  # clamped
        stream = await aclient.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=20, stream=True
        )
        text = [c.choices[0].delta.content async for c in stream if c.choices]
        sent_by_sync = list(sync.sent)
        chain = ctx.chain_id
    assert sent_by_sync == []
    assert store.async_clients == 1
    assert server.count(CHAT) == 3
    assert "".join(t or "" for t in text)
    state = store.snapshot(chain)  # the store's own counters saw all three
    assert (state.steps, state.reserved_nano) == (3, 0)
    assert state.cost_nano > 0 and state.tokens > 0


@pytest.mark.asyncio
async def test_sdk_retries_of_async_calls_draw_through_the_async_client(
    ledger: tuple[RedisLedger, CountingRedis], server: FakeLLMServer
) -> None:
    store, sync = ledger
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    try:
        async with openai.AsyncOpenAI(
            base_url=server.openai_base_url, api_key="test", max_retries=3
        ) as client:
            config = ExecutionConfig(max_retries_total=1)
            with ExecutionContext(config, ledger=store) as ctx:
                server.fail_next(1, status=500, retry_after_ms=0)
                await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5)
                server.fail_next(3, status=500, retry_after_ms=0)
                with pytest.raises(BudgetExceededError) as info:
                    await client.chat.completions.create(
                        model=MODEL, messages=MESSAGES, max_tokens=5
                    )
                sent_by_sync = list(sync.sent)
                chain = ctx.chain_id
    finally:
        instrumentor.uninstrument()
    assert info.value.reason == "retries"
    assert sent_by_sync == []
    assert server.count(CHAT) == 3  # 2 + 1: the second call's retry was never sent
    assert store.snapshot(chain).retries == 1


@pytest.mark.asyncio
async def test_agent_limits_on_the_async_path(
    ledger: tuple[RedisLedger, CountingRedis], server: FakeLLMServer
) -> None:
    """An agent's own level is reserved, settled and drawn from (retries) through
    the async client; its denial stops only that agent, the chain goes on."""
    store, sync = ledger
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    limits = ExecutionConfig(max_cost_usd=0.5, max_steps=2, max_retries_total=0)
    try:
        async with openai.AsyncOpenAI(
            base_url=server.openai_base_url, api_key="test", max_retries=2
        ) as client:
            config = ExecutionConfig(max_cost_usd=1.0, max_steps=10, max_retries_total=5)
            with ExecutionContext(config, ledger=store) as ctx:
                with agent("researcher", config=limits):
                    for _ in range(2):
                        await client.chat.completions.create(
                            model=MODEL, messages=MESSAGES, max_tokens=5
                        )
                    with pytest.raises(BudgetExceededError) as steps:
                        await client.chat.completions.create(
                            model=MODEL, messages=MESSAGES, max_tokens=5
                        )
                with agent("critic", config=limits):
                    server.fail_next(1, status=500, retry_after_ms=0)
                    with pytest.raises(BudgetExceededError) as retries:
                        await client.chat.completions.create(
                            model=MODEL, messages=MESSAGES, max_tokens=5
                        )
                await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5)
                sent_by_sync = list(sync.sent)
                chain = ctx.chain_id
    finally:
        instrumentor.uninstrument()
    assert (steps.value.agent, steps.value.reason, steps.value.chain_id) == (
        "researcher",
        "steps",
        chain,
    )
    assert (retries.value.agent, retries.value.reason) == ("critic", "retries")
    assert sent_by_sync == []
    assert server.count(CHAT) == 4  # 2 researcher, 1 critic (its retry never sent), 1 chain
    researcher = store.snapshot(agent_level_id(chain, "researcher"))
    assert (researcher.steps, researcher.reserved_nano) == (2, 0)  # committed on its level
    assert researcher.cost_nano > 0
    critic = store.snapshot(agent_level_id(chain, "critic"))
    assert (critic.steps, critic.retries, critic.reserved_nano) == (1, 0, 0)
    state = store.snapshot(chain)
    assert (state.steps, state.reserved_nano, state.trip) == (4, 0, None)


@pytest.mark.asyncio
async def test_awrap_and_async_tools_use_the_async_client(
    ledger: tuple[RedisLedger, CountingRedis],
) -> None:
    store, sync = ledger

    @contained_tool(cost_usd=0.05)
    async def search(query: str) -> str:
        return query

    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=4), ledger=store) as ctx:
        assert await ctx.awrap_llm_call(noop, HINT) is Decision.ALLOW
        assert await ctx.awrap_tool_call(noop, HINT) is Decision.ALLOW
        async with ToolCall("lookup", cost_usd=0.02) as tool:
            assert tool.active
        assert await search("q") == "q"
        assert await ctx.awrap_llm_call(noop, HINT) is Decision.HALT  # the fifth step
        sent_by_sync = list(sync.sent)
        chain = ctx.chain_id
    assert sent_by_sync == []
    state = store.snapshot(chain)
    assert (state.steps, state.cost_nano, state.reserved_nano) == (4, 270_000_000, 0)
    assert state.trip is not None and state.trip.reason == "steps"


def test_async_clients_per_loop_and_thread_are_closed_with_their_loop(
    ledger: tuple[RedisLedger, CountingRedis],
) -> None:
    store, sync = ledger
    ctx = ExecutionContext(ExecutionConfig(max_steps=10), ledger=store)
    decisions: list[Decision] = []

    def run_one() -> None:
        decisions.append(asyncio.run(ctx.awrap_llm_call(noop)))

    run_one()
    threads = [threading.Thread(target=run_one) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    run_one()
    assert decisions == [Decision.ALLOW] * 5
    assert store.async_clients == 0  # each loop's client closed as its loop ended
    assert sync.sent == []
    assert store.snapshot(ctx.chain_id).steps == 5


@pytest.mark.asyncio
async def test_an_async_stream_is_cut_by_a_trip_made_elsewhere_polling_asynchronously(
    ledger: tuple[RedisLedger, CountingRedis], redis_url: str, redis_prefix: str
) -> None:
    store, sync = ledger
    other = RedisLedger.from_url(redis_url, key_prefix=redis_prefix)  # another client
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    words = 0
    try:
        with FakeLLMServer(output_tokens=60) as long_server:
            async with openai.AsyncOpenAI(
                base_url=long_server.openai_base_url, api_key="test", max_retries=0
            ) as client:
                config = ExecutionConfig(max_cost_usd=1.0)
                with ExecutionContext(config, chain_id="async-cut", ledger=store):
                    stream = await client.chat.completions.create(
                        model=MODEL, messages=MESSAGES, max_tokens=100, stream=True
                    )
                    with pytest.raises(BudgetExceededError) as info:
                        async for chunk in stream:
                            if chunk.choices and chunk.choices[0].delta.content:
                                words += 1
                            if words == 2:
                                elsewhere = ExecutionContext(
                                    config, chain_id="async-cut", ledger=other
                                )
                                elsewhere.record_usage(cost_usd=3.0)  # trips in the store
                    sent_by_sync = list(sync.sent)
                    reserved = (await store.asnapshot("async-cut")).reserved_nano
    finally:
        instrumentor.uninstrument()
        other.close()
    assert info.value.chain_id == "async-cut"
    assert 2 <= words <= 2 + 16  # cut within 16 chunks of the trip
    assert sent_by_sync == []  # the store was polled through the async client
    assert reserved == 0


# -- cancellation -------------------------------------------------------------------


def _wait_until_blocked(url: str, count: int) -> None:
    """Until ``count`` clients wait on the paused store (their command arrived)."""
    admin = redis.Redis.from_url(url)
    try:
        deadline = time.monotonic() + 5.0
        while int(admin.info("clients")["blocked_clients"]) < count:
            assert time.monotonic() < deadline, "the command never reached the store"
    finally:
        admin.close()


# Loop turns for a sent command's coroutine to leave its send (three suffice).
_SEND_TURNS = 10


async def cancel_in_flight(task: asyncio.Task[Any], url: str) -> None:
    """Cancel ``task`` once its command waits on the paused store at ``url``.

    The store sees the command while redis-py still awaits the writer's drain
    inside ``asyncio.wait_for``, and Python 3.11's ``wait_for`` loses a cancel
    that lands as its inner future completes (CPython gh-86296): the task would
    run on to the reply. Turns of the loop, not a clock, let the send finish,
    so the cancel lands where a real one mostly does: on the awaited reply.
    """
    await asyncio.to_thread(_wait_until_blocked, url, 1)
    for _ in range(_SEND_TURNS):
        await asyncio.sleep(0)
    task.cancel()


@pytest.mark.asyncio
async def test_cancelled_mid_reserve_leaks_nothing(redis_url: str, redis_prefix: str) -> None:
    # A reply timeout longer than a loaded machine takes to see the command
    # blocked: the cancel, not the timeout, must end the round trip.
    store, sync = counting_ledger(redis_url, redis_prefix, timeout=8.0)
    ran: list[int] = []

    async def tool() -> None:
        ran.append(1)

    admin = redis.Redis.from_url(redis_url)
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=5), ledger=store) as ctx:
        assert await ctx.awrap_llm_call(noop, HINT) is Decision.ALLOW  # scripts loaded
        admin.execute_command("CLIENT", "PAUSE", "10000", "WRITE")
        try:
            task = asyncio.create_task(ctx.awrap_llm_call(tool, HINT))
            await cancel_in_flight(task, redis_url)  # the reserve's reply not back
            with pytest.raises(asyncio.CancelledError):
                await task
            assert store.pending == 1  # its release, queued at once
        finally:
            admin.execute_command("CLIENT", "UNPAUSE")
            admin.close()
        assert await store.aflush() == 0
        sent_by_sync = list(sync.sent)
        chain = ctx.chain_id
    assert ran == []
    assert sent_by_sync == []
    state = store.snapshot(chain)
    store.close()
    # Whether the paused reserve ran before or after its release: nothing held.
    assert (state.steps, state.cost_nano, state.reserved_nano) == (1, 100_000_000, 0)


async def _cancel_after(admin: redis.Redis, work: Coroutine[Any, Any, Any], turns: int) -> None:
    """Run ``work`` as a task on a store paused for writes, cancel it after ``turns``
    turns of the loop, and check the cancel raised. Paused longer than a busy
    machine takes for these turns: a dropped cancel waits the pause out, and
    must still raise."""
    admin.execute_command("CLIENT", "PAUSE", "1000", "WRITE")
    try:
        task = asyncio.create_task(work)
        for _ in range(turns):
            await asyncio.sleep(0)
        assert task.cancel(), turns
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")


@pytest.mark.asyncio
async def test_a_cancel_at_any_turn_of_the_reserve_stops_the_call(
    redis_url: str, redis_prefix: str
) -> None:
    """Cancelled after 0, 1, 2, ... turns of the loop, across the reserve's round
    trip: every cancel raises, nothing runs, nothing stays reserved. Some of
    these turns end the send, where Python 3.11's ``wait_for`` inside redis-py
    drops a cancel (CPython gh-86296): the ledger raises it once the reply is in."""
    store, _ = counting_ledger(redis_url, redis_prefix, timeout=8.0)
    ran: list[int] = []

    async def tool() -> None:
        ran.append(1)

    admin = redis.Redis.from_url(redis_url)
    try:
        with ExecutionContext(ExecutionConfig(max_cost_usd=100.0), ledger=store) as ctx:
            assert await ctx.awrap_llm_call(noop, HINT) is Decision.ALLOW  # scripts loaded
            for turns in range(_SEND_TURNS * 2):
                await _cancel_after(admin, ctx.awrap_llm_call(tool, HINT), turns)
                assert await store.aflush() == 0
            chain = ctx.chain_id
        state = store.snapshot(chain)
    finally:
        admin.close()
        store.close()
    assert ran == []
    assert state.reserved_nano == 0


@pytest.mark.asyncio
async def test_a_cancel_at_any_turn_of_a_commit_raises_and_counts_it_once(
    redis_url: str, redis_prefix: str
) -> None:
    """The commit's twin of the sweep above: each cancelled commit raises,
    is replayed by its id, and counts once. From turn 1: a task cancelled
    before its first turn never runs (a caller's own ``await`` starts it)."""
    store, _ = counting_ledger(redis_url, redis_prefix, timeout=8.0)
    path = [Level("cancelled-commits", Limits())]
    admin = redis.Redis.from_url(redis_url)
    commits = _SEND_TURNS * 2
    try:
        for turns in range(1, commits + 1):
            held = await store.areserve(path, 100, 0)
            assert isinstance(held, Reservation)
            await _cancel_after(admin, store.acommit(path, held, 7, 0), turns)
            assert await store.aflush() == 0
        state = store.snapshot("cancelled-commits")
    finally:
        admin.close()
        store.close()
    assert (state.steps, state.cost_nano, state.reserved_nano) == (commits, 7 * commits, 0)


@pytest.mark.asyncio
async def test_cancelled_mid_call_commits_the_reservation(
    ledger: tuple[RedisLedger, CountingRedis], aclient: openai.AsyncOpenAI, server: FakeLLMServer
) -> None:
    store, sync = ledger
    arrived, release = threading.Event(), threading.Event()

    def hold(request: Any) -> None:
        arrived.set()  # the request reached the provider: it may be billed
        release.wait(10.0)

    server.set_responder(hold)
    try:
        with ExecutionContext(ExecutionConfig(max_cost_usd=1.0), ledger=store) as ctx:
            task = asyncio.create_task(
                aclient.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=50)
            )
            assert await asyncio.to_thread(arrived.wait, 5.0)
            held = (await store.asnapshot(ctx.chain_id)).reserved_nano
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            sent_by_sync = list(sync.sent)
            chain = ctx.chain_id
    finally:
        release.set()
        server.set_responder(None)
    assert held > 0
    assert sent_by_sync == []
    state = store.snapshot(chain)
    assert (state.steps, state.cost_nano, state.reserved_nano) == (1, held, 0)  # G10


# -- outage and recovery ------------------------------------------------------------


@pytest.mark.asyncio
async def test_outage_queues_async_commits_fails_closed_and_recovers(
    restartable_redis: RedisServerProcess, redis_prefix: str
) -> None:
    store, sync = counting_ledger(restartable_redis.url, redis_prefix, fail_open=False)
    ran: list[int] = []

    async def tool() -> None:
        ran.append(1)

    try:
        with ExecutionContext(ExecutionConfig(max_steps=10), ledger=store) as ctx:
            assert await ctx.awrap_llm_call(noop, HINT) is Decision.ALLOW
            handle = await ctx.abegin_call("llm", HINT)  # in flight when the store dies
            restartable_redis.kill()
            await handle.afinish()  # never raises: its commit waits in the queue
            assert store.pending == 1
            with pytest.raises(LedgerUnavailableError):
                await ctx.abegin_call("llm", HINT)
            assert await ctx.awrap_llm_call(tool, HINT) is Decision.HALT  # fail closed
            assert ran == []
            restartable_redis.start()
            assert await ctx.awrap_llm_call(tool, HINT) is Decision.ALLOW  # queue replayed
            assert store.pending == 0
            sent_by_sync = list(sync.sent)
            chain = ctx.chain_id
        state = store.snapshot(chain)
    finally:
        store.close()
    assert ran == [1]
    assert sent_by_sync == []
    assert (state.steps, state.cost_nano, state.reserved_nano) == (3, 300_000_000, 0)


# -- concurrency --------------------------------------------------------------------


@pytest.mark.asyncio
async def test_200_concurrent_async_calls_never_pass_the_chain_limit(
    ledger: tuple[RedisLedger, CountingRedis], aclient: openai.AsyncOpenAI, server: FakeLLMServer
) -> None:
    store, sync = ledger
    limit = 37
    with ExecutionContext(ExecutionConfig(max_steps=limit), ledger=store) as ctx:

        async def one() -> bool:
            try:
                await aclient.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10)
            except BudgetExceededError:
                return False
            return True

        outcomes = await asyncio.gather(*(one() for _ in range(200)))
        sent_by_sync = list(sync.sent)
        chain = ctx.chain_id
    assert sent_by_sync == []
    assert sum(outcomes) == limit
    assert server.count(CHAT) == limit  # the provider's own count: never limit + 1
    state = store.snapshot(chain)
    assert (state.steps, state.reserved_nano) == (limit, 0)


@pytest.mark.asyncio
async def test_more_concurrent_calls_than_connections_wait_for_one_and_count_exactly(
    ledger: tuple[RedisLedger, CountingRedis],
) -> None:
    store, sync = ledger
    # 300 reservations in flight at once, more than a loop's client has
    # connections: the rest wait for one (never a denial), and the cost
    # ceiling admits exactly 150 of them.
    with ExecutionContext(ExecutionConfig(max_cost_usd=15.0), ledger=store) as ctx:
        decisions = await asyncio.gather(*(ctx.awrap_llm_call(noop, HINT) for _ in range(300)))
        sent_by_sync = list(sync.sent)
        chain = ctx.chain_id
    assert decisions.count(Decision.ALLOW) == 150
    assert sent_by_sync == []
    state = store.snapshot(chain)
    assert (state.steps, state.cost_nano, state.reserved_nano) == (150, 15_000_000_000, 0)


@pytest.mark.asyncio
async def test_200_async_calls_queue_for_two_connections_and_all_settle_exactly(
    redis_url: str, redis_prefix: str, aclient: openai.AsyncOpenAI, server: FakeLLMServer
) -> None:
    """Waiting for a connection is queueing, not an outage: with two connections
    and a short reply timeout, 200 concurrent calls wait far longer than that
    timeout for their turn, and every one is admitted and settled exactly."""
    one = LocalLedger()  # what one such call costs: the 200 cost 200 times that
    async with ExecutionContext(ExecutionConfig(), ledger=one) as ctx:
        await aclient.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10)
    each = one.snapshot(ctx.chain_id).cost_nano
    sync = CountingRedis.from_url(redis_url, socket_timeout=2.0, socket_connect_timeout=1.0)
    store = RedisLedger(sync, key_prefix=redis_prefix, async_connections=2, fail_open=False)
    counter = redis.Redis.from_url(redis_url)  # the server's own count of connections
    before = counter.info("stats")["total_connections_received"]
    try:
        async with ExecutionContext(ExecutionConfig(max_steps=10_000), ledger=store) as ctx:
            replies = await asyncio.gather(
                *(
                    aclient.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10)
                    for _ in range(200)
                )
            )
        state = await store.asnapshot(ctx.chain_id)
        opened = counter.info("stats")["total_connections_received"] - before
    finally:
        await store.aclose()
        store.close()
        sync.close()
        counter.close()
    assert len(replies) == 200
    assert server.count(CHAT) == 201  # the provider's own count (one priced call first)
    assert sync.sent == []  # every round trip was the asyncio client's
    assert (state.steps, state.cost_nano, state.reserved_nano) == (200, 200 * each, 0)
    assert each > 0
    assert opened <= 2


@pytest.mark.asyncio
async def test_a_hung_store_fails_a_queue_of_async_calls_closed_within_one_timeout() -> None:
    """A store that accepts connections and never answers: the first calls time
    out on their reply, and every call queued behind them fails closed with that
    outage at once, without opening a connection of its own (the store saw only
    as many connections as the cap)."""
    hung = socket.create_server(("127.0.0.1", 0), backlog=64)
    ran: list[int] = []

    async def tool() -> None:
        ran.append(1)

    store = RedisLedger.from_url(
        f"redis://127.0.0.1:{hung.getsockname()[1]}/0",
        socket_timeout=0.5,
        socket_connect_timeout=0.5,
        fail_open=False,
        async_connections=2,
    )
    store._link.checked = True  # the persistence check would spend a timeout of its own
    try:
        async with ExecutionContext(ExecutionConfig(max_steps=100), ledger=store) as ctx:
            decisions = await asyncio.gather(*(ctx.awrap_llm_call(tool, HINT) for _ in range(20)))
            with pytest.raises(LedgerUnavailableError) as info:
                await ctx.abegin_call("llm", HINT)  # a new call still tries the store
        hung.setblocking(False)
        accepted = 0
        while True:
            try:
                conn, _ = hung.accept()
            except BlockingIOError:
                break
            conn.close()
            accepted += 1
    finally:
        await store.aclose()
        store.close()
        hung.close()
    assert decisions == [Decision.HALT] * 20  # fail closed (G10)
    assert ran == []
    assert isinstance(info.value.__cause__, redis.TimeoutError)
    # The first two calls and the new one, plus the chain span's end-of-chain
    # read where a TracerProvider records it: the 18 queued calls never connected.
    assert 3 <= accepted <= 4


@pytest.mark.asyncio
async def test_an_uncapped_async_call_is_clamped_by_its_pool_read_without_blocking(
    ledger: tuple[RedisLedger, CountingRedis], aclient: openai.AsyncOpenAI, server: FakeLLMServer
) -> None:
    """The clamp reads the chain's and its pools' room through the async client."""
    store, sync = ledger
    prices = default_price_table().lookup("openai", MODEL)
    assert prices is not None
    budget = prices.max_cost_nano(input_bound([MESSAGES], 1), 100)  # buys 100 output tokens
    pool = BudgetPool("tenant:clamp", max_cost_usd=nano_to_usd(budget), ledger=store)
    async with ExecutionContext(ExecutionConfig(max_cost_usd=5.0), ledger=store, pools=[pool]):
        await aclient.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert sync.sent == []
    assert server.requests[-1].body["max_completion_tokens"] == 100


# -- the ASGI middleware ------------------------------------------------------------


def test_asgi_middleware_on_a_valkey_ledger(ledger: tuple[RedisLedger, CountingRedis]) -> None:
    store, sync = ledger

    async def endpoint(request: Request) -> JSONResponse:
        ctx = current_context()
        assert ctx is not None
        decision = await ctx.awrap_llm_call(noop, HINT)
        return JSONResponse({"decision": decision.value, "chain": ctx.chain_id})

    app = Starlette(routes=[Route("/", endpoint)])
    wrapped = VeronicaASGIMiddleware(app, config=ExecutionConfig(max_steps=1), ledger=store)
    with TestClient(wrapped) as http:
        replies = [http.get("/").json() for _ in range(3)]
    assert [r["decision"] for r in replies] == ["ALLOW"] * 3
    scripts = [name for name in sync.sent if name.upper().startswith("EVAL")]
    assert scripts == []  # every reserve and commit went through the async client
    for reply in replies:
        state = store.snapshot(reply["chain"])
        assert (state.steps, state.cost_nano, state.reserved_nano) == (1, 100_000_000, 0)


def test_asgi_spend_back_header_is_read_from_the_store_without_blocking(
    ledger: tuple[RedisLedger, CountingRedis], span_exporter: InMemorySpanExporter
) -> None:
    """A granted request's signed ``veronica-spent`` header (what the handler
    spent, read from the store after it returned) and its chain span's totals
    come through the async client."""
    from tests.integration.test_middleware import KEY, baggage, make_grant

    store, sync = ledger

    async def endpoint(request: Request) -> JSONResponse:
        ctx = current_context()
        assert ctx is not None
        for _ in range(2):
            await ctx.awrap_llm_call(noop, HINT)
        return JSONResponse({"chain": ctx.chain_id})

    app = Starlette(routes=[Route("/", endpoint)])
    wrapped = VeronicaASGIMiddleware(
        app, config=ExecutionConfig(max_steps=5), ledger=store, grant_key=KEY
    )
    grant = make_grant(steps=5)
    with TestClient(wrapped) as http:
        response = http.get("/", headers=baggage(grant))
    assert response.status_code == 200
    used = verify_spent(response.headers["veronica-spent"], KEY, grant.nonce, "testserver")
    assert isinstance(used, Spent) and (used.steps, used.cost_nano) == (2, 200_000_000)
    assert sync.sent == []  # the reserves, commits, the spend and the totals: all async
    chain = response.json()["chain"]
    (span,) = [
        s for s in span_exporter.get_finished_spans() if s.attributes["veronica.chain.id"] == chain
    ]
    assert (span.attributes["veronica.steps"], span.attributes["veronica.decision"]) == (2, "ALLOW")


@pytest.mark.asyncio
async def test_async_with_reads_the_chain_spans_totals_without_blocking(
    ledger: tuple[RedisLedger, CountingRedis], span_exporter: InMemorySpanExporter
) -> None:
    store, sync = ledger
    async with ExecutionContext(
        ExecutionConfig(max_cost_usd=1.0, max_steps=4), ledger=store
    ) as ctx:
        assert await ctx.awrap_llm_call(noop, HINT) is Decision.ALLOW
    assert sync.sent == []
    (span,) = [
        s
        for s in span_exporter.get_finished_spans()
        if s.attributes["veronica.chain.id"] == ctx.chain_id and s.name.startswith("invoke_")
    ]
    attributes = span.attributes
    assert (attributes["veronica.steps"], attributes["veronica.cost_usd"]) == (1, 0.1)
    assert attributes["veronica.remaining.steps"] == 3
    assert attributes["veronica.remaining.cost_usd"] == pytest.approx(0.9)


@pytest.mark.asyncio
async def test_async_with_reads_its_pools_room_without_blocking(
    ledger: tuple[RedisLedger, CountingRedis], span_exporter: InMemorySpanExporter
) -> None:
    """The chain span's remaining budget counts its pools' room, read through the async client."""
    store, sync = ledger
    pool = BudgetPool("tenant:span", max_steps=5, max_cost_usd=0.5, window="1h", ledger=store)
    config = ExecutionConfig(max_cost_usd=1.0, max_steps=4)
    async with ExecutionContext(config, ledger=store, pools=[pool]) as ctx:
        for _ in range(2):
            assert await ctx.awrap_llm_call(noop, HINT) is Decision.ALLOW
    assert sync.sent == []
    (span,) = [
        s
        for s in span_exporter.get_finished_spans()
        if s.attributes["veronica.chain.id"] == ctx.chain_id and s.name.startswith("invoke_")
    ]
    assert span.attributes["veronica.remaining.steps"] == 2  # the chain's 4 less 2
    assert span.attributes["veronica.remaining.cost_usd"] == pytest.approx(0.3)  # the pool's


def test_asgi_websocket_steps_on_a_valkey_ledger(
    ledger: tuple[RedisLedger, CountingRedis],
) -> None:
    store, sync = ledger
    chains: list[str] = []

    async def echo(socket: WebSocket) -> None:
        ctx = current_context()
        assert ctx is not None
        chains.append(ctx.chain_id)
        await socket.accept()
        while True:
            text = await socket.receive_text()
            await socket.send_text(text.upper())

    app = Starlette(routes=[WebSocketRoute("/ws", echo)])
    wrapped = VeronicaASGIMiddleware(app, config=ExecutionConfig(max_steps=4), ledger=store)
    with TestClient(wrapped) as http, http.websocket_connect("/ws") as socket:
        socket.send_text("a")  # receive 1, send 2
        assert socket.receive_text() == "A"
        socket.send_text("b")  # receive 3, send 4
        assert socket.receive_text() == "B"
        socket.send_text("c")  # receive 5: denied by the store
        with pytest.raises(WebSocketDisconnect) as closed:
            socket.receive_text()
    assert closed.value.code == 1008
    assert [name for name in sync.sent if name.upper().startswith("EVAL")] == []
    state = store.snapshot(chains[0])
    assert (state.steps, state.reserved_nano) == (4, 0)
    assert state.trip is not None and state.trip.reason == "steps"


# -- fork and cluster ---------------------------------------------------------------


def test_a_forked_child_never_uses_the_parents_async_connections(
    ledger: tuple[RedisLedger, CountingRedis],
) -> None:
    store, sync = ledger
    ctx = ExecutionContext(ExecutionConfig(max_steps=10), ledger=store)
    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(ctx.awrap_llm_call(noop)) is Decision.ALLOW
        parent_client = store._aio._by_loop[loop].client
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: the same loop object, its own connections
            code = 1
            try:
                allowed = loop.run_until_complete(ctx.awrap_llm_call(noop)) is Decision.ALLOW
                fresh = store._aio._by_loop[loop].client is not parent_client
                os.write(write, b"ok" if allowed and fresh else b"no")
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        assert os.read(read, 2) == b"ok"
        os.close(read)
        assert os.waitpid(pid, 0)[1] == 0
        assert loop.run_until_complete(ctx.awrap_llm_call(noop)) is Decision.ALLOW
        assert store._aio._by_loop[loop].client is parent_client  # untouched by the child
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    assert sync.sent == []
    assert store.snapshot(ctx.chain_id).steps == 3


def test_async_calls_on_a_redis_cluster(
    redis_cluster: RedisClusterProcess, redis_prefix: str
) -> None:
    store = RedisLedger.from_url(redis_cluster.url, key_prefix=redis_prefix)
    ctx = ExecutionContext(ExecutionConfig(max_steps=2), ledger=store)

    async def calls() -> list[Decision]:
        return [await ctx.awrap_llm_call(noop, HINT) for _ in range(3)]

    try:
        assert asyncio.run(calls()) == [Decision.ALLOW, Decision.ALLOW, Decision.HALT]
        state = store.snapshot(ctx.chain_id)
    finally:
        store.close()
    assert (state.steps, state.cost_nano, state.reserved_nano) == (2, 200_000_000, 0)
    assert store.async_clients == 0


# -- pools on the shared store, from async code -------------------------------------


@pytest.mark.asyncio
async def test_async_calls_in_a_redis_pool_count_exactly_and_settle(
    ledger: tuple[RedisLedger, CountingRedis], aclient: openai.AsyncOpenAI, server: FakeLLMServer
) -> None:
    """Pooled reservations and settlements go through the asyncio client too; the bound is exact."""
    store, sync = ledger
    pool = BudgetPool("tenant:async", max_steps=4, window="1h", ledger=store)

    async def one() -> bool:
        try:
            await aclient.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5)
        except BudgetExceededError as exc:
            assert exc.pool == "tenant:async"
            return False
        return True

    admitted = 0
    for _ in range(3):  # three chains, one after another, share the pool
        async with ExecutionContext(ExecutionConfig(max_steps=10), ledger=store, pools=[pool]):
            admitted += sum(await asyncio.gather(*(one() for _ in range(3))))
    assert sync.sent == []
    assert admitted == 4
    assert server.count(CHAT) == 4
    snap = pool.snapshot()
    assert (snap.steps, snap.reserved_steps, snap.reserved_tokens) == (4, 0, 0)
