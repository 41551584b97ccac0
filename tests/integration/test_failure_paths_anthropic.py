"""What a failed, cancelled or half-finished anthropic call costs (DESIGN G10), with the real SDK.

The anthropic twin of ``test_failure_paths_openai.py``: nothing sent is
released; an attempt that may have reached the provider without readable
usage costs the reservation; HTTP error replies cost nothing but count the
step; a reply that arrives without the per-attempt hook having run is sent.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from opentelemetry.instrumentation.utils import unwrap
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests._bounds import input_bound
from tests.integration._raw_server import RawServer, Reply, anthropic_message, anthropic_sse
from veronica_otel import (
    BudgetExceededError,
    ChainSnapshot,
    ExecutionConfig,
    ExecutionContext,
    PolicyContext,
    PolicyDecision,
    PolicyPipeline,
)
from veronica_otel._pricing import default_price_table
from veronica_otel._units import nano_to_usd
from veronica_otel.instrumentors.anthropic import AnthropicInstrumentor
from veronica_otel.testing import FakeLLMServer

if TYPE_CHECKING:
    import anthropic
    from anthropic.types import MessageParam

MODEL = "claude-3-5-haiku-latest"
MESSAGES: list[MessageParam] = [{"role": "user", "content": "Say hello."}]
PATH = "/v1/messages"
CAP = 100


def reservation_usd(cap: int = CAP) -> float:
    prices = default_price_table().lookup("anthropic", MODEL)
    assert prices is not None
    # Nothing is marked to cache: input is reserved at the plain input price.
    return nano_to_usd(prices.max_cost_nano(input_bound([MESSAGES], 1), cap, cache_writes=False))


def usage_usd(inp: int, out: int) -> float:
    prices = default_price_table().lookup("anthropic", MODEL)
    assert prices is not None
    return nano_to_usd(prices.cost_nano(inp, out))


def assert_charged(snap: ChainSnapshot, cost: float, steps: int = 1) -> None:
    assert snap.reserved_usd == 0
    assert snap.steps == steps
    assert snap.cost_usd == pytest.approx(cost, abs=1e-12)


def create(claude: anthropic.Anthropic, **kwargs: Any) -> Any:
    params: dict[str, Any] = {"model": MODEL, "max_tokens": CAP, "messages": MESSAGES}
    params.update(kwargs)
    return claude.messages.create(**params)


async def acreate(claude: anthropic.AsyncAnthropic, **kwargs: Any) -> Any:
    params: dict[str, Any] = {"model": MODEL, "max_tokens": CAP, "messages": MESSAGES}
    params.update(kwargs)
    return await claude.messages.create(**params)


@pytest.fixture
def instrumented() -> Iterator[AnthropicInstrumentor]:
    instrumentor = AnthropicInstrumentor()
    instrumentor.instrument()
    yield instrumentor
    instrumentor.uninstrument()


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(input_tokens=10, output_tokens=5) as fake:
        yield fake


@pytest.fixture
def raw() -> Iterator[RawServer]:
    with RawServer() as srv:
        yield srv


@pytest.fixture
def backoffs(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    import anthropic._base_client as base_client

    slept: list[float] = []

    class _Time:
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        def sleep(self, seconds: float) -> None:
            slept.append(seconds)

    monkeypatch.setattr(base_client, "time", _Time())
    return slept


def client_for(url: str, **kwargs: Any) -> anthropic.Anthropic:
    import anthropic

    kwargs.setdefault("max_retries", 0)
    return anthropic.Anthropic(base_url=url, api_key="k", **kwargs)


def aclient_for(url: str, **kwargs: Any) -> anthropic.AsyncAnthropic:
    import anthropic

    kwargs.setdefault("max_retries", 0)
    return anthropic.AsyncAnthropic(base_url=url, api_key="k", **kwargs)


# -- nothing sent: released ---------------------------------------------------------------


def test_connection_refused_is_released(instrumented: Any, backoffs: list[float]) -> None:
    import anthropic

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with (
        client_for(f"http://127.0.0.1:{port}", max_retries=2) as claude,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_retries_total=5)) as ctx,
    ):
        with pytest.raises(anthropic.APIConnectionError):
            create(claude)
        snap = ctx.snapshot()
    assert len(backoffs) == 2
    assert_charged(snap, 0.0, steps=0)


# -- sent, no trustworthy reply: the reservation ------------------------------------------


def test_timeout_commits_the_reservation(server: FakeLLMServer, instrumented: Any) -> None:
    import anthropic

    server.set_latency(2.0)
    with (
        client_for(server.anthropic_base_url, timeout=0.2) as claude,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        with pytest.raises(anthropic.APITimeoutError):
            create(claude)
        snap = ctx.snapshot()
    assert server.count(PATH) == 1
    assert_charged(snap, reservation_usd())


@pytest.mark.asyncio
async def test_async_wait_for_cancel_commits_the_reservation(
    server: FakeLLMServer, instrumented: Any
) -> None:
    server.set_latency(2.0)
    async with (
        aclient_for(server.anthropic_base_url) as claude,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(acreate(claude), 0.3)
    assert server.count(PATH) == 1
    assert_charged(ctx.snapshot(), reservation_usd())


def test_connection_dropped_commits_the_reservation(raw: RawServer, instrumented: Any) -> None:
    import anthropic

    raw.script(Reply(drop=True))
    with (
        client_for(raw.base_url) as claude,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
        pytest.raises(anthropic.APIConnectionError),
    ):
        create(claude)
    assert raw.count == 1
    assert_charged(ctx.snapshot(), reservation_usd())


def test_each_attempt_lost_unanswered_costs_a_reservation(
    raw: RawServer, instrumented: Any, backoffs: list[float]
) -> None:
    raw.script(Reply(drop=True), anthropic_message(MODEL, {"input_tokens": 10, "output_tokens": 4}))
    with (
        client_for(raw.base_url, max_retries=2) as claude,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_retries_total=5)) as ctx,
    ):
        create(claude)
        snap = ctx.snapshot()
    assert raw.count == 2
    assert_charged(snap, reservation_usd() + usage_usd(10, 4))


@pytest.mark.usefixtures("python_sigint")
def test_keyboard_interrupt_while_waiting_commits_the_reservation(
    raw: RawServer, instrumented: Any
) -> None:
    released = threading.Event()
    main = threading.main_thread().ident
    assert main is not None and threading.get_ident() == main

    def interrupt() -> None:
        signal.pthread_kill(main, signal.SIGINT)
        released.wait(10)

    raw.script(Reply(drop=True, on_request=interrupt))
    try:
        with (
            client_for(raw.base_url) as claude,
            ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
        ):
            with pytest.raises(KeyboardInterrupt):
                create(claude)
            snap = ctx.snapshot()
    finally:
        released.set()
    assert raw.count == 1
    assert_charged(snap, reservation_usd())


@pytest.mark.parametrize(
    "usage",
    [
        None,
        "lots",
        [],
        {"input_tokens": None, "output_tokens": None},
        {"input_tokens": 10},
        {"input_tokens": -1, "output_tokens": 3},
        {"input_tokens": "10", "output_tokens": "3"},
    ],
    ids=repr,
)
def test_a_reply_with_unreadable_usage_commits_the_reservation(
    raw: RawServer, instrumented: Any, usage: object
) -> None:
    raw.script(anthropic_message(MODEL, usage))
    with (
        client_for(raw.base_url) as claude,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        message = create(claude)
        snap = ctx.snapshot()
    assert message.content[0].text == "hi"
    assert_charged(snap, reservation_usd())


@pytest.mark.asyncio
async def test_async_reply_with_unreadable_usage_commits_the_reservation(
    raw: RawServer, instrumented: Any
) -> None:
    raw.script(anthropic_message(MODEL, "lots"))
    async with (
        aclient_for(raw.base_url) as claude,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        await acreate(claude)
    assert_charged(ctx.snapshot(), reservation_usd())


def test_absurd_usage_trips_the_chain_and_never_raises(raw: RawServer, instrumented: Any) -> None:
    raw.script(anthropic_message(MODEL, {"input_tokens": 10**26, "output_tokens": 10**26}))
    with (
        client_for(raw.base_url) as claude,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        create(claude)
        with pytest.raises(BudgetExceededError) as info:
            create(claude)
        snap = ctx.snapshot()
    assert info.value.reason == "cost"
    assert raw.count == 1
    assert snap.aborted and snap.reserved_usd == 0


@pytest.mark.parametrize("final", [None, "lots", {"output_tokens": None}], ids=repr)
def test_stream_without_a_readable_final_usage_commits_the_reservation(
    raw: RawServer, instrumented: Any, final: object
) -> None:
    chunks = list(anthropic_sse(MODEL, final))
    raw.script(Reply(chunks=chunks, content_type="text/event-stream"))
    with (
        client_for(raw.base_url) as claude,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        with create(claude, stream=True) as stream:
            for _ in stream:
                pass
        snap = ctx.snapshot()
    assert ctx.get_partial_result() == " tok0 tok1 tok2"
    assert_charged(snap, reservation_usd())


def test_stream_with_its_final_usage_commits_that_usage(raw: RawServer, instrumented: Any) -> None:
    chunks = list(anthropic_sse(MODEL, {"output_tokens": 3}))
    raw.script(Reply(chunks=chunks, content_type="text/event-stream"))
    with (
        client_for(raw.base_url) as claude,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        with create(claude, stream=True) as stream:
            for _ in stream:
                pass
        snap = ctx.snapshot()
    assert_charged(snap, usage_usd(10, 3))  # input from message_start, output from the end


def test_stream_cut_mid_body_commits_the_reservation(raw: RawServer, instrumented: Any) -> None:
    chunks = list(anthropic_sse(MODEL, {"output_tokens": 3}))[:4]
    raw.script(Reply(chunks=chunks, content_type="text/event-stream", cut=True))
    with (
        client_for(raw.base_url) as claude,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        stream = create(claude, stream=True)
        with pytest.raises(Exception) as info:
            for _ in stream:
                pass
        snap = ctx.snapshot()
    assert not isinstance(info.value, BudgetExceededError)
    assert_charged(snap, reservation_usd())


# -- HTTP error replies: zero cost, the step counts ---------------------------------------


@pytest.mark.parametrize(("status", "attempts"), [(400, 1), (429, 3), (529, 3)])
def test_http_error_replies_cost_nothing_and_count_the_step(
    server: FakeLLMServer, instrumented: Any, backoffs: list[float], status: int, attempts: int
) -> None:
    import anthropic

    server.fail_always(status, retry_after_ms=1)
    with (
        client_for(server.anthropic_base_url, max_retries=2) as claude,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_retries_total=5)) as ctx,
    ):
        with pytest.raises(anthropic.APIStatusError):
            create(claude)
        snap = ctx.snapshot()
    assert server.count(PATH) == attempts
    assert_charged(snap, 0.0)


# -- SDK drift: a reply without the per-attempt hook is still sent ------------------------


def test_replies_count_as_sent_when_the_attempt_hook_never_runs(
    server: FakeLLMServer, instrumented: Any
) -> None:
    import anthropic._base_client as base_client

    unwrap(base_client.SyncAPIClient, "_attempt_request")  # the SDK sends some other way
    with (
        client_for(server.anthropic_base_url) as claude,
        ExecutionContext(ExecutionConfig(max_steps=3, max_cost_usd=1.0)) as ctx,
    ):
        for _ in range(3):
            create(claude)
        with pytest.raises(BudgetExceededError) as info:
            create(claude)
        snap = ctx.snapshot()
    assert info.value.reason == "steps"
    assert server.count(PATH) == 3
    assert snap.steps == 3
    # Without the hook's tag the payload hook cannot find the call: the usage
    # is read from each parsed message instead (never zero, never released).
    assert snap.cost_usd == pytest.approx(3 * usage_usd(10, 5), abs=1e-12)


def test_an_error_reply_counts_as_sent_when_the_attempt_hook_never_runs(
    server: FakeLLMServer, instrumented: Any
) -> None:
    import anthropic
    import anthropic._base_client as base_client

    unwrap(base_client.SyncAPIClient, "_attempt_request")
    server.fail_next(1, 400)
    with (
        client_for(server.anthropic_base_url) as claude,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        with pytest.raises(anthropic.BadRequestError):
            create(claude)
        snap = ctx.snapshot()
    assert_charged(snap, 0.0)


# -- cancelled before sending: released ----------------------------------------------------


class _Throttle:
    """A policy that makes every call wait 60 s before it is sent."""

    policy_type = "throttle"

    def __init__(self) -> None:
        self.checked = asyncio.Event()

    def check(self, context: PolicyContext) -> PolicyDecision:
        self.checked.set()
        return PolicyDecision(True, self.policy_type, rate_limit_ms=60_000)

    def reset(self) -> None:
        pass


@pytest.mark.asyncio
async def test_cancel_during_the_rate_limit_wait_is_released(
    server: FakeLLMServer, instrumented: Any, span_exporter: InMemorySpanExporter
) -> None:
    throttle = _Throttle()
    async with (
        aclient_for(server.anthropic_base_url) as claude,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0), PolicyPipeline([throttle])) as ctx,
    ):
        task = asyncio.ensure_future(acreate(claude))
        await throttle.checked.wait()  # the task resumes us once it awaits the rate limit
        assert ctx.snapshot().reserved_usd > 0
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert server.count(PATH) == 0
    assert_charged(ctx.snapshot(), 0.0, steps=0)
    # The SDK's own span for the call ended, with the cancellation on it.
    (span,) = [
        s for s in span_exporter.get_finished_spans() if s.name == "anthropic.messages.create"
    ]
    assert span.attributes is not None
    assert span.attributes["error.type"] == "CancelledError"
