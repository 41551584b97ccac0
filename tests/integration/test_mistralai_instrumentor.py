"""MistralAIInstrumentor: the real mistralai SDK against the embedded fake server.

The server's request count is the truth for what was sent; the chain's
snapshot for what was charged (DESIGN G1-G3, G10, G12).
"""

from __future__ import annotations

import asyncio
import contextvars
import socket
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

import httpx2
import pytest
import pytest_asyncio
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests._bounds import input_bound
from tests._clock import FakeClock, patch_chain_clock
from veronica_otel import BudgetExceededError, ChainSnapshot, ExecutionConfig, ExecutionContext
from veronica_otel._pricing import default_price_table
from veronica_otel._units import nano_to_usd
from veronica_otel.instrumentors import InstrumentationError
from veronica_otel.instrumentors import _hooks as hooks_module
from veronica_otel.instrumentors.mistralai import MistralAIInstrumentor
from veronica_otel.testing import FakeLLMServer

if TYPE_CHECKING:
    from mistralai.client import Mistral

MODEL = "mistral-small-latest"
MESSAGES = [{"role": "user", "content": "Say hello."}]
CHAT = "/v1/chat/completions"
INPUT, OUTPUT, CAP = 12, 5, 50


def _cost(model: str = MODEL, inp: int = INPUT, out: int = OUTPUT) -> float:
    prices = default_price_table().lookup("mistral_ai", model)
    assert prices is not None
    return nano_to_usd(prices.cost_nano(inp, out))


def _reservation(cap: int = CAP) -> float:
    prices = default_price_table().lookup("mistral_ai", MODEL)
    assert prices is not None
    return nano_to_usd(prices.max_cost_nano(input_bound([MESSAGES], 1), cap))


def _charged(snap: ChainSnapshot, cost: float, steps: int = 1) -> None:
    assert (snap.steps, snap.reserved_usd) == (steps, 0.0)
    assert snap.cost_usd == pytest.approx(cost, abs=1e-12)


def _chat(client: Mistral, **kwargs: Any) -> Any:
    params: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "max_tokens": CAP}
    params.update(kwargs)
    return client.chat.complete(**params)


def _retry() -> Any:
    """The SDK's own retries: 1 ms apart, for up to a minute."""
    from mistralai.client.utils import BackoffStrategy, RetryConfig

    return RetryConfig("backoff", BackoffStrategy(1, 1, 1.0, 60_000, jitter_ms=0), True)


async def _achat(client: Mistral, **kwargs: Any) -> Any:
    params: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "max_tokens": CAP}
    params.update(kwargs)
    return await client.chat.complete_async(**params)


@pytest.fixture
def instrumented() -> Iterator[MistralAIInstrumentor]:
    instrumentor = MistralAIInstrumentor()
    instrumentor.instrument()
    yield instrumentor
    instrumentor.uninstrument()


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(input_tokens=INPUT, output_tokens=OUTPUT) as fake:
        yield fake


@pytest.fixture
def client(server: FakeLLMServer, instrumented: MistralAIInstrumentor) -> Iterator[Mistral]:
    from mistralai.client import Mistral

    with Mistral(api_key="k", server_url=server.base_url) as mistral:
        yield mistral


@pytest_asyncio.fixture
async def aclient(
    server: FakeLLMServer, instrumented: MistralAIInstrumentor
) -> AsyncIterator[Mistral]:
    from mistralai.client import Mistral

    async with Mistral(api_key="k", server_url=server.base_url) as mistral:
        yield mistral


class _Clock(FakeClock):
    """The real monotonic clock, moved forward by hand (never slept on)."""

    def __call__(self) -> float:
        return time.monotonic() + self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = _Clock()
    patch_chain_clock(monkeypatch, fake)
    return fake


# -- usage and spans -----------------------------------------------------------------


def test_chat_commits_usage_and_describes_its_span(
    server: FakeLLMServer, client: Mistral, span_exporter: InMemorySpanExporter
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        reply = _chat(client)
    assert reply.usage.prompt_tokens == INPUT
    snap = ctx.snapshot()
    _charged(snap, _cost())
    assert snap.tokens == INPUT + OUTPUT
    assert server.count(CHAT) == 1
    (span,) = [s for s in span_exporter.get_finished_spans() if s.kind is SpanKind.CLIENT]
    attributes = dict(span.attributes or {})
    assert span.name == f"chat {MODEL}"
    assert attributes["gen_ai.provider.name"] == "mistral_ai"
    assert attributes["gen_ai.response.id"] == reply.id
    assert attributes["gen_ai.response.model"] == MODEL
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert attributes["gen_ai.usage.input_tokens"] == INPUT
    assert attributes["server.address"] == "127.0.0.1"


def test_no_chain_passes_through(server: FakeLLMServer, client: Mistral) -> None:
    assert _chat(client).usage.completion_tokens == OUTPUT
    assert server.count(CHAT) == 1


def test_stream_commits_the_final_chunks_usage(server: FakeLLMServer, client: Mistral) -> None:
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
        client.chat.stream(model=MODEL, messages=MESSAGES, max_tokens=CAP) as stream,
    ):
        events = list(stream)
    assert events[-1].data.usage is not None
    _charged(ctx.snapshot(), _cost())
    assert server.count(CHAT) == 1


@pytest.mark.asyncio
async def test_async_chat_and_stream(server: FakeLLMServer, aclient: Mistral) -> None:
    async with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        await _achat(aclient)
        stream = await aclient.chat.stream_async(model=MODEL, messages=MESSAGES, max_tokens=CAP)
        texts = [event.data.choices[0].delta.content async for event in stream]
    assert "".join(t for t in texts if isinstance(t, str)) == "tok0 tok1 tok2 tok3 tok4"
    snap = ctx.snapshot()
    _charged(snap, 2 * _cost(), steps=2)
    assert server.count(CHAT) == 2


def test_embeddings_and_fim_are_priced(server: FakeLLMServer, client: Mistral) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        client.embeddings.create(model="mistral-embed", inputs=["a", "b"])
        client.fim.complete(model="codestral-latest", prompt="def f(", suffix=")", max_tokens=CAP)
    expected = _cost("mistral-embed", INPUT, 0) + _cost("codestral-latest")
    _charged(ctx.snapshot(), expected, steps=2)
    assert server.count("/v1/embeddings") == server.count("/v1/fim/completions") == 1


def test_uncapped_chat_is_clamped_under_a_ceiling(server: FakeLLMServer, client: Mistral) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.001)) as ctx:
        client.chat.complete(model=MODEL, messages=MESSAGES)
    cap = server.requests[-1].body["max_tokens"]
    assert isinstance(cap, int) and 0 < cap < 10_000  # what $0.001 buys at $0.60 / M out
    _charged(ctx.snapshot(), _cost())


# -- refused before sending ------------------------------------------------------------


def test_steps_limit_lets_exactly_n_through(server: FakeLLMServer, client: Mistral) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=3)) as ctx:
        for _ in range(3):
            _chat(client)
        with pytest.raises(BudgetExceededError) as caught:
            _chat(client)
    assert caught.value.reason == "steps"
    assert (ctx.snapshot().steps, server.count(CHAT)) == (3, 3)


def test_cost_ceiling_denies_before_sending(server: FakeLLMServer, client: Mistral) -> None:
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=_reservation(10_000) / 2)) as ctx,
        pytest.raises(BudgetExceededError) as caught,
    ):
        _chat(client, max_tokens=10_000)
    assert caught.value.reason == "cost"
    assert server.request_count == 0
    assert ctx.snapshot().steps == 0


def test_unknown_model_and_unpriced_endpoints_are_refused_under_a_ceiling(
    server: FakeLLMServer, client: Mistral
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        with pytest.raises(BudgetExceededError, match=r"mistral-nope-1.*VERONICA_MODEL_ALIASES"):
            _chat(client, model="mistral-nope-1")
        with pytest.raises(BudgetExceededError, match="'ag:fake-agent'"):
            client.agents.complete(agent_id="ag:fake-agent", messages=MESSAGES)
        with pytest.raises(BudgetExceededError, match="v1/ocr:mistral-ocr-latest"):
            client.ocr.process(
                model="mistral-ocr-latest",
                document={"type": "document_url", "document_url": "https://x.test/a.pdf"},
            )
        with pytest.raises(BudgetExceededError, match="v1/batch:mistral-small-latest"):
            client.batch.jobs.create(endpoint="/v1/chat/completions", model=MODEL, input_files=[])
        with pytest.raises(BudgetExceededError, match="v1/conversations"):
            client.beta.conversations.start(inputs="hi", model=MODEL)
    assert server.request_count == 0
    assert ctx.snapshot().steps == 0


def test_agents_without_a_ceiling_count_a_step(server: FakeLLMServer, client: Mistral) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=5)) as ctx:
        client.agents.complete(agent_id="ag:fake-agent", messages=MESSAGES)
    assert (ctx.snapshot().steps, ctx.snapshot().tokens) == (1, INPUT + OUTPUT)
    assert server.count("/v1/agents/completions") == 1


def test_free_endpoints_pass_uncounted(server: FakeLLMServer, client: Mistral) -> None:
    from mistralai.client import errors

    with (
        ExecutionContext(ExecutionConfig(max_steps=0)) as ctx,
        pytest.raises(errors.SDKError),  # the fake server has no files API: a 404
    ):
        client.files.list()
    assert ctx.snapshot().steps == 0
    assert server.count("/v1/files") == 1


# -- concurrency --------------------------------------------------------------------------


def _outcome(client: Mistral) -> str:
    try:
        _chat(client)
    except BudgetExceededError as exc:
        return exc.reason
    return "ok"


def test_threads_never_pass_the_steps_limit(server: FakeLLMServer, client: Mistral) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=5)) as ctx, ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(contextvars.copy_context().run, _outcome, client) for _ in range(9)]
        outcomes = [f.result() for f in futures]
    sent = outcomes.count("ok")
    assert 1 <= sent <= 5
    assert outcomes.count("steps") == 9 - sent
    assert ctx.snapshot().steps == sent == server.count(CHAT)


@pytest.mark.asyncio
async def test_tasks_share_the_steps_limit(server: FakeLLMServer, aclient: Mistral) -> None:
    async def call() -> str:
        try:
            await _achat(aclient)
        except BudgetExceededError as exc:
            return exc.reason
        return "ok"

    async with ExecutionContext(ExecutionConfig(max_steps=4)) as ctx:
        outcomes = await asyncio.gather(*(call() for _ in range(7)))
    assert sorted(outcomes) == ["ok"] * 4 + ["steps"] * 3
    assert ctx.snapshot().steps == server.count(CHAT) == 4


# -- streams cut mid-way -----------------------------------------------------------------


def test_stream_cut_by_the_deadline_keeps_partial_text(
    server: FakeLLMServer, client: Mistral, clock: FakeClock
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, timeout_ms=60_000)) as ctx:
        stream = client.chat.stream(model=MODEL, messages=MESSAGES, max_tokens=CAP)
        next(stream)
        next(stream)  # "tok0"
        clock.advance(61)
        with pytest.raises(BudgetExceededError) as caught:
            next(stream)
        stream.close()
    assert caught.value.reason == "timeout"
    assert ctx.get_partial_result() == "tok0"
    _charged(ctx.snapshot(), _reservation())  # the final usage never came: the worst case


@pytest.mark.asyncio
async def test_async_stream_cut_by_a_cancel(server: FakeLLMServer, aclient: Mistral) -> None:
    async with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        stream = await aclient.chat.stream_async(model=MODEL, messages=MESSAGES, max_tokens=CAP)
        await stream.__anext__()
        ctx.cancel()
        with pytest.raises(BudgetExceededError):
            await stream.__anext__()
        await stream.close()
    _charged(ctx.snapshot(), _reservation())
    assert server.count(CHAT) == 1


# -- the SDK's own retries ------------------------------------------------------------------


def test_sdk_retries_are_drawn_from_the_chain(server: FakeLLMServer, client: Mistral) -> None:
    server.fail_next(2, status=503)
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_retries_total=5)) as ctx:
        _chat(client, retries=_retry())
    snap = ctx.snapshot()
    assert (snap.steps, snap.retries) == (1, 2)
    assert snap.cost_usd == pytest.approx(_cost(), abs=1e-12)
    assert server.count(CHAT) == 3


@pytest.mark.asyncio
async def test_sdk_retries_stop_at_max_retries_total(
    server: FakeLLMServer, aclient: Mistral
) -> None:
    server.fail_next(10, status=429)
    async with ExecutionContext(ExecutionConfig(max_retries_total=2)) as ctx:
        with pytest.raises(BudgetExceededError) as caught:
            await _achat(aclient, retries=_retry())
    assert caught.value.reason == "retries"
    assert server.count(CHAT) == 3  # the first send and two retries; the third never leaves
    assert ctx.snapshot().retries == 2


# -- what a failed call costs (G10) ---------------------------------------------------------


def test_connection_refused_is_released(instrumented: MistralAIInstrumentor) -> None:
    from mistralai.client import Mistral

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with (
        Mistral(api_key="k", server_url=f"http://127.0.0.1:{port}") as mistral,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_retries_total=5)) as ctx,
        pytest.raises(httpx2.ConnectError),
    ):
        _chat(mistral)
    _charged(ctx.snapshot(), 0.0, steps=0)


def test_http_error_costs_nothing_and_counts_the_step(
    server: FakeLLMServer, client: Mistral
) -> None:
    from mistralai.client import errors

    server.fail_next(1, status=400)
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
        pytest.raises(errors.SDKError) as caught,
    ):
        _chat(client)
    assert '"object":"error"' in caught.value.body
    _charged(ctx.snapshot(), 0.0)


def test_timeout_after_sending_commits_the_reservation(
    server: FakeLLMServer, instrumented: MistralAIInstrumentor
) -> None:
    from mistralai.client import Mistral

    server.set_latency(2.0)
    with (
        Mistral(api_key="k", server_url=server.base_url, timeout_ms=200) as mistral,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
        pytest.raises(httpx2.ReadTimeout),
    ):
        _chat(mistral)
    _charged(ctx.snapshot(), _reservation())
    assert server.count(CHAT) == 1


# -- instrument / uninstrument ---------------------------------------------------------------


def test_uninstrument_restores_the_sdk(server: FakeLLMServer) -> None:
    from mistralai.client import Mistral
    from mistralai.client.basesdk import BaseSDK

    originals = {name: BaseSDK.__dict__[name] for name in ("do_request", "do_request_async")}
    instrumentor = MistralAIInstrumentor()
    instrumentor.instrument()
    instrumentor._instrument()  # never wraps twice
    try:
        for name, original in originals.items():
            assert BaseSDK.__dict__[name].__wrapped__ is original
        with Mistral(api_key="k", server_url=server.base_url) as mistral:
            instrumentor.uninstrument()
            with ExecutionContext(ExecutionConfig(max_steps=0)) as after:
                _chat(mistral)  # not contained any more: max_steps=0 would deny it
        assert after.snapshot().steps == 0
        assert {name: BaseSDK.__dict__[name] for name in originals} == originals
    finally:
        instrumentor.uninstrument()


def test_a_version_outside_the_range_fails_closed(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mistralai.client import Mistral

    real = hooks_module.version
    monkeypatch.setattr(
        hooks_module, "version", lambda name: "4.0.0" if name == "mistralai" else real(name)
    )
    instrumentor = MistralAIInstrumentor()
    with pytest.raises(InstrumentationError, match=r"mistralai 4\.0\.0: the version"):
        instrumentor._instrument()
    try:
        with (
            Mistral(api_key="k", server_url=server.base_url) as mistral,
            ExecutionContext(ExecutionConfig(max_steps=5)),
            pytest.raises(InstrumentationError),
        ):
            _chat(mistral)
    finally:
        instrumentor.uninstrument()
        instrumentor._hooks.lift()
    assert server.request_count == 0
    assert version("mistralai").startswith("3.")
