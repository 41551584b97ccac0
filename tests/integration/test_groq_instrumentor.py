"""GroqInstrumentor: the real ``groq`` SDK against the fake server's ``/openai/v1`` routes.

What was sent is the server's own count. The hooks are openai's (one
machinery for the Stainless SDKs), priced under provider ``groq``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests._bounds import input_bound
from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel._pricing import default_price_table
from veronica_otel._units import nano_to_usd
from veronica_otel.instrumentors._adapter import ADMITTED
from veronica_otel.instrumentors.groq import GroqInstrumentor
from veronica_otel.testing import FakeLLMServer

if TYPE_CHECKING:
    import groq

MODEL = "llama-3.3-70b-versatile"
SMALL = "llama-3.1-8b-instant"
CHAT = "/openai/v1/chat/completions"
MESSAGES: list[Any] = [{"role": "user", "content": "Say hello."}]
CAP = 50
INPUT, OUTPUT = 12, 6


def _prices(model: str = MODEL) -> Any:
    prices = default_price_table().lookup("groq", model)
    assert prices is not None, model
    return prices


def reply_cost(model: str = MODEL) -> float:
    return nano_to_usd(_prices(model).cost_nano(INPUT, OUTPUT))


def reservation(model: str = MODEL) -> float:
    return nano_to_usd(_prices(model).max_cost_nano(input_bound([MESSAGES], 1), CAP))


def chat(client: groq.Groq, **kwargs: Any) -> Any:
    params: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "max_completion_tokens": CAP}
    params.update(kwargs)
    return client.chat.completions.create(**params)


async def achat(client: groq.AsyncGroq, **kwargs: Any) -> Any:
    params: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "max_completion_tokens": CAP}
    params.update(kwargs)
    return await client.chat.completions.create(**params)


def denied(reason: str, call: Any) -> BudgetExceededError:
    with pytest.raises(BudgetExceededError) as info:
        call()
    assert info.value.reason == reason
    return info.value


# -- fixtures ------------------------------------------------------------------------


@pytest.fixture
def instrumentor() -> Iterator[GroqInstrumentor]:
    ours = GroqInstrumentor()
    ours.instrument()
    yield ours
    ours.uninstrument()


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(input_tokens=INPUT, output_tokens=OUTPUT) as fake:
        yield fake


@pytest.fixture
def client(server: FakeLLMServer, instrumentor: GroqInstrumentor) -> Iterator[groq.Groq]:
    import groq

    with groq.Groq(base_url=server.base_url, api_key="k", max_retries=0) as made:
        yield made


@pytest_asyncio.fixture
async def aclient(
    server: FakeLLMServer, instrumentor: GroqInstrumentor
) -> AsyncIterator[groq.AsyncGroq]:
    import groq

    async with groq.AsyncGroq(base_url=server.base_url, api_key="k", max_retries=0) as made:
        yield made


# -- steps and cost --------------------------------------------------------------------


def test_max_steps_lets_exactly_n_calls_reach_the_server(
    server: FakeLLMServer, client: groq.Groq, span_exporter: InMemorySpanExporter
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=2)) as ctx:
        first = chat(client)
        chat(client, model=SMALL)
        denied("steps", lambda: chat(client))
    assert server.count(CHAT) == 2
    assert first.choices[0].message.content
    assert ctx.snapshot().cost_usd == pytest.approx(reply_cost() + reply_cost(SMALL), abs=1e-12)
    spans = [s for s in span_exporter.get_finished_spans() if s.name.startswith("chat ")]
    assert {s.attributes["gen_ai.provider.name"] for s in spans} == {"groq"}
    assert {s.name for s in spans} == {f"chat {MODEL}", f"chat {SMALL}"}


def test_threads_share_the_chain(server: FakeLLMServer, client: groq.Groq) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=3)) as ctx, ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(chat, client) for _ in range(6)]
        errors = [f.exception() for f in futures]
    assert sum(e is None for e in errors) == 3 == server.count(CHAT)
    assert all(isinstance(e, BudgetExceededError) for e in errors if e is not None)
    assert ctx.snapshot().steps == 3


@pytest.mark.asyncio
async def test_async_calls_share_the_chain(server: FakeLLMServer, aclient: groq.AsyncGroq) -> None:
    async with ExecutionContext(ExecutionConfig(max_steps=3)) as ctx:
        results = await asyncio.gather(*(achat(aclient) for _ in range(5)), return_exceptions=True)
    denials = [r for r in results if isinstance(r, BudgetExceededError)]
    assert len(denials) == 2 and {d.reason for d in denials} == {"steps"}
    assert server.count(CHAT) == 3
    assert ctx.snapshot().cost_usd == pytest.approx(3 * reply_cost(), abs=1e-12)


def test_a_cost_ceiling_holds_on_the_usage_groq_reports(
    server: FakeLLMServer, client: groq.Groq
) -> None:
    ceiling = 2.5 * reservation()
    sent = 0
    with ExecutionContext(ExecutionConfig(max_cost_usd=ceiling)) as ctx:
        with pytest.raises(BudgetExceededError) as info:
            for _ in range(100):
                chat(client)
                sent += 1
        snap = ctx.snapshot()
    assert info.value.reason == "cost"
    assert sent == server.count(CHAT) > 2
    assert snap.cost_usd == pytest.approx(sent * reply_cost(), abs=1e-12)
    assert snap.cost_usd <= ceiling
    # Never one more: the next call's worst case did not fit what was left.
    assert snap.cost_usd + reservation() > ceiling


def test_an_unpriced_model_is_refused_under_a_ceiling_naming_it(
    server: FakeLLMServer, client: groq.Groq
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)):
        error = denied("cost", lambda: chat(client, model="no-such-groq-model"))
    assert "no-such-groq-model" in str(error)
    assert server.count(CHAT) == 0


# -- streams ---------------------------------------------------------------------------


def test_stream_commits_its_usage(server: FakeLLMServer, client: groq.Groq) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        text = "".join(
            c.choices[0].delta.content or "" for c in chat(client, stream=True) if c.choices
        )
    assert text
    assert ctx.snapshot().cost_usd > 0 and ctx.snapshot().reserved_usd == 0
    assert server.count(CHAT) == 1


def test_stream_is_cut_when_its_chain_trips(server: FakeLLMServer, client: groq.Groq) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=2)) as ctx:
        stream = chat(client, stream=True)
        next(iter(stream))
        chat(client)  # step 2
        denied("steps", lambda: chat(client))  # trips the chain
        with pytest.raises(BudgetExceededError) as info:
            for _ in stream:
                pass
    assert info.value.reason == "steps"
    assert stream.response.is_closed
    assert server.count(CHAT) == 2
    assert ctx.snapshot().reserved_usd == 0


@pytest.mark.asyncio
async def test_async_stream_is_cut_by_cancel(
    server: FakeLLMServer, aclient: groq.AsyncGroq
) -> None:
    async with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        stream = await achat(aclient, stream=True)
        with pytest.raises(BudgetExceededError):
            async for _ in stream:
                ctx.cancel()
    assert stream.response.is_closed
    assert ctx.snapshot().reserved_usd == 0


# -- retries and failures (G10) --------------------------------------------------------


def test_a_500_then_success_costs_the_reply_and_draws_a_retry(
    server: FakeLLMServer, instrumentor: GroqInstrumentor
) -> None:
    import groq

    server.fail_next(1, status=500, retry_after_ms=1)
    with (
        groq.Groq(base_url=server.base_url, api_key="k", max_retries=2) as retrying,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_retries_total=1)) as ctx,
    ):
        chat(retrying)
        snap = ctx.snapshot()
    assert server.count(CHAT) == 2
    assert snap.retries == 1 and snap.steps == 1
    assert snap.cost_usd == pytest.approx(reply_cost(), abs=1e-12)  # zero for the 500


def test_a_retry_over_the_chain_limit_is_never_sent(
    server: FakeLLMServer, instrumentor: GroqInstrumentor
) -> None:
    import groq

    server.fail_next(3, status=503, retry_after_ms=1)
    with (
        groq.Groq(base_url=server.base_url, api_key="k", max_retries=3) as retrying,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_retries_total=1)) as ctx,
    ):
        denied("retries", lambda: chat(retrying))
        snap = ctx.snapshot()
    assert server.count(CHAT) == 2  # the first attempt and the one retry allowed
    assert snap.cost_usd == 0 and snap.reserved_usd == 0


def test_an_error_reply_costs_nothing_and_reaches_the_caller(
    server: FakeLLMServer, client: groq.Groq
) -> None:
    import groq

    server.fail_next(1, status=429)
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        with pytest.raises(groq.RateLimitError):
            chat(client)
        snap = ctx.snapshot()
    assert server.count(CHAT) == 1
    assert snap.cost_usd == 0 and snap.steps == 1 and snap.reserved_usd == 0


def test_a_timeout_after_sending_commits_the_reservation(
    server: FakeLLMServer, instrumentor: GroqInstrumentor
) -> None:
    import groq

    server.set_latency(2.0)
    with (
        groq.Groq(base_url=server.base_url, api_key="k", max_retries=0, timeout=0.2) as slow,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        with pytest.raises(groq.APITimeoutError):
            chat(slow)
        snap = ctx.snapshot()
    assert server.count(CHAT) == 1
    assert snap.cost_usd == pytest.approx(reservation(), abs=1e-12) and snap.reserved_usd == 0


@pytest.mark.asyncio
async def test_a_call_cancelled_after_sending_commits_the_reservation(
    server: FakeLLMServer, aclient: groq.AsyncGroq
) -> None:
    server.set_latency(2.0)
    async with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(achat(aclient), 0.3)
    assert server.count(CHAT) == 1
    assert ctx.snapshot().cost_usd == pytest.approx(reservation(), abs=1e-12)


def test_a_connection_never_made_is_released(instrumentor: GroqInstrumentor) -> None:
    import groq

    with FakeLLMServer() as gone:
        url = gone.base_url  # a port nothing listens on once it stops
    with (
        groq.Groq(base_url=url, api_key="k", max_retries=0) as nowhere,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
        pytest.raises(groq.APIConnectionError),
    ):
        chat(nowhere)
    assert ctx.snapshot().cost_usd == 0 and ctx.snapshot().reserved_usd == 0


# -- counted once (G13) ------------------------------------------------------------------


def test_the_call_is_marked_admitted_while_it_runs(
    server: FakeLLMServer, client: groq.Groq
) -> None:
    seen: list[Any] = []
    original = client._client.send

    def send(*args: Any, **kwargs: Any) -> Any:
        seen.append(ADMITTED.get())  # what the HTTP layer under the SDK sees
        return original(*args, **kwargs)

    client._client.send = send  # type: ignore[method-assign]
    with ExecutionContext(ExecutionConfig(max_steps=5)):
        chat(client)
    marked = [call for call in seen if call is not None]
    # The transport reports its attempts (a resend draws a retry; the SDK's
    # retry hook draws each retry once with it).
    assert len(marked) == 1 and marked[0].provider == "groq" and marked[0].http_attempts
    assert ADMITTED.get() is None


def test_a_call_an_adapter_above_admitted_passes_through(
    server: FakeLLMServer, client: groq.Groq
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=1)) as ctx:
        chat(client)  # the step the chain allows
        outer = _OuterCall()
        token = ADMITTED.set(outer)  # type: ignore[arg-type]
        try:
            chat(client)  # counted by the adapter above, not again here
        finally:
            ADMITTED.reset(token)
        denied("steps", lambda: chat(client))
    assert server.count(CHAT) == 2
    assert ctx.snapshot().steps == 1


class _OuterCall:
    """What an adapter above (litellm's) leaves in ADMITTED: a call it admitted."""

    adapter = object()
    provider = "litellm"
    http_attempts = False  # the SDK's own retry hooks count its attempts
