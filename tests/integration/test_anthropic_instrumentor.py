"""AnthropicInstrumentor: the real anthropic SDK against the embedded fake server."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pydantic
import pytest
from opentelemetry import baggage
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests._clock import patch_chain_clock
from veronica_otel import (
    BudgetExceededError,
    CircuitBreaker,
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
FALLBACK = "claude-3-haiku-20240307"
MESSAGES: list[MessageParam] = [{"role": "user", "content": "Say hello."}]
PATH = "/v1/messages"
INPUT, OUTPUT, CACHED = 10, 5, 4
FULL_TEXT = " ".join(f"tok{i}" for i in range(OUTPUT))


def _cost(model: str = MODEL, inp: int = INPUT, out: int = OUTPUT, cached: int = CACHED) -> float:
    prices = default_price_table().lookup("anthropic", model)
    assert prices is not None
    return nano_to_usd(prices.cost_nano(inp, out, cached))


# -- fixtures -----------------------------------------------------------------


@pytest.fixture
def instrumented() -> Iterator[AnthropicInstrumentor]:
    instrumentor = AnthropicInstrumentor()
    instrumentor.instrument()
    yield instrumentor
    instrumentor.uninstrument()


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(input_tokens=INPUT, output_tokens=OUTPUT, cached_tokens=CACHED) as fake:
        yield fake


@pytest.fixture
def client(
    server: FakeLLMServer, instrumented: AnthropicInstrumentor
) -> Iterator[anthropic.Anthropic]:
    import anthropic

    with anthropic.Anthropic(
        base_url=server.anthropic_base_url, api_key="test", max_retries=0
    ) as claude:
        yield claude


class FakeClock:
    """Moves the kernel's monotonic clock forward without sleeping."""

    def __init__(self) -> None:
        self.shift = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.shift

    def advance(self, seconds: float) -> None:
        self.shift += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    patch_chain_clock(monkeypatch, fake)
    return fake


def _create(claude: anthropic.Anthropic, **kwargs: Any) -> anthropic.types.Message:
    params: dict[str, Any] = {"model": MODEL, "max_tokens": 100, "messages": MESSAGES}
    params.update(kwargs)
    return claude.messages.create(**params)


# -- usage ----------------------------------------------------------------------


def test_create_commits_usage_with_cache_tokens(
    server: FakeLLMServer, client: anthropic.Anthropic
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        message = _create(client)
    assert message.usage.input_tokens == INPUT - CACHED  # Anthropic excludes cache reads
    snap = ctx.snapshot()
    assert (snap.steps, snap.tokens, snap.reserved_usd) == (1, INPUT + OUTPUT, 0.0)
    assert snap.cost_usd == _cost()
    assert server.count(PATH) == 1


def test_no_chain_passes_through(server: FakeLLMServer, client: anthropic.Anthropic) -> None:
    assert _create(client).usage.output_tokens == OUTPUT
    assert server.count(PATH) == 1


@pytest.mark.asyncio
async def test_async_create(server: FakeLLMServer, instrumented: AnthropicInstrumentor) -> None:
    import anthropic

    async with (
        anthropic.AsyncAnthropic(
            base_url=server.anthropic_base_url, api_key="test", max_retries=0
        ) as claude,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        await claude.messages.create(model=MODEL, max_tokens=100, messages=MESSAGES)
    snap = ctx.snapshot()
    assert (snap.steps, snap.tokens, snap.cost_usd) == (1, INPUT + OUTPUT, _cost())


def test_raw_stream_usage_counted_once(server: FakeLLMServer, client: anthropic.Anthropic) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        stream = _create(client, stream=True)
        with stream:
            events = list(stream)
    assert events[-1].type == "message_stop"
    snap = ctx.snapshot()
    # message_delta's output is cumulative: 5, not 1 (message_start) + 5.
    assert (snap.steps, snap.tokens, snap.cost_usd) == (1, INPUT + OUTPUT, _cost())
    assert snap.reserved_usd == 0.0
    assert ctx.get_partial_result() == FULL_TEXT


def test_stream_helper_sync(server: FakeLLMServer, client: anthropic.Anthropic) -> None:
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
        client.messages.stream(model=MODEL, max_tokens=100, messages=MESSAGES) as stream,
    ):
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == FULL_TEXT
    assert final.usage.output_tokens == OUTPUT
    snap = ctx.snapshot()
    assert (snap.steps, snap.tokens, snap.cost_usd, snap.reserved_usd) == (
        1,
        INPUT + OUTPUT,
        _cost(),
        0.0,
    )


@pytest.mark.asyncio
async def test_stream_helper_and_raw_stream_async(
    server: FakeLLMServer, instrumented: AnthropicInstrumentor
) -> None:
    import anthropic

    async with (
        anthropic.AsyncAnthropic(
            base_url=server.anthropic_base_url, api_key="test", max_retries=0
        ) as claude,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        async with claude.messages.stream(model=MODEL, max_tokens=100, messages=MESSAGES) as stream:
            text = "".join([piece async for piece in stream.text_stream])
            final = await stream.get_final_message()
        raw = await claude.messages.create(
            model=MODEL, max_tokens=100, messages=MESSAGES, stream=True
        )
        async with raw:
            kinds = [event.type async for event in raw]
    assert text == FULL_TEXT
    assert final.usage.output_tokens == OUTPUT
    assert kinds[-1] == "message_stop"
    snap = ctx.snapshot()
    assert (snap.steps, snap.tokens, snap.reserved_usd) == (2, 2 * (INPUT + OUTPUT), 0.0)
    assert snap.cost_usd == pytest.approx(2 * _cost(), abs=1e-12)


class Answer(pydantic.BaseModel):
    answer: str


def test_parse_and_beta_are_contained(server: FakeLLMServer, client: anthropic.Anthropic) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=3)) as ctx:
        parsed = client.messages.parse(
            model=MODEL, max_tokens=100, messages=MESSAGES, output_format=Answer
        )
        client.beta.messages.create(model=MODEL, max_tokens=100, messages=MESSAGES)
        with client.beta.messages.stream(model=MODEL, max_tokens=100, messages=MESSAGES) as bs:
            bs.get_final_message()
        with pytest.raises(BudgetExceededError) as denied:
            client.beta.messages.create(model=MODEL, max_tokens=100, messages=MESSAGES)
    assert isinstance(parsed.parsed_output, Answer)
    assert denied.value.reason == "steps"
    assert ctx.snapshot().steps == 3
    assert server.count(PATH) == 3


def test_count_tokens_is_free(server: FakeLLMServer, client: anthropic.Anthropic) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=1)) as ctx:
        for _ in range(3):
            client.messages.count_tokens(model=MODEL, messages=MESSAGES)
    snap = ctx.snapshot()
    assert (snap.steps, snap.cost_usd, snap.tokens) == (0, 0.0, 0)
    assert server.count("/v1/messages/count_tokens") == 3


def test_user_errors_reraise_unchanged_and_release(
    server: FakeLLMServer, client: anthropic.Anthropic
) -> None:
    import anthropic

    server.fail_next(1, status=400)
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
        pytest.raises(anthropic.BadRequestError),
    ):
        _create(client)
    snap = ctx.snapshot()
    assert (snap.reserved_usd, snap.cost_usd, snap.aborted) == (0.0, 0.0, False)


# -- every trip reason: the denied call never reaches the server ------------------


def _denied(server: FakeLLMServer, claude: anthropic.Anthropic, reason: str) -> None:
    before = server.count(PATH)
    with pytest.raises(BudgetExceededError) as caught:
        _create(claude)
    assert caught.value.reason == reason
    assert caught.value.__cause__ is None
    assert server.count(PATH) == before


def test_cost_denied_before_sending(server: FakeLLMServer, client: anthropic.Anthropic) -> None:
    # 100 output tokens at $4/M cost more than the whole budget.
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.0001)) as ctx:
        _denied(server, client, "cost")
    assert ctx.snapshot().reserved_usd == 0.0
    assert server.count(PATH) == 0


def test_steps_denied_before_sending(server: FakeLLMServer, client: anthropic.Anthropic) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=2)) as ctx:
        _create(client)
        _create(client)
        _denied(server, client, "steps")
        _denied(server, client, "steps")  # sticky
    assert ctx.snapshot().steps == 2
    assert server.count(PATH) == 2


def test_tokens_denied_before_sending(server: FakeLLMServer, client: anthropic.Anthropic) -> None:
    # max_tokens=100 alone does not fit a 50-token chain: reserved, not clamped.
    with ExecutionContext(ExecutionConfig(max_tokens=50)):
        _denied(server, client, "tokens")
    assert server.count(PATH) == 0


def test_timeout_denied_before_sending(
    server: FakeLLMServer, client: anthropic.Anthropic, clock: FakeClock
) -> None:
    with ExecutionContext(ExecutionConfig(timeout_ms=60_000)):
        _create(client)
        clock.advance(61)
        _denied(server, client, "timeout")
    assert server.count(PATH) == 1


def test_loop_denied_before_sending(server: FakeLLMServer, client: anthropic.Anthropic) -> None:
    with ExecutionContext(ExecutionConfig(max_repeats=2)):
        _create(client)
        _create(client)
        _denied(server, client, "loop")
    assert server.count(PATH) == 2


def test_circuit_open_denied_before_sending(
    server: FakeLLMServer, client: anthropic.Anthropic
) -> None:
    import anthropic

    breaker = CircuitBreaker(failure_threshold=1, recovery_timeout=60.0, clock=lambda: 0.0)
    server.fail_next(1, status=500)
    with ExecutionContext(pipeline=PolicyPipeline([breaker])):
        with pytest.raises(anthropic.InternalServerError):
            _create(client)
        _denied(server, client, "circuit_open")
    assert server.count(PATH) == 1


def test_unknown_model_denied_before_sending(
    server: FakeLLMServer, client: anthropic.Anthropic
) -> None:
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
        pytest.raises(BudgetExceededError) as caught,
    ):
        _create(client, model="claude-no-such-model-9")
    assert caught.value.reason == "cost"
    assert "claude-no-such-model-9" in str(caught.value)
    assert server.count(PATH) == 0
    assert ctx.snapshot().steps == 0


# -- retries inside the SDK -------------------------------------------------------


def test_sdk_retries_are_counted(
    server: FakeLLMServer, instrumented: AnthropicInstrumentor
) -> None:
    import anthropic

    server.fail_next(2, status=529, retry_after_ms=1)
    with (
        anthropic.Anthropic(
            base_url=server.anthropic_base_url, api_key="test", max_retries=5
        ) as claude,
        ExecutionContext(ExecutionConfig(max_retries_total=5)) as ctx,
    ):
        _create(claude)
    snap = ctx.snapshot()
    assert (snap.steps, snap.retries) == (1, 2)
    assert server.count(PATH) == 3
    assert [r.headers["x-stainless-retry-count"] for r in server.requests] == ["0", "1", "2"]


def test_sdk_retries_cut_at_max_retries_total(
    server: FakeLLMServer, instrumented: AnthropicInstrumentor
) -> None:
    import anthropic

    server.fail_next(10, status=500, retry_after_ms=1)
    with (
        anthropic.Anthropic(
            base_url=server.anthropic_base_url, api_key="test", max_retries=8
        ) as claude,
        ExecutionContext(ExecutionConfig(max_retries_total=2)) as ctx,
    ):
        with pytest.raises(BudgetExceededError) as caught:
            _create(claude)
        # The first send and exactly two retries; the third retry never leaves.
        assert server.count(PATH) == 3
        _denied(server, claude, "retries")  # sticky: not even a first attempt
    assert caught.value.reason == "retries"
    assert caught.value.__cause__ is None
    assert ctx.snapshot().retries == 2
    assert server.count(PATH) == 3


# -- degradations ----------------------------------------------------------------


class Degrade:
    """A policy that sends calls to a cheaper model with a smaller output cap."""

    policy_type = "degrade"

    def check(self, context: PolicyContext) -> PolicyDecision:
        return PolicyDecision(
            True, self.policy_type, fallback_model=FALLBACK, max_tokens=3, rate_limit_ms=1
        )

    def reset(self) -> None:
        pass


def test_fallback_model_and_clamp_applied(
    server: FakeLLMServer, client: anthropic.Anthropic, span_exporter: InMemorySpanExporter
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0), PolicyPipeline([Degrade()])) as ctx:
        message = _create(client)
    sent = server.requests[-1].body
    assert (sent["model"], sent["max_tokens"]) == (FALLBACK, 3)
    assert message.usage.output_tokens == 3
    assert ctx.snapshot().cost_usd == _cost(FALLBACK, out=3)
    (span,) = [s for s in span_exporter.get_finished_spans() if s.kind is SpanKind.CLIENT]
    assert span.attributes is not None
    assert span.attributes["veronica.fallback_model"] == FALLBACK
    assert span.attributes["gen_ai.request.max_tokens"] == 3


def test_trip_after_admission_stops_the_send_and_gives_the_step_back(
    server: FakeLLMServer, instrumented: AnthropicInstrumentor
) -> None:
    import anthropic

    def cancel_then_send(request: Any, call_next: Any) -> Any:
        ctx.cancel()  # the chain stops between admission and the HTTP send
        return call_next(request)

    with (
        anthropic.Anthropic(
            base_url=server.anthropic_base_url,
            api_key="test",
            max_retries=3,
            middleware=[cancel_then_send],
        ) as claude,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
        pytest.raises(BudgetExceededError) as caught,
    ):
        _create(claude)
    assert caught.value.reason == "timeout"
    snap = ctx.snapshot()
    assert (snap.steps, snap.retries, snap.cost_usd, snap.reserved_usd) == (0, 0, 0.0, 0.0)
    assert server.count(PATH) == 0


def test_an_admitted_call_is_sent_even_if_another_call_trips_the_chain(
    server: FakeLLMServer, client: anthropic.Anthropic
) -> None:
    # Deterministic version of the race concurrent calls hit: this call is
    # admitted (step 1 of 1); before its send, another call is denied (a
    # sticky trip). Its step was counted within the limit: it is sent.
    import anthropic

    outcomes: list[str] = []

    def another_call_first(request: Any, call_next: Any) -> Any:
        try:
            _create(client)
        except BudgetExceededError as exc:
            outcomes.append(exc.reason)
        return call_next(request)

    with (
        anthropic.Anthropic(
            base_url=server.anthropic_base_url,
            api_key="test",
            max_retries=0,
            middleware=[another_call_first],
        ) as racing,
        ExecutionContext(ExecutionConfig(max_steps=1)) as ctx,
    ):
        _create(racing)
        with pytest.raises(BudgetExceededError):
            _create(racing)  # the trip is sticky for new calls
    assert outcomes == ["steps"]
    assert server.count(PATH) == 1
    assert ctx.snapshot().steps == 1


# -- streams cut mid-way ----------------------------------------------------------


def test_stream_cut_by_deadline_keeps_partial_text(
    server: FakeLLMServer, client: anthropic.Anthropic, clock: FakeClock
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, timeout_ms=60_000)) as ctx:
        stream = _create(client, stream=True)
        with stream:
            seen = []
            with pytest.raises(BudgetExceededError) as caught:
                for event in stream:
                    seen.append(event.type)
                    if seen.count("content_block_delta") == 2:
                        clock.advance(61)
    assert caught.value.reason == "timeout"
    assert ctx.get_partial_result() == "tok0 tok1"
    snap = ctx.snapshot()
    assert (snap.steps, snap.reserved_usd, snap.aborted) == (1, 0.0, True)
    assert snap.cost_usd > 0  # a cut stream is charged for what it may have used
    assert server.count(PATH) == 1


def test_stream_cut_by_real_deadline(instrumented: AnthropicInstrumentor) -> None:
    import anthropic

    with (
        FakeLLMServer(output_tokens=200, chunk_delay_s=0.02) as server,
        anthropic.Anthropic(
            base_url=server.anthropic_base_url, api_key="test", max_retries=0
        ) as claude,
    ):
        started = time.monotonic()
        with (
            ExecutionContext(ExecutionConfig(timeout_ms=400)) as ctx,
            pytest.raises(BudgetExceededError) as caught,
            claude.messages.stream(model=MODEL, max_tokens=1000, messages=MESSAGES) as stream,
        ):
            for _ in stream.text_stream:
                pass
        elapsed = time.monotonic() - started
    assert caught.value.reason == "timeout"
    partial = ctx.get_partial_result()
    assert partial.startswith("tok0")
    assert len(partial.split()) < 200
    assert elapsed < 2.5  # 200 chunks x 20 ms would take 4 s


def test_stream_cut_by_trip_from_another_call(
    server: FakeLLMServer, client: anthropic.Anthropic
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=2)) as ctx:
        stream = _create(client, stream=True)
        with stream:
            events = iter(stream)
            while next(events).type != "content_block_delta":
                pass
            _create(client)  # step 2
            _denied(server, client, "steps")  # trips the chain
            with pytest.raises(BudgetExceededError) as caught:
                next(events)
    assert caught.value.reason == "steps"
    assert ctx.get_partial_result() == "tok0"
    assert ctx.snapshot().reserved_usd == 0.0


@pytest.mark.asyncio
async def test_async_stream_cut_by_deadline(
    server: FakeLLMServer, instrumented: AnthropicInstrumentor, clock: FakeClock
) -> None:
    import anthropic

    async with (
        anthropic.AsyncAnthropic(
            base_url=server.anthropic_base_url, api_key="test", max_retries=0
        ) as claude,
        ExecutionContext(ExecutionConfig(timeout_ms=60_000)) as ctx,
        claude.messages.stream(model=MODEL, max_tokens=100, messages=MESSAGES) as stream,
    ):
        with pytest.raises(BudgetExceededError) as caught:
            async for _ in stream.text_stream:
                clock.advance(61)
    assert caught.value.reason == "timeout"
    assert ctx.get_partial_result() == "tok0"
    assert ctx.snapshot().reserved_usd == 0.0


def test_stream_closed_early_or_dropped_settles_once(
    server: FakeLLMServer, client: anthropic.Anthropic
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        stream = _create(client, stream=True)
        next(iter(stream))
        stream.close()
        stream.close()
        assert ctx.snapshot().reserved_usd == 0.0
        dropped = _create(client, stream=True)
        next(iter(dropped))
        assert ctx.snapshot().reserved_usd > 0
        del dropped
        gc.collect()
    snap = ctx.snapshot()
    assert (snap.steps, snap.reserved_usd) == (2, 0.0)


# -- spans ------------------------------------------------------------------------


def test_one_span_per_call_the_sdks(
    server: FakeLLMServer, client: anthropic.Anthropic, span_exporter: InMemorySpanExporter
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=2)) as ctx:
        _create(client)
        with client.messages.stream(model=MODEL, max_tokens=100, messages=MESSAGES) as stream:
            stream.get_final_message()
        with pytest.raises(BudgetExceededError):
            _create(client)
    calls = [s for s in span_exporter.get_finished_spans() if s.kind is SpanKind.CLIENT]
    assert [s.name for s in calls] == ["anthropic.messages.create"] * 3
    for span in calls:
        assert span.attributes is not None
        assert span.attributes["veronica.chain.id"] == ctx.chain_id
    ok, streamed, denied = (s.attributes for s in calls)
    assert ok is not None and streamed is not None and denied is not None
    for attrs in (ok, streamed):
        assert attrs["veronica.decision"] == "ALLOW"
        assert attrs["veronica.cost_usd"] == _cost()
        assert attrs["gen_ai.usage.input_tokens"] == INPUT
    assert denied["veronica.decision"] == "HALT"
    assert [e.name for e in calls[2].events] == ["veronica.trip"]


def test_own_span_when_sdk_tracing_is_off(
    server: FakeLLMServer,
    instrumented: AnthropicInstrumentor,
    span_exporter: InMemorySpanExporter,
) -> None:
    import anthropic

    with (
        anthropic.Anthropic(
            base_url=server.anthropic_base_url, api_key="test", max_retries=0, open_telemetry=False
        ) as claude,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        _create(claude)
        stream = _create(claude, stream=True)
        with stream:
            list(stream)
    calls = [s for s in span_exporter.get_finished_spans() if s.kind is SpanKind.CLIENT]
    assert [s.name for s in calls] == [f"chat {MODEL}"] * 2
    for span in calls:
        attrs = span.attributes
        assert attrs is not None
        assert attrs["veronica.chain.id"] == ctx.chain_id
        assert attrs["gen_ai.provider.name"] == "anthropic"
        assert attrs["gen_ai.usage.output_tokens"] == OUTPUT
        assert span.parent is not None  # under the chain's span
        # The GenAI Recommended attributes, as the SDK's own span would carry them.
        assert attrs["server.address"] == "127.0.0.1"
        assert attrs["server.port"] == server.port
        assert str(attrs["gen_ai.response.id"]).startswith("msg_")
        assert attrs["gen_ai.response.model"] == MODEL
        assert list(attrs["gen_ai.response.finish_reasons"]) == ["end_turn"]  # type: ignore[arg-type]
        assert not [key for key in attrs if key.startswith("veronica.remaining.")]


def test_no_veronica_baggage_sent_to_the_vendor(
    server: FakeLLMServer, instrumented: AnthropicInstrumentor
) -> None:
    import anthropic

    server.fail_next(1, status=529, retry_after_ms=1)
    ctx = baggage.set_baggage("veronica.chain", "x")
    ctx = baggage.set_baggage("tenant", "acme", ctx)
    token = otel_context.attach(ctx)
    try:
        with (
            anthropic.Anthropic(
                base_url=server.anthropic_base_url, api_key="test", max_retries=1
            ) as claude,
            ExecutionContext(ExecutionConfig(max_cost_usd=1.0)),
        ):
            _create(claude)
            assert baggage.get_baggage("veronica.chain") == "x"  # restored after the call
    finally:
        otel_context.detach(token)
    assert len(server.requests) == 2
    for request in server.requests:
        sent = request.headers.get("baggage", "")
        assert "tenant=acme" in sent
        assert "veronica." not in sent


# -- instrument / uninstrument ------------------------------------------------------


def test_uninstrument_restores_the_sdk(server: FakeLLMServer) -> None:
    import anthropic
    import anthropic._base_client as base

    originals = {
        (owner, name): getattr(base, owner).__dict__[name]
        for owner, name in (
            ("SyncAPIClient", "_request"),
            ("AsyncAPIClient", "_request"),
            ("SyncAPIClient", "_attempt_request"),
            ("AsyncAPIClient", "_attempt_request"),
            ("BaseClient", "_process_response_data"),
        )
    }
    instrumentor = AnthropicInstrumentor()
    instrumentor.instrument()
    instrumentor.instrument()  # idempotent: warns in the log, wraps nothing twice
    instrumentor._instrument()  # even the raw hook does not double-wrap
    try:
        for (owner, name), original in originals.items():
            assert getattr(base, owner).__dict__[name].__wrapped__ is original
        with anthropic.Anthropic(
            base_url=server.anthropic_base_url, api_key="test", max_retries=0
        ) as claude:
            with ExecutionContext(ExecutionConfig(max_steps=5)) as ctx:
                _create(claude)
            assert ctx.snapshot().steps == 1
            instrumentor.uninstrument()
            for (owner, name), original in originals.items():
                assert getattr(base, owner).__dict__[name] is original
            with ExecutionContext(ExecutionConfig(max_steps=0)) as after:
                _create(claude)  # not contained any more: max_steps=0 would deny it
            assert after.snapshot().steps == 0
    finally:
        instrumentor.uninstrument()
    assert server.count(PATH) == 2


# -- concurrency --------------------------------------------------------------------


def _outcome(claude: anthropic.Anthropic) -> str:
    try:
        _create(claude)
    except BudgetExceededError as exc:
        return exc.reason
    return "ok"


def test_threads_share_the_chain(server: FakeLLMServer, client: anthropic.Anthropic) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=12)) as ctx, ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(contextvars.copy_context().run, _outcome, client) for _ in range(12)]
        outcomes = [f.result() for f in futures]
        assert ctx.snapshot().steps == 12
        _denied(server, client, "steps")  # the workers used up the main thread's chain
    assert outcomes == ["ok"] * 12
    assert server.count(PATH) == 12


def test_threads_oversubscribed_never_pass_the_limit(
    server: FakeLLMServer, client: anthropic.Anthropic
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=5)) as ctx, ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(contextvars.copy_context().run, _outcome, client) for _ in range(12)]
        outcomes = [f.result() for f in futures]
    sent = outcomes.count("ok")
    # The sixth admission trips the chain (sticky): calls admitted before it but
    # not yet sent are stopped at their first attempt and give their step back.
    assert 1 <= sent <= 5
    assert outcomes.count("steps") == 12 - sent
    assert ctx.snapshot().steps == sent == server.count(PATH)
    assert ctx.snapshot().reserved_usd == 0.0


@pytest.mark.asyncio
async def test_tasks_share_the_chain(
    server: FakeLLMServer, instrumented: AnthropicInstrumentor
) -> None:
    import anthropic

    async with anthropic.AsyncAnthropic(
        base_url=server.anthropic_base_url, api_key="test", max_retries=0
    ) as claude:

        async def call() -> str:
            try:
                await claude.messages.create(model=MODEL, max_tokens=100, messages=MESSAGES)
            except BudgetExceededError as exc:
                return exc.reason
            return "ok"

        async with ExecutionContext(ExecutionConfig(max_steps=12)) as ctx:
            outcomes = await asyncio.gather(*(call() for _ in range(12)))
            assert ctx.snapshot().steps == 12
            assert await call() == "steps"
    assert outcomes == ["ok"] * 12
    assert server.count(PATH) == 12
