"""BedrockInstrumentor: real boto3 / aiobotocore clients against the embedded fake server."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import pytest_asyncio
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from veronica_otel import BudgetExceededError, ChainSnapshot, ExecutionConfig, ExecutionContext
from veronica_otel._pricing import default_price_table
from veronica_otel._units import nano_to_usd
from veronica_otel.instrumentors import InstrumentationError
from veronica_otel.instrumentors import _hooks as hooks_module
from veronica_otel.instrumentors.bedrock import BedrockInstrumentor
from veronica_otel.testing import FakeLLMServer

HAIKU = "anthropic.claude-3-haiku-20240307-v1:0"
HAIKU_35 = "us.anthropic.claude-3-5-haiku-20241022-v1:0"
NOVA = "amazon.nova-lite-v1:0"
LLAMA = "meta.llama3-1-8b-instruct-v1:0"
MESSAGES = [{"role": "user", "content": [{"text": "Say hello."}]}]
INPUT, OUTPUT, CACHED = 10, 5, 4


def _converse_path(model: str, op: str = "converse") -> str:
    return f"/model/{model.replace(':', '%3A')}/{op}"


def _cost(model: str, inp: int = INPUT, out: int = OUTPUT, cached: int = CACHED) -> float:
    prices = default_price_table().lookup("aws.bedrock", model)
    assert prices is not None, model
    return nano_to_usd(prices.cost_nano(inp, out, cached))


# -- fixtures -------------------------------------------------------------------------


class Backoff:
    """botocore's retry sleeps, recorded instead of slept (its clock, injected)."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)

    async def asleep(self, seconds: float) -> None:
        self.slept.append(seconds)


@pytest.fixture
def backoff(monkeypatch: pytest.MonkeyPatch) -> Backoff:
    import aiobotocore.session
    import botocore.endpoint

    fake = Backoff()
    monkeypatch.setattr(botocore.endpoint, "time", fake)
    monkeypatch.setattr(aiobotocore.endpoint.AioEndpoint, "_sleep", fake.asleep)
    return fake


@pytest.fixture
def instrumented() -> Iterator[BedrockInstrumentor]:
    instrumentor = BedrockInstrumentor()
    instrumentor.instrument()
    yield instrumentor
    instrumentor.uninstrument()


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(input_tokens=INPUT, output_tokens=OUTPUT, cached_tokens=CACHED) as fake:
        yield fake


def _client(url: str, service: str = "bedrock-runtime", **retries: Any) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(retries=retries or {"mode": "standard", "max_attempts": 1})
    return boto3.client(
        service,
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        config=config,
    )


@pytest.fixture
def runtime(server: FakeLLMServer, instrumented: BedrockInstrumentor, backoff: Backoff) -> Any:
    client = _client(server.base_url)
    yield client
    client.close()


@pytest_asyncio.fixture
async def aruntime(
    server: FakeLLMServer, instrumented: BedrockInstrumentor, backoff: Backoff
) -> AsyncIterator[Any]:
    import aiobotocore.session
    from botocore.config import Config

    session = aiobotocore.session.get_session()
    async with session.create_client(
        "bedrock-runtime",
        endpoint_url=server.base_url,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        config=Config(retries={"mode": "standard", "max_attempts": 4}),
    ) as client:
        yield client


def _converse(client: Any, model: str = HAIKU, **kwargs: Any) -> Any:
    return client.converse(modelId=model, messages=MESSAGES, **kwargs)


# -- usage and the request as sent ---------------------------------------------------------


def test_converse_commits_usage_with_cache_reads(server: FakeLLMServer, runtime: Any) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        reply = _converse(runtime, inferenceConfig={"maxTokens": 50})
    assert reply["usage"]["inputTokens"] == INPUT - CACHED  # Bedrock counts cache reads apart
    snap = ctx.snapshot()
    assert (snap.steps, snap.tokens, snap.reserved_usd) == (1, INPUT + OUTPUT, 0.0)
    assert snap.cost_usd == pytest.approx(_cost(HAIKU))
    assert server.requests[-1].body["inferenceConfig"] == {"maxTokens": 50}


def test_converse_without_cache_tokens_commits_its_usage(
    instrumented: BedrockInstrumentor, backoff: Backoff
) -> None:
    # The reply's usage has no cache reads or writes (0): read without the cache sum.
    with FakeLLMServer(input_tokens=INPUT, output_tokens=OUTPUT) as fake:
        client = _client(fake.base_url)
        with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
            reply = _converse(client, inferenceConfig={"maxTokens": 50})
        client.close()
    assert reply["usage"]["inputTokens"] == INPUT
    assert not reply["usage"].get("cacheReadInputTokens")
    snap = ctx.snapshot()
    assert (snap.steps, snap.tokens, snap.reserved_usd) == (1, INPUT + OUTPUT, 0.0)
    assert snap.cost_usd == pytest.approx(_cost(HAIKU, cached=0))


def test_clients_of_other_services_between_bedrock_calls_pass_and_bedrock_still_counts(
    server: FakeLLMServer, runtime: Any, instrumented: BedrockInstrumentor
) -> None:
    # A Bedrock client's service is read once (the last client kept): another
    # client in between, of Bedrock or of another service, is read afresh.
    assert _between_other_clients(server, runtime).steps == 3  # the STS call is no step
    assert server.count(_converse_path(HAIKU)) == 3
    assert server.request_count == 4


def _between_other_clients(server: FakeLLMServer, runtime: Any) -> ChainSnapshot:
    """Converse calls on ``runtime`` with another Bedrock client's and an STS call
    between them, in one chain: its snapshot."""
    from botocore.parsers import ResponseParserError

    other, sts = _client(server.base_url), _client(server.base_url, "sts")
    try:
        with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
            _converse(runtime)
            with pytest.raises(ResponseParserError):  # the fake server has no STS: sent as it is
                sts.get_caller_identity()
            _converse(other)
            _converse(runtime)
            with pytest.raises(BudgetExceededError):  # an unknown model: denied, unsent
                runtime.converse(modelId="no-such-model", messages=MESSAGES)
    finally:
        other.close()
        sts.close()
    return ctx.snapshot()


def test_the_plain_hook_routes_as_make_api_call_does(
    server: FakeLLMServer, backoff: Backoff, monkeypatch: pytest.MonkeyPatch
) -> None:
    """_make_api_call's lane (the function ``_hooks`` puts over the method where it
    reads a ``veronica_lane``) contains Bedrock calls and passes the rest as
    _make_api_call does, over the method it wraps."""
    import functools

    import botocore.client

    from veronica_otel.instrumentors import bedrock

    original = botocore.client.BaseClient.__dict__["_make_api_call"]
    hooked = bedrock._make_api_call.veronica_lane()  # type: ignore[attr-defined]
    functools.update_wrapper(hooked, original)
    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", hooked)
    runtime = _client(server.base_url)
    try:
        snap = _between_other_clients(server, runtime)
    finally:
        runtime.close()
    assert snap.steps == 3  # the STS call is no step
    assert snap.cost_usd == pytest.approx(3 * _cost(HAIKU))
    assert server.count(_converse_path(HAIKU)) == 3
    assert server.request_count == 4


def test_uncapped_converse_is_clamped_to_what_the_budget_buys(
    server: FakeLLMServer, runtime: Any
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.001)) as ctx:
        _converse(runtime, HAIKU_35)
    sent = server.requests[-1].body["inferenceConfig"]["maxTokens"]
    assert 0 < sent < 8_192  # the model's own limit is 8192; $0.001 buys fewer at $4/MTok
    assert ctx.snapshot().cost_usd == pytest.approx(_cost(HAIKU_35))


@pytest.mark.parametrize(
    ("model", "body", "sent_cap"),
    [
        (HAIKU, {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 40, "messages": []}, 40),
        (NOVA, {"messages": MESSAGES}, 10_000),  # uncapped: clamped, at most Nova's limit
        (LLAMA, {"prompt": "hi", "max_gen_len": 64}, 64),
        (LLAMA, {"prompt": "hi"}, 2_048),  # uncapped: Bedrock's Llama limit, not the default
    ],
)
def test_invoke_model_reads_each_family_and_prices_the_headers(
    server: FakeLLMServer, runtime: Any, model: str, body: dict[str, Any], sent_cap: int
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        reply = runtime.invoke_model(modelId=model, body=json.dumps(body))
        assert json.loads(reply["body"].read())  # the body is still the caller's to read
    sent = server.requests[-1].body
    caps = {"max_tokens", "max_gen_len"} & set(sent)
    found = sent[caps.pop()] if caps else sent["inferenceConfig"]["max_new_tokens"]
    assert found == sent_cap
    assert ctx.snapshot().cost_usd == pytest.approx(_cost(model))


def test_converse_stream_counts_the_metadata_usage_and_keeps_text(
    server: FakeLLMServer, runtime: Any, span_exporter: InMemorySpanExporter
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        reply = runtime.converse_stream(modelId=NOVA, messages=MESSAGES)
        kinds = [next(iter(event)) for event in reply["stream"]]
    assert kinds[-1] == "metadata"
    assert ctx.get_partial_result() == "tok0 tok1 tok2 tok3 tok4"
    snap = ctx.snapshot()
    assert (snap.steps, snap.reserved_usd) == (1, 0.0)
    assert snap.cost_usd == pytest.approx(_cost(NOVA))
    (span,) = [s for s in span_exporter.get_finished_spans() if s.kind is SpanKind.CLIENT]
    assert span.attributes is not None
    assert span.attributes["gen_ai.provider.name"] == "aws.bedrock"
    assert span.attributes["gen_ai.request.model"] == NOVA
    assert span.attributes["gen_ai.usage.output_tokens"] == OUTPUT
    assert span.attributes["gen_ai.response.finish_reasons"] == ("end_turn",)


def test_invoke_stream_counts_the_invocation_metrics(server: FakeLLMServer, runtime: Any) -> None:
    body = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 40, "messages": []}
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        reply = runtime.invoke_model_with_response_stream(modelId=HAIKU, body=json.dumps(body))
        chunks = list(reply["body"])
    assert len(chunks) == OUTPUT + 3
    assert ctx.get_partial_result() == "tok0 tok1 tok2 tok3 tok4"
    assert ctx.snapshot().cost_usd == pytest.approx(_cost(HAIKU))


# -- limits hold, nothing over them is sent --------------------------------------------------


def test_max_steps_lets_exactly_n_requests_through(server: FakeLLMServer, runtime: Any) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=3)) as ctx:
        for _ in range(3):
            _converse(runtime)
        with pytest.raises(BudgetExceededError) as caught:
            _converse(runtime)
    assert caught.value.reason == "steps"
    assert server.request_count == 3
    assert ctx.snapshot().steps == 3


def test_threads_share_the_chain(server: FakeLLMServer, runtime: Any) -> None:
    def one(_: int) -> str:
        try:
            _converse(runtime)
        except BudgetExceededError:
            return "denied"
        return "sent"

    with ExecutionContext(ExecutionConfig(max_steps=5)), ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(one, range(12)))
    assert outcomes.count("sent") == 5
    assert server.request_count == 5


def test_cost_ceiling_holds_with_bedrock_usage(server: FakeLLMServer, runtime: Any) -> None:
    ceiling = 20 * _cost(HAIKU_35)  # reservations at maxTokens=5 fit fewer than 20 calls
    with ExecutionContext(ExecutionConfig(max_cost_usd=ceiling)) as ctx:
        sent = 0
        while True:
            try:
                _converse(runtime, HAIKU_35, inferenceConfig={"maxTokens": OUTPUT})
            except BudgetExceededError as exc:
                assert exc.reason == "cost"
                break
            sent += 1
    snap = ctx.snapshot()
    assert sent == server.request_count > 0
    assert snap.cost_usd == pytest.approx(sent * _cost(HAIKU_35))
    assert snap.cost_usd <= ceiling


def test_unknown_model_is_denied_under_a_cost_ceiling(server: FakeLLMServer, runtime: Any) -> None:
    arn = "arn:aws:bedrock:us-east-1:123456789012:provisioned-model/abc123"
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)),
        pytest.raises(BudgetExceededError, match="no known price for model") as caught,
    ):
        _converse(runtime, arn)
    assert caught.value.reason == "cost"
    assert server.request_count == 0


@pytest.mark.parametrize(
    ("service", "call"),
    [
        (
            "bedrock-runtime",
            lambda c: c.start_async_invoke(
                modelId="amazon.nova-reel-v1:0",
                modelInput={"taskType": "TEXT_VIDEO"},
                outputDataConfig={"s3OutputDataConfig": {"s3Uri": "s3://bucket/out"}},
            ),
        ),
        (
            "bedrock-runtime",
            lambda c: c.apply_guardrail(
                guardrailIdentifier="g", guardrailVersion="1", source="INPUT", content=[]
            ),
        ),
        (
            "bedrock",
            lambda c: c.create_model_invocation_job(
                jobName="batch",
                roleArn="arn:aws:iam::123456789012:role/r",
                modelId=HAIKU,
                inputDataConfig={"s3InputDataConfig": {"s3Uri": "s3://bucket/in"}},
                outputDataConfig={"s3OutputDataConfig": {"s3Uri": "s3://bucket/out"}},
            ),
        ),
    ],
)
@pytest.mark.parametrize(
    "config", [ExecutionConfig(max_cost_usd=100.0), ExecutionConfig(max_tokens=10**6)]
)
def test_unboundable_endpoints_are_refused_under_a_ceiling(
    server: FakeLLMServer,
    instrumented: BedrockInstrumentor,
    service: str,
    call: Any,
    config: ExecutionConfig,
) -> None:
    client = _client(server.base_url, service)
    try:
        with ExecutionContext(config) as ctx, pytest.raises(BudgetExceededError) as caught:
            call(client)
    finally:
        client.close()
    assert caught.value.reason in ("cost", "tokens")
    assert server.request_count == 0
    assert ctx.snapshot().steps == 0


def test_other_aws_services_pass_uncounted(
    server: FakeLLMServer, instrumented: BedrockInstrumentor
) -> None:
    from botocore.exceptions import ClientError

    client = _client(server.base_url, "dynamodb")
    try:
        with (
            ExecutionContext(ExecutionConfig(max_steps=1, max_cost_usd=0.01)) as ctx,
            pytest.raises(ClientError),
        ):
            client.list_tables()  # the fake answers 404: it reached the server
    finally:
        client.close()
    assert server.count("/") == 1
    assert ctx.snapshot().steps == 0


# -- botocore's own retries ------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["legacy", "standard", "adaptive"])
def test_sdk_retries_are_drawn_from_max_retries_total(
    server: FakeLLMServer, instrumented: BedrockInstrumentor, backoff: Backoff, mode: str
) -> None:
    server.fail_next(2, status=500)
    client = _client(server.base_url, mode=mode, max_attempts=6)
    try:
        with ExecutionContext(ExecutionConfig(max_retries_total=5, max_cost_usd=1.0)) as ctx:
            _converse(client)
    finally:
        client.close()
    snap = ctx.snapshot()
    assert (snap.steps, snap.retries) == (1, 2)
    assert server.request_count == 3
    assert snap.cost_usd == pytest.approx(_cost(HAIKU))


@pytest.mark.parametrize("mode", ["legacy", "standard"])
def test_a_retry_over_the_limit_raises_our_error_unsent(
    server: FakeLLMServer, instrumented: BedrockInstrumentor, backoff: Backoff, mode: str
) -> None:
    server.fail_next(10, status=500)
    client = _client(server.base_url, mode=mode, max_attempts=8)
    try:
        with ExecutionContext(ExecutionConfig(max_retries_total=2, max_cost_usd=1.0)) as ctx:
            with pytest.raises(BudgetExceededError) as caught:
                _converse(client)
            assert server.request_count == 3  # the first send and two retries
            with pytest.raises(BudgetExceededError):
                _converse(client)  # sticky: not even a first attempt
    finally:
        client.close()
    assert caught.value.reason == "retries"
    assert caught.value.__cause__ is None  # our error, not botocore's wrapper of it
    # botocore backs off before each retry, the refused one too; none after the refusal.
    assert len(backoff.slept) == 3
    snap = ctx.snapshot()
    assert (snap.steps, snap.retries, snap.cost_usd, snap.reserved_usd) == (1, 2, 0.0, 0.0)
    assert server.request_count == 3


# -- how a failed call is charged (G10) --------------------------------------------------------


def test_http_error_costs_nothing_and_the_step_counts(server: FakeLLMServer, runtime: Any) -> None:
    from botocore.exceptions import ClientError

    server.fail_next(1, status=400)
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
        pytest.raises(ClientError) as caught,
    ):
        _converse(runtime)
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    snap = ctx.snapshot()
    assert (snap.steps, snap.cost_usd, snap.reserved_usd) == (1, 0.0, 0.0)


def test_connection_refused_costs_nothing(
    instrumented: BedrockInstrumentor, backoff: Backoff
) -> None:
    from botocore.exceptions import EndpointConnectionError

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed when the block ends: nothing listens
    client = _client(f"http://127.0.0.1:{port}", mode="standard", max_attempts=3)
    try:
        with (
            ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_retries_total=5)) as ctx,
            pytest.raises(EndpointConnectionError),
        ):
            _converse(client)
    finally:
        client.close()
    snap = ctx.snapshot()
    assert (snap.steps, snap.retries, snap.cost_usd, snap.reserved_usd) == (0, 0, 0.0, 0.0)


def test_timeout_after_the_send_costs_the_reservation(
    server: FakeLLMServer, instrumented: BedrockInstrumentor
) -> None:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ReadTimeoutError

    server.set_latency(1.0)
    client = boto3.client(
        "bedrock-runtime",
        endpoint_url=server.base_url,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        config=Config(read_timeout=0.1, retries={"mode": "standard", "max_attempts": 1}),
    )
    try:
        with (
            ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
            pytest.raises(ReadTimeoutError),
        ):
            _converse(client, inferenceConfig={"maxTokens": 100})
    finally:
        client.close()
    prices = default_price_table().lookup("aws.bedrock", HAIKU)
    assert prices is not None
    snap = ctx.snapshot()
    assert snap.steps == 1
    assert snap.reserved_usd == 0.0
    assert snap.cost_usd >= nano_to_usd(prices.cost_nano(0, 100))  # the worst case, output included


# -- streams cut by a trip ---------------------------------------------------------------------


def test_stream_is_cut_when_its_chain_trips(server: FakeLLMServer, runtime: Any) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=2)) as ctx:
        reply = runtime.converse_stream(modelId=NOVA, messages=MESSAGES)
        events = iter(reply["stream"])
        while "contentBlockDelta" not in next(events):
            pass
        _converse(runtime)  # step 2
        with pytest.raises(BudgetExceededError):
            _converse(runtime)  # trips the chain
        with pytest.raises(BudgetExceededError) as caught:
            next(events)
    assert caught.value.reason == "steps"
    assert ctx.get_partial_result() == "tok0"
    snap = ctx.snapshot()
    assert (snap.reserved_usd, snap.steps) == (0.0, 2)
    assert snap.cost_usd > 0  # the cut stream costs its reservation


# -- aiobotocore -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_async_converse_and_stream(server: FakeLLMServer, aruntime: Any) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        await aruntime.converse(modelId=HAIKU, messages=MESSAGES)
        reply = await aruntime.converse_stream(modelId=NOVA, messages=MESSAGES)
        kinds = [next(iter(event)) async for event in reply["stream"]]
    assert kinds[-1] == "metadata"
    snap = ctx.snapshot()
    assert (snap.steps, snap.reserved_usd) == (2, 0.0)
    assert snap.cost_usd == pytest.approx(_cost(HAIKU) + _cost(NOVA))


@pytest.mark.asyncio
async def test_async_tasks_share_max_steps(server: FakeLLMServer, aruntime: Any) -> None:
    async def one() -> str:
        try:
            await aruntime.converse(modelId=HAIKU, messages=MESSAGES)
        except BudgetExceededError:
            return "denied"
        return "sent"

    with ExecutionContext(ExecutionConfig(max_steps=4)):
        outcomes = await asyncio.gather(*(one() for _ in range(10)))
    assert outcomes.count("sent") == 4
    assert server.request_count == 4


@pytest.mark.asyncio
async def test_async_retries_are_drawn_through_aiohttp(
    server: FakeLLMServer, aruntime: Any, backoff: Backoff
) -> None:
    server.fail_next(10, status=500)
    with (
        ExecutionContext(ExecutionConfig(max_retries_total=1)) as ctx,
        pytest.raises(BudgetExceededError) as caught,
    ):
        await aruntime.converse(modelId=HAIKU, messages=MESSAGES)
    assert caught.value.reason == "retries"
    assert server.request_count == 2
    assert ctx.snapshot().retries == 1


# -- installing and removing -------------------------------------------------------------------


def test_a_version_outside_the_range_fails_closed_for_bedrock_only(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import botocore.endpoint
    from botocore.exceptions import ClientError

    original = botocore.client.BaseClient.__dict__["_make_api_call"]
    real = hooks_module.version
    monkeypatch.setattr(
        hooks_module, "version", lambda name: "2.0.0" if name == "botocore" else real(name)
    )
    instrumentor = BedrockInstrumentor()
    with pytest.raises(InstrumentationError, match=r"botocore 2\.0\.0"):
        instrumentor.instrument()
    runtime, other = _client(server.base_url), _client(server.base_url, "dynamodb")
    try:
        with ExecutionContext(ExecutionConfig(max_steps=5)):
            with pytest.raises(InstrumentationError):
                _converse(runtime)
            with pytest.raises(ClientError):
                other.list_tables()  # not Bedrock: passes
        assert server.request_count == 1
    finally:
        runtime.close()
        other.close()
        instrumentor.uninstrument()
    assert botocore.client.BaseClient.__dict__["_make_api_call"] is original  # refusal lifted


def test_uninstrument_restores_the_sdk(server: FakeLLMServer) -> None:
    import botocore.endpoint

    original = botocore.client.BaseClient.__dict__["_make_api_call"]
    instrumentor = BedrockInstrumentor()
    instrumentor.instrument()
    assert botocore.client.BaseClient.__dict__["_make_api_call"] is not original
    instrumentor.uninstrument()
    assert botocore.client.BaseClient.__dict__["_make_api_call"] is original
    runtime = _client(server.base_url)
    try:
        with ExecutionContext(ExecutionConfig(max_steps=1)) as ctx:
            _converse(runtime)
            _converse(runtime)  # uncontained again
    finally:
        runtime.close()
    assert ctx.snapshot().steps == 0
    assert server.request_count == 2
