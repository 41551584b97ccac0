"""What a failed, cancelled or half-finished openai call costs (DESIGN G10), with the real SDK.

Each row of the charging rule, sync and async, streamed and not, against a
real server whose request count is the truth for what was sent:

- nothing sent (connection refused, interrupted before sending): released;
- an attempt may have reached the provider and no usage came back (timeout,
  connection dropped, cancellation, KeyboardInterrupt, usage null / [] / a
  string / negative, a stream that ended or broke without its usage): the
  reservation;
- HTTP error replies only: zero cost, the step counts;
- absurd usage: the caller gets the reply, the chain trips, nothing stays reserved.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import openai
import openai._base_client as base_client
import pytest
import pytest_asyncio
import redis
from openai.types.chat import ChatCompletionMessageParam
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tests._bounds import input_bound
from tests._clock import FakeClock
from tests.integration._raw_server import RawServer, Reply, chat_completion, chat_sse
from veronica_otel import (
    BudgetExceededError,
    ChainSnapshot,
    CircuitBreaker,
    CircuitState,
    ExecutionConfig,
    ExecutionContext,
)
from veronica_otel._pricing import default_price_table
from veronica_otel._units import nano_to_usd
from veronica_otel.distributed import RedisLedger
from veronica_otel.instrumentors._breakers import configure_endpoint_breakers
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer

MODEL = "gpt-4o-mini"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]
CHAT = "/v1/chat/completions"
CAP = 50  # every call sets its cap: its reservation is known in advance


def reservation_usd(cap: int = CAP) -> float:
    """The worst case admitted for one chat call of ``MESSAGES`` capped at ``cap``."""
    prices = default_price_table().lookup("openai", MODEL)
    assert prices is not None
    return nano_to_usd(prices.max_cost_nano(input_bound([MESSAGES], 1), cap))


def reservation_tokens(cap: int = CAP) -> int:
    return input_bound([MESSAGES], 1) + cap


def assert_charged(snap: ChainSnapshot, cost: float, steps: int = 1) -> None:
    assert snap.reserved_usd == 0
    assert snap.steps == steps
    assert snap.cost_usd == pytest.approx(cost, abs=1e-12)


def chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    params: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "max_completion_tokens": CAP}
    params.update(kwargs)
    return client.chat.completions.create(**params)


async def achat(client: openai.AsyncOpenAI, **kwargs: Any) -> Any:
    params: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "max_completion_tokens": CAP}
    params.update(kwargs)
    return await client.chat.completions.create(**params)


# -- fixtures ------------------------------------------------------------------------


@pytest.fixture
def instrumentor() -> Iterator[OpenAIInstrumentor]:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    yield instrumentor
    instrumentor.uninstrument()


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=6) as fake:
        yield fake


@pytest.fixture
def raw() -> Iterator[RawServer]:
    with RawServer() as srv:
        yield srv


@pytest.fixture
def client(server: FakeLLMServer, instrumentor: OpenAIInstrumentor) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0) as oai:
        yield oai


@pytest_asyncio.fixture
async def aclient(
    server: FakeLLMServer, instrumentor: OpenAIInstrumentor
) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=server.openai_base_url, api_key="k", max_retries=0
    ) as oai:
        yield oai


def raw_client(raw: RawServer, **kwargs: Any) -> openai.OpenAI:
    kwargs.setdefault("max_retries", 0)
    return openai.OpenAI(base_url=raw.base_url + "/v1", api_key="k", **kwargs)


def raw_aclient(raw: RawServer, **kwargs: Any) -> openai.AsyncOpenAI:
    kwargs.setdefault("max_retries", 0)
    return openai.AsyncOpenAI(base_url=raw.base_url + "/v1", api_key="k", **kwargs)


@pytest.fixture
def backoffs(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The SDK's retry backoff sleeps (sync and async), recorded instead of slept."""
    slept: list[float] = []

    class _Time:
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        def sleep(self, seconds: float) -> None:
            slept.append(seconds)

    async def _asleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(base_client, "time", _Time())
    monkeypatch.setattr(base_client.anyio, "sleep", _asleep)
    return slept


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on: connecting is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
def breaker_clock() -> Iterator[FakeClock]:
    fake = FakeClock()
    configure_endpoint_breakers(lambda p, m: CircuitBreaker(1, 30.0, clock=fake))
    yield fake
    configure_endpoint_breakers(None)


# -- nothing sent: released ------------------------------------------------------------


def test_connection_refused_is_released(
    instrumentor: OpenAIInstrumentor, closed_port: int, backoffs: list[float]
) -> None:
    with (
        openai.OpenAI(
            base_url=f"http://127.0.0.1:{closed_port}/v1", api_key="k", max_retries=2
        ) as oai,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_retries_total=5)) as ctx,
    ):
        with pytest.raises(openai.APIConnectionError):
            chat(oai)
        snap = ctx.snapshot()
    assert len(backoffs) == 2  # three attempts, none connected
    assert_charged(snap, 0.0, steps=0)


@pytest.mark.asyncio
async def test_async_connection_refused_is_released(
    instrumentor: OpenAIInstrumentor, closed_port: int, backoffs: list[float]
) -> None:
    async with (
        openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{closed_port}/v1", api_key="k", max_retries=2
        ) as oai,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_retries_total=5)) as ctx,
    ):
        with pytest.raises(openai.APIConnectionError):
            await achat(oai)
    assert len(backoffs) == 2  # the retry hook read each attempt's error in a coroutine too
    assert_charged(ctx.snapshot(), 0.0, steps=0)


@pytest.mark.asyncio
async def test_async_attempt_lost_unanswered_costs_a_reservation(
    raw: RawServer, instrumentor: Any, backoffs: list[float]
) -> None:
    usage = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    raw.script(Reply(drop=True), chat_completion(MODEL, usage))
    async with (
        raw_aclient(raw, max_retries=3) as oai,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_retries_total=5)) as ctx,
    ):
        await achat(oai)
    prices = default_price_table().lookup("openai", MODEL)
    assert prices is not None
    assert raw.count == 2
    assert_charged(ctx.snapshot(), reservation_usd() + nano_to_usd(prices.cost_nano(12, 3)))


class _InterruptedBeforeSending(openai.OpenAI):
    """A client whose request preparation is interrupted: nothing leaves."""

    def _prepare_options(self, options: Any) -> Any:
        raise KeyboardInterrupt


def test_interrupt_before_sending_is_released(server: FakeLLMServer, instrumentor: Any) -> None:
    with (
        _InterruptedBeforeSending(base_url=server.openai_base_url, api_key="k") as oai,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        with pytest.raises(KeyboardInterrupt):
            chat(oai)
        snap = ctx.snapshot()
    assert server.count(CHAT) == 0
    assert_charged(snap, 0.0, steps=0)


@pytest.mark.asyncio
async def test_async_cancel_before_sending_is_released(
    server: FakeLLMServer, instrumentor: Any
) -> None:
    started = asyncio.Event()

    class _Stalled(openai.AsyncOpenAI):
        async def _prepare_options(self, options: Any) -> Any:
            started.set()
            await asyncio.Event().wait()  # until cancelled, before any send

    async with (
        _Stalled(base_url=server.openai_base_url, api_key="k") as oai,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        task = asyncio.ensure_future(achat(oai))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert server.count(CHAT) == 0
    assert_charged(ctx.snapshot(), 0.0, steps=0)


# -- sent, no trustworthy reply: the reservation -----------------------------------------


def test_timeout_commits_the_reservation(
    server: FakeLLMServer, instrumentor: Any, span_exporter: InMemorySpanExporter
) -> None:
    server.set_latency(2.0)
    with (
        openai.OpenAI(
            base_url=server.openai_base_url, api_key="k", max_retries=0, timeout=0.2
        ) as oai,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        with pytest.raises(openai.APITimeoutError):
            chat(oai)
        snap = ctx.snapshot()
    assert server.count(CHAT) == 1
    assert_charged(snap, reservation_usd())
    assert snap.tokens == reservation_tokens()
    (span,) = [s for s in span_exporter.get_finished_spans() if s.name == f"chat {MODEL}"]
    assert span.status.status_code is StatusCode.ERROR


@pytest.mark.asyncio
async def test_async_timeout_commits_the_reservation(
    server: FakeLLMServer, instrumentor: Any
) -> None:
    server.set_latency(2.0)
    async with (
        openai.AsyncOpenAI(
            base_url=server.openai_base_url, api_key="k", max_retries=0, timeout=0.2
        ) as oai,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        with pytest.raises(openai.APITimeoutError):
            await achat(oai)
    assert server.count(CHAT) == 1
    assert_charged(ctx.snapshot(), reservation_usd())


def test_each_attempt_lost_unanswered_costs_a_reservation(
    raw: RawServer, instrumentor: Any, backoffs: list[float]
) -> None:
    # Two attempts dropped after they arrived, the third answered with usage:
    # the usage, plus a reservation for each attempt that may have been billed.
    usage = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    raw.script(Reply(drop=True), Reply(drop=True), chat_completion(MODEL, usage))
    with (
        raw_client(raw, max_retries=3) as oai,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_retries_total=5)) as ctx,
    ):
        completion = chat(oai)
        snap = ctx.snapshot()
    assert completion.usage is not None and completion.usage.completion_tokens == 3
    assert raw.count == 3
    prices = default_price_table().lookup("openai", MODEL)
    assert prices is not None
    assert_charged(snap, 2 * reservation_usd() + nano_to_usd(prices.cost_nano(12, 3)))
    assert snap.tokens == 2 * reservation_tokens() + 15


def test_connection_dropped_mid_request_commits_the_reservation(
    raw: RawServer, instrumentor: Any
) -> None:
    raw.script(Reply(drop=True))
    with raw_client(raw) as oai, ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        with pytest.raises(openai.APIConnectionError):
            chat(oai)
        snap = ctx.snapshot()
    assert raw.count == 1
    assert_charged(snap, reservation_usd())


@pytest.mark.asyncio
async def test_async_connection_dropped_mid_request_commits_the_reservation(
    raw: RawServer, instrumentor: Any
) -> None:
    raw.script(Reply(drop=True))
    async with (
        raw_aclient(raw) as oai,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        with pytest.raises(openai.APIConnectionError):
            await achat(oai)
    assert raw.count == 1
    assert_charged(ctx.snapshot(), reservation_usd())


@pytest.mark.usefixtures("python_sigint")
def test_keyboard_interrupt_while_waiting_for_the_reply_commits_the_reservation(
    raw: RawServer, instrumentor: Any, span_exporter: InMemorySpanExporter
) -> None:
    released = threading.Event()
    main = threading.main_thread().ident
    assert main is not None and threading.get_ident() == main

    def interrupt() -> None:  # on the server, once the request has arrived
        signal.pthread_kill(main, signal.SIGINT)
        released.wait(10)  # no reply before the client was interrupted

    raw.script(Reply(drop=True, on_request=interrupt))
    try:
        with raw_client(raw) as oai, ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
            with pytest.raises(KeyboardInterrupt):
                chat(oai)
            snap = ctx.snapshot()
    finally:
        released.set()
    assert raw.count == 1
    assert_charged(snap, reservation_usd())
    (span,) = [s for s in span_exporter.get_finished_spans() if s.name == f"chat {MODEL}"]
    assert span.attributes is not None
    assert span.attributes["error.type"] == "KeyboardInterrupt"


# -- cancellation --------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_wait_for_cancels_a_sent_call_and_commits_the_reservation(
    server: FakeLLMServer, aclient: openai.AsyncOpenAI, span_exporter: InMemorySpanExporter
) -> None:
    server.set_latency(2.0)
    async with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(achat(aclient), 0.3)
        snap = ctx.snapshot()
    assert server.count(CHAT) == 1
    assert_charged(snap, reservation_usd())
    (span,) = [s for s in span_exporter.get_finished_spans() if s.name == f"chat {MODEL}"]
    assert span.end_time is not None


async def _cancelled_once_sent(
    server: FakeLLMServer, cancel: Any, released: threading.Event
) -> None:
    """Have the server cancel the client (via ``cancel``) once the request arrived."""
    loop = asyncio.get_running_loop()

    def responder(request: Any) -> None:
        loop.call_soon_threadsafe(cancel)
        released.wait(10)  # the reply never comes before the cancellation

    server.set_responder(responder)


@pytest.mark.asyncio
async def test_task_cancel_after_sending_commits_the_reservation(
    server: FakeLLMServer, aclient: openai.AsyncOpenAI
) -> None:
    released = threading.Event()
    try:
        async with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
            task = asyncio.ensure_future(achat(aclient))
            await _cancelled_once_sent(server, task.cancel, released)
            with pytest.raises(asyncio.CancelledError):
                await task
            snap = ctx.snapshot()
    finally:
        released.set()
    assert server.count(CHAT) == 1
    assert_charged(snap, reservation_usd())


@pytest.mark.asyncio
async def test_anyio_cancel_scope_after_sending_commits_the_reservation(
    server: FakeLLMServer, aclient: openai.AsyncOpenAI
) -> None:
    released = threading.Event()
    try:
        async with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
            with anyio.CancelScope() as scope:
                await _cancelled_once_sent(server, scope.cancel, released)
                await achat(aclient)
            assert scope.cancelled_caught
            snap = ctx.snapshot()
    finally:
        released.set()
    assert server.count(CHAT) == 1
    assert_charged(snap, reservation_usd())


@pytest.mark.asyncio
async def test_cancelled_calls_add_up_and_trip_the_chain_before_the_ceiling(
    server: FakeLLMServer, aclient: openai.AsyncOpenAI
) -> None:
    # The repro: 20 wait_for(create(...), 0.05) against a slow server
    # under a $0.05 ceiling sent 18 requests and recorded $0. (0.2 s here: on a
    # loaded machine a shorter wait may end before the request is sent.)
    cap = 16_000
    each = reservation_usd(cap)
    allowed = int(0.05 // each)
    assert 1 <= allowed < 20
    server.set_latency(2.0)
    outcomes: list[str] = []
    async with ExecutionContext(ExecutionConfig(max_cost_usd=0.05)) as ctx:
        for _ in range(20):
            try:
                await asyncio.wait_for(achat(aclient, max_completion_tokens=cap), 0.2)
            except TimeoutError:
                outcomes.append("cancelled")
            except BudgetExceededError as exc:
                outcomes.append(exc.reason)
        snap = ctx.snapshot()
    # Each call cancelled once its send began costs one reservation (one cut
    # while still connecting may cost it without reaching the server: fail closed).
    charged = round(snap.cost_usd / each)
    assert snap.cost_usd == pytest.approx(charged * each, abs=1e-12)
    assert server.count(CHAT) <= charged == allowed
    assert snap.cost_usd <= 0.05
    assert snap.aborted
    assert outcomes[-1] == "cost"
    assert snap.reserved_usd == 0


@pytest.mark.asyncio
async def test_cancellation_frees_the_half_open_probe_without_counting_a_failure(
    server: FakeLLMServer, aclient: openai.AsyncOpenAI, breaker_clock: FakeClock
) -> None:
    server.fail_next(1, 503)
    async with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)):
        with pytest.raises(openai.InternalServerError):
            await achat(aclient)  # one failure opens the endpoint's breaker
        with pytest.raises(BudgetExceededError):
            await achat(aclient)
        breaker_clock.advance(30)  # half-open: the next call is the probe
        server.set_latency(2.0)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(achat(aclient), 0.3)
        server.set_latency(0.0)
        # The cancelled probe was neither a failure (that would reopen the
        # breaker) nor left holding the probe slot (that would deny forever).
        await achat(aclient)
    from veronica_otel.instrumentors._breakers import endpoint_breaker

    assert endpoint_breaker("openai", MODEL).state is CircuitState.CLOSED
    assert server.count(CHAT) == 3


# -- HTTP error replies: zero cost, the step counts ----------------------------------------


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, openai.BadRequestError),
        (429, openai.RateLimitError),
        (500, openai.InternalServerError),
    ],
)
def test_http_error_replies_cost_nothing_and_count_the_step(
    server: FakeLLMServer,
    instrumentor: Any,
    backoffs: list[float],
    status: int,
    error: type[Exception],
) -> None:
    server.fail_always(status, retry_after_ms=1)
    with (
        openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=2) as oai,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_retries_total=5)) as ctx,
    ):
        with pytest.raises(error):
            chat(oai)
        snap = ctx.snapshot()
    attempts = 1 if status == 400 else 3  # the SDK retries 429 and 5xx
    assert server.count(CHAT) == attempts
    assert snap.retries == attempts - 1
    assert_charged(snap, 0.0)


@pytest.mark.asyncio
async def test_async_http_error_replies_cost_nothing_and_count_the_step(
    server: FakeLLMServer, instrumentor: Any, backoffs: list[float]
) -> None:
    server.fail_always(503, retry_after_ms=1)
    async with (
        openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="k", max_retries=2) as oai,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_retries_total=5)) as ctx,
    ):
        with pytest.raises(openai.InternalServerError):
            await achat(oai)
    assert server.count(CHAT) == 3
    assert_charged(ctx.snapshot(), 0.0)


def test_a_lost_attempt_then_an_error_reply_commits_the_reservation(
    raw: RawServer, instrumentor: Any, backoffs: list[float]
) -> None:
    raw.script(Reply(drop=True), Reply(status=400, body=b'{"error": {"message": "no"}}'))
    with (
        raw_client(raw, max_retries=1) as oai,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_retries_total=5)) as ctx,
    ):
        with pytest.raises(openai.BadRequestError):
            chat(oai)
        snap = ctx.snapshot()
    assert raw.count == 2
    assert_charged(snap, reservation_usd())


# -- a reply without readable usage: the reservation ---------------------------------------

UNREADABLE = [
    None,
    [],
    "lots",
    {},
    {"prompt_tokens": None, "completion_tokens": None, "total_tokens": None},
    {"prompt_tokens": 12},
    {"prompt_tokens": -5, "completion_tokens": 3, "total_tokens": -2},
    {"prompt_tokens": "12", "completion_tokens": "3", "total_tokens": "15"},
    {"prompt_tokens": 12, "completion_tokens": 3, "completion_tokens_details": {"x": 1}},
    {"prompt_tokens": 12, "completion_tokens": [3]},
]


@pytest.mark.parametrize("usage", UNREADABLE, ids=repr)
def test_a_reply_with_unreadable_usage_commits_the_reservation(
    raw: RawServer, instrumentor: Any, usage: object
) -> None:
    raw.script(chat_completion(MODEL, usage))
    with raw_client(raw) as oai, ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        completion = chat(oai)
        snap = ctx.snapshot()
    assert completion.choices[0].message.content == "hi"
    assert raw.count == 1
    expected = reservation_usd()
    if usage == UNREADABLE[-2]:  # unknown details are ignored: the counts are readable
        prices = default_price_table().lookup("openai", MODEL)
        assert prices is not None
        expected = nano_to_usd(prices.cost_nano(12, 3))
    assert_charged(snap, expected)


@pytest.mark.asyncio
@pytest.mark.parametrize("usage", [None, "lots", {"prompt_tokens": -1, "completion_tokens": 1}])
async def test_async_reply_with_unreadable_usage_commits_the_reservation(
    raw: RawServer, instrumentor: Any, usage: object
) -> None:
    raw.script(chat_completion(MODEL, usage))
    async with (
        raw_aclient(raw) as oai,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        await achat(oai)
    assert_charged(ctx.snapshot(), reservation_usd())


@pytest.mark.parametrize("huge", [10**26, 1e26, float("inf")], ids=repr)
def test_absurd_usage_trips_the_chain_and_never_raises(
    raw: RawServer, instrumentor: Any, huge: object
) -> None:
    usage = {"prompt_tokens": huge, "completion_tokens": huge, "total_tokens": huge}
    body = chat_completion(MODEL, usage).body.replace(b"Infinity", b"1e999")
    raw.script(Reply(body=body), chat_completion(MODEL, None))
    with raw_client(raw) as oai, ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        completion = chat(oai)  # the reply, never an error from us
        with pytest.raises(BudgetExceededError) as info:
            chat(oai)
        snap = ctx.snapshot()
    assert completion.choices[0].message.content == "hi"
    assert info.value.reason == "cost"
    assert raw.count == 1
    assert snap.aborted
    assert snap.reserved_usd == 0
    assert snap.cost_usd > 1.0


def test_absurd_usage_with_the_redis_ledger_never_raises(
    raw: RawServer, instrumentor: Any, redis_url: str, redis_prefix: str
) -> None:
    usage = {"prompt_tokens": 10**26, "completion_tokens": 10**26, "total_tokens": 2 * 10**26}
    raw.script(chat_completion(MODEL, usage))
    store = redis.Redis.from_url(redis_url)
    ledger = RedisLedger(store, key_prefix=redis_prefix, fail_open=False)
    try:
        with (
            raw_client(raw) as oai,
            ExecutionContext(ExecutionConfig(max_cost_usd=1.0), ledger=ledger) as ctx,
        ):
            completion = chat(oai)
            with pytest.raises(BudgetExceededError):
                chat(oai)
            snap = ctx.snapshot()
    finally:
        store.close()
    assert completion.choices[0].message.content == "hi"
    assert raw.count == 1
    assert snap.reserved_usd == 0
    assert snap.aborted


# -- streams without their usage: the reservation ------------------------------------------


def test_stream_that_ends_without_usage_commits_the_reservation(
    raw: RawServer, instrumentor: Any
) -> None:
    raw.script(Reply(chunks=list(chat_sse(MODEL)), content_type="text/event-stream"))
    with raw_client(raw) as oai, ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        with chat(oai, stream=True) as stream:
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        snap = ctx.snapshot()
    assert text == " tok0 tok1 tok2"
    assert_charged(snap, reservation_usd())


@pytest.mark.parametrize("usage", ["lots", [], {"prompt_tokens": None}], ids=repr)
def test_stream_with_an_unreadable_usage_chunk_commits_the_reservation(
    raw: RawServer, instrumentor: Any, usage: object
) -> None:
    raw.script(Reply(chunks=list(chat_sse(MODEL, usage)), content_type="text/event-stream"))
    with raw_client(raw) as oai, ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        with chat(oai, stream=True, stream_options={"include_usage": True}) as stream:
            for _ in stream:
                pass
        snap = ctx.snapshot()
    assert_charged(snap, reservation_usd())


def test_stream_cut_mid_body_commits_the_reservation(raw: RawServer, instrumentor: Any) -> None:
    usage = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    chunks = list(chat_sse(MODEL, usage))[:2]  # the connection breaks before the usage
    raw.script(Reply(chunks=chunks, content_type="text/event-stream", cut=True))
    received: list[str] = []
    with raw_client(raw) as oai, ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        stream = chat(oai, stream=True, stream_options={"include_usage": True})
        with pytest.raises(Exception) as info:
            for chunk in stream:
                received.append(chunk.choices[0].delta.content or "")
        snap = ctx.snapshot()
    assert not isinstance(info.value, BudgetExceededError)  # the transport's own error
    assert received == [" tok0", " tok1"]
    assert_charged(snap, reservation_usd())


@pytest.mark.asyncio
async def test_async_stream_cut_mid_body_commits_the_reservation(
    raw: RawServer, instrumentor: Any
) -> None:
    chunks = list(chat_sse(MODEL, {"prompt_tokens": 1, "completion_tokens": 1}))[:2]
    raw.script(Reply(chunks=chunks, content_type="text/event-stream", cut=True))
    async with (
        raw_aclient(raw) as oai,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        stream = await achat(oai, stream=True, stream_options={"include_usage": True})
        with pytest.raises(Exception) as info:
            async for _ in stream:
                pass
    assert not isinstance(info.value, BudgetExceededError)
    assert_charged(ctx.snapshot(), reservation_usd())


@pytest.mark.asyncio
async def test_async_stream_cancelled_mid_way_commits_the_reservation(
    server: FakeLLMServer, aclient: openai.AsyncOpenAI
) -> None:
    server.set_chunk_delay(2.0)
    async with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        stream = await achat(aclient, stream=True, stream_options={"include_usage": True})

        async def consume() -> None:
            async for _ in stream:
                pass

        with pytest.raises(TimeoutError):
            await asyncio.wait_for(consume(), 0.2)
        await stream.close()
        snap = ctx.snapshot()
    assert server.count(CHAT) == 1
    assert_charged(snap, reservation_usd())
