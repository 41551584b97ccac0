"""GoogleGenAIInstrumentor: the real google-genai SDK (Gemini API and Vertex AI)
against the embedded fake server; what reached the server is counted there."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel._pricing import default_price_table
from veronica_otel._units import nano_to_usd
from veronica_otel.instrumentors import InstrumentationError
from veronica_otel.instrumentors import _hooks as hooks_module
from veronica_otel.instrumentors.google_genai import GoogleGenAIInstrumentor
from veronica_otel.testing import FakeLLMServer

if TYPE_CHECKING:
    from google import genai
    from google.genai import types

# google-genai subclasses aiohttp.ClientSession for its async client, which
# aiohttp warns about; the SDK's own business, not ours.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Inheritance class AiohttpClientSession:DeprecationWarning"
)

MODEL = "gemini-2.5-flash"
# Where a call lands, after the API version the SDK release picks (v1, v1beta).
PATH = f"/models/{MODEL}:generateContent"
STREAM_PATH = f"/models/{MODEL}:streamGenerateContent"
VERTEX_PATH = "/projects/p/locations/us-central1/publishers/google/models/{}:{}"
INPUT, OUTPUT, THOUGHTS, CACHED = 10, 5, 2, 4
CAPPED: dict[str, Any] = {"max_output_tokens": 100}


def _sent(server: FakeLLMServer, path: str) -> int:
    """Requests that reached ``path`` (under any API version)."""
    routes: dict[str, int] = server.stats()["routes"]
    return sum(n for route, n in routes.items() if route.endswith(path))


def _cost(model: str = MODEL) -> float:
    prices = default_price_table().lookup("gcp.gemini", model)
    assert prices is not None
    return nano_to_usd(prices.cost_nano(INPUT, OUTPUT, CACHED, THOUGHTS))


@pytest.fixture
def instrumented() -> Iterator[GoogleGenAIInstrumentor]:
    instrumentor = GoogleGenAIInstrumentor()
    instrumentor.instrument()
    yield instrumentor
    instrumentor.uninstrument()


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(
        input_tokens=INPUT, output_tokens=OUTPUT, reasoning_tokens=THOUGHTS, cached_tokens=CACHED
    ) as fake:
        yield fake


def _options(base_url: str, **kwargs: Any) -> types.HttpOptions:
    from google.genai import types

    return types.HttpOptions(base_url=base_url, **kwargs)


@pytest.fixture
def client(server: FakeLLMServer, instrumented: GoogleGenAIInstrumentor) -> Iterator[genai.Client]:
    from google import genai

    with genai.Client(api_key="t", http_options=_options(server.base_url)) as gemini:
        yield gemini


@pytest_asyncio.fixture
async def aclient(
    server: FakeLLMServer, instrumented: GoogleGenAIInstrumentor
) -> AsyncIterator[genai.client.AsyncClient]:
    from google import genai

    gemini = genai.Client(api_key="t", http_options=_options(server.base_url))
    try:
        yield gemini.aio
    finally:
        await gemini.aio.aclose()
        gemini.close()


def _vertex(server: FakeLLMServer) -> genai.Client:
    from google import genai
    from google.oauth2.credentials import Credentials

    return genai.Client(
        vertexai=True,
        project="p",
        location="us-central1",
        credentials=Credentials(token="t"),  # type: ignore[no-untyped-call]
        http_options=_options(server.base_url),
    )


def _generate(client: genai.Client, **config: Any) -> types.GenerateContentResponse:
    return client.models.generate_content(
        model=MODEL, contents="Say hello.", config=config or CAPPED
    )


def _search_grounding(client: genai.Client) -> types.GenerateContentResponse:
    from google.genai import types

    return _generate(client, tools=[types.Tool(google_search=types.GoogleSearch())])


# -- usage, spans, providers ------------------------------------------------------


def test_generate_commits_usage_with_thoughts_and_cache(
    server: FakeLLMServer, client: genai.Client, span_exporter: InMemorySpanExporter
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        reply = _generate(client)
    assert reply.usage_metadata is not None
    assert reply.usage_metadata.thoughts_token_count == THOUGHTS
    snap = ctx.snapshot()
    assert (snap.steps, snap.tokens, snap.reserved_usd) == (1, INPUT + OUTPUT, 0.0)
    assert snap.cost_usd == _cost()
    assert _sent(server, PATH) == 1
    (span,) = [
        s for s in span_exporter.get_finished_spans() if s.name == f"generate_content {MODEL}"
    ]
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.provider.name"] == "gcp.gemini"
    assert attributes["gen_ai.response.id"] == reply.response_id
    assert attributes["gen_ai.response.model"] == MODEL
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert attributes["gen_ai.usage.input_tokens"] == INPUT
    assert attributes["gen_ai.usage.output_tokens"] == OUTPUT
    assert attributes["gen_ai.request.max_tokens"] == 100
    assert attributes["server.address"] == "127.0.0.1"


def test_vertex_calls_are_gcp_vertex_ai(
    server: FakeLLMServer,
    instrumented: GoogleGenAIInstrumentor,
    span_exporter: InMemorySpanExporter,
) -> None:
    with _vertex(server) as vertex, ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        vertex.models.generate_content(model="gemini-2.0-flash", contents="hi", config=CAPPED)
        vertex.models.embed_content(model="gemini-embedding-001", contents=["a"])
    assert _sent(server, VERTEX_PATH.format("gemini-2.0-flash", "generateContent")) == 1
    embedded = VERTEX_PATH.format("gemini-embedding-001", "")  # embedContent; predict before 2.x
    assert _sent(server, embedded + "embedContent") + _sent(server, embedded + "predict") == 1
    assert ctx.snapshot().steps == 2
    calls = [s for s in span_exporter.get_finished_spans() if s.kind.name == "CLIENT"]
    assert {(s.attributes or {}).get("gen_ai.provider.name") for s in calls} == {"gcp.vertex_ai"}
    assert len(calls) == 2


def test_embeddings_are_priced_by_input(server: FakeLLMServer, client: genai.Client) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        reply = client.models.embed_content(model="gemini-embedding-001", contents=["ab", "cd"])
    assert reply.embeddings is not None and len(reply.embeddings) == 2
    (billed,) = server.billed
    prices = default_price_table().lookup("gcp.gemini", "gemini-embedding-001")
    assert prices is not None
    snap = ctx.snapshot()
    assert (snap.steps, snap.tokens) == (1, billed.input_tokens)
    assert snap.cost_usd == nano_to_usd(prices.cost_nano(billed.input_tokens, 0))


def test_an_unpriced_model_is_denied_under_a_ceiling_naming_it(
    server: FakeLLMServer, client: genai.Client
) -> None:
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)),
        pytest.raises(BudgetExceededError, match=r"text-embedding-004.*VERONICA_MODEL_ALIASES"),
    ):
        client.models.embed_content(model="text-embedding-004", contents=["a"])
    assert server.request_count == 0


def test_count_tokens_is_free_and_passes(server: FakeLLMServer, client: genai.Client) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=1)) as ctx:
        for _ in range(3):
            assert client.models.count_tokens(model=MODEL, contents="hi").total_tokens == INPUT
    assert ctx.snapshot().steps == 0
    assert server.request_count == 3


def test_no_chain_passes_through(server: FakeLLMServer, client: genai.Client) -> None:
    assert _generate(client).text
    assert _sent(server, PATH) == 1


# -- limits: steps, cost, clamp, candidates ---------------------------------------


def test_max_steps_lets_exactly_n_requests_through(
    server: FakeLLMServer, client: genai.Client
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=3)):
        for _ in range(3):
            _generate(client)
        with pytest.raises(BudgetExceededError) as denied:
            _generate(client)
    assert denied.value.reason == "steps"
    assert _sent(server, PATH) == 3


def test_max_steps_holds_across_threads(server: FakeLLMServer, client: genai.Client) -> None:
    def one() -> str:
        try:
            _generate(client)
            return "sent"
        except BudgetExceededError:
            return "denied"

    with ExecutionContext(ExecutionConfig(max_steps=4)), ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(lambda _: one(), range(12)))
    assert outcomes.count("sent") == 4 == _sent(server, PATH)


@pytest.mark.asyncio
async def test_max_steps_holds_across_asyncio_tasks(
    server: FakeLLMServer, aclient: genai.client.AsyncClient
) -> None:
    async with ExecutionContext(ExecutionConfig(max_steps=3)):
        results = await asyncio.gather(
            *(
                aclient.models.generate_content(model=MODEL, contents="hi", config=CAPPED)
                for _ in range(8)
            ),
            return_exceptions=True,
        )
    assert sum(isinstance(r, BudgetExceededError) for r in results) == 5
    assert _sent(server, PATH) == 3


def test_cost_ceiling_holds_with_gemini_usage(server: FakeLLMServer, client: genai.Client) -> None:
    ceiling = 0.001
    sent = 0
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=ceiling)) as ctx,
        pytest.raises(BudgetExceededError) as denied,
    ):
        for _ in range(1000):
            _generate(client)
            sent += 1
    assert denied.value.reason == "cost"
    assert sent == _sent(server, PATH) > 1
    assert ctx.snapshot().cost_usd == pytest.approx(sent * _cost(), abs=1e-12)
    assert ctx.snapshot().cost_usd <= ceiling


def test_uncapped_call_is_clamped_in_a_copy(server: FakeLLMServer, client: genai.Client) -> None:
    from google.genai import types

    config = types.GenerateContentConfig(temperature=0.5)
    as_dict: dict[str, Any] = {"temperature": 0.5}
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.001)):
        client.models.generate_content(model=MODEL, contents="hi", config=config)
        client.models.generate_content(model=MODEL, contents="hi", config=as_dict)
    caps = [r.body["generationConfig"]["maxOutputTokens"] for r in server.requests]
    prices = default_price_table().lookup("gcp.gemini", MODEL)
    assert prices is not None
    assert all(0 < cap < 0.001 * 1e9 * 1e6 / prices.output for cap in caps)
    assert config.max_output_tokens is None and as_dict == {"temperature": 0.5}


def test_uncapped_gemini_2_0_is_clamped_to_its_output_limit(
    server: FakeLLMServer, client: genai.Client
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=10.0)):
        client.models.generate_content(model="gemini-2.0-flash", contents="hi")
    assert server.requests[-1].body["generationConfig"]["maxOutputTokens"] == 8_192


def test_candidate_count_multiplies_the_reservation(
    server: FakeLLMServer, client: genai.Client
) -> None:
    prices = default_price_table().lookup("gcp.gemini", MODEL)
    assert prices is not None
    one = nano_to_usd(prices.max_cost_nano(200, 10_000))
    with ExecutionContext(ExecutionConfig(max_cost_usd=one * 1.5)):
        _generate(client, max_output_tokens=10_000)  # one candidate fits
        with pytest.raises(BudgetExceededError, match="cost"):
            _generate(client, max_output_tokens=10_000, candidate_count=2)
    assert _sent(server, PATH) == 1


# -- streams ------------------------------------------------------------------------


def test_stream_commits_the_final_chunks_usage(server: FakeLLMServer, client: genai.Client) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        text = "".join(
            chunk.text or ""
            for chunk in client.models.generate_content_stream(
                model=MODEL, contents="hi", config=CAPPED
            )
        )
    assert text == "tok0 tok1 tok2"
    snap = ctx.snapshot()
    assert (snap.steps, snap.tokens, snap.cost_usd) == (1, INPUT + OUTPUT, _cost())
    assert _sent(server, STREAM_PATH) == 1


def test_a_stream_is_cut_when_its_chain_trips(server: FakeLLMServer, client: genai.Client) -> None:
    seen = []
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
        pytest.raises(BudgetExceededError),
    ):
        for chunk in client.models.generate_content_stream(
            model=MODEL, contents="hi", config=CAPPED
        ):
            seen.append(chunk.text)
            ctx.cancel()
    assert seen == ["tok0"]
    assert ctx.get_partial_result() == "tok0"
    assert ctx.snapshot().cost_usd > _cost()  # cut before its usage: the reservation
    assert _sent(server, STREAM_PATH) == 1


@pytest.mark.asyncio
async def test_async_stream_and_call(
    server: FakeLLMServer, aclient: genai.client.AsyncClient
) -> None:
    async with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        await aclient.models.generate_content(model=MODEL, contents="hi", config=CAPPED)
        stream = await aclient.models.generate_content_stream(
            model=MODEL, contents="hi", config=CAPPED
        )
        text = "".join([chunk.text or "" async for chunk in stream])
    assert text == "tok0 tok1 tok2"
    snap = ctx.snapshot()
    assert (snap.steps, snap.cost_usd) == (2, pytest.approx(2 * _cost(), abs=1e-12))


# -- the SDK's own retries, failures (G10) ------------------------------------------


def _retrying(server: FakeLLMServer) -> genai.Client:
    from google import genai
    from google.genai import types

    retry = types.HttpRetryOptions(attempts=4, initial_delay=0.0, max_delay=0.0, jitter=0.0)
    return genai.Client(api_key="t", http_options=_options(server.base_url, retry_options=retry))


def test_sdk_retries_draw_on_max_retries_total(
    server: FakeLLMServer, instrumented: GoogleGenAIInstrumentor
) -> None:
    server.fail_next(3, status=503)
    with (
        _retrying(server) as client,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_retries_total=1)) as ctx,
        pytest.raises(BudgetExceededError) as denied,  # ours, not the SDK's error
    ):
        _generate(client)
    assert denied.value.reason == "retries"
    assert _sent(server, PATH) == 2  # the first attempt and one retry
    snap = ctx.snapshot()
    assert (snap.steps, snap.retries, snap.cost_usd, snap.reserved_usd) == (1, 1, 0.0, 0.0)


def test_sdk_retries_within_the_limit_succeed(
    server: FakeLLMServer, instrumented: GoogleGenAIInstrumentor
) -> None:
    server.fail_next(2, status=429)
    with (
        _retrying(server) as client,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_retries_total=2)) as ctx,
    ):
        _generate(client)
    snap = ctx.snapshot()
    assert (snap.steps, snap.retries, snap.cost_usd) == (1, 2, _cost())
    assert _sent(server, PATH) == 3


@pytest.mark.asyncio
async def test_async_sdk_retries_draw_on_max_retries_total(
    server: FakeLLMServer, instrumented: GoogleGenAIInstrumentor
) -> None:
    server.fail_next(3, status=500)
    client = _retrying(server)
    try:
        async with ExecutionContext(ExecutionConfig(max_retries_total=1)) as ctx:
            with pytest.raises(BudgetExceededError):
                await client.aio.models.generate_content(model=MODEL, contents="hi")
    finally:
        await client.aio.aclose()
        client.close()
    assert _sent(server, PATH) == 2
    assert (ctx.snapshot().steps, ctx.snapshot().retries) == (1, 1)


def test_an_http_error_costs_nothing_and_counts_the_step(
    server: FakeLLMServer, client: genai.Client
) -> None:
    from google.genai import errors

    server.fail_next(1, status=400)
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
        pytest.raises(errors.ClientError) as failed,
    ):
        _generate(client)
    assert failed.value.code == 400 and failed.value.status == "INVALID_ARGUMENT"
    snap = ctx.snapshot()
    assert (snap.steps, snap.cost_usd, snap.reserved_usd) == (1, 0.0, 0.0)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_connection_never_made_costs_nothing(instrumented: GoogleGenAIInstrumentor) -> None:
    from google import genai

    url = f"http://127.0.0.1:{_closed_port()}"
    with (
        genai.Client(api_key="t", http_options=_options(url)) as client,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
        pytest.raises(Exception, match="onnect"),
    ):
        _generate(client)
    snap = ctx.snapshot()
    assert (snap.steps, snap.cost_usd, snap.reserved_usd) == (0, 0.0, 0.0)


def test_a_timeout_after_sending_costs_the_reservation(
    server: FakeLLMServer, instrumented: GoogleGenAIInstrumentor
) -> None:
    from google import genai

    server.set_latency(5.0)  # the server's handler wakes when it stops
    with (
        genai.Client(api_key="t", http_options=_options(server.base_url, timeout=200)) as client,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
        pytest.raises(Exception, match=r"[Tt]imed? ?out"),
    ):
        _generate(client)
    prices = default_price_table().lookup("gcp.gemini", MODEL)
    assert prices is not None
    snap = ctx.snapshot()
    assert snap.steps == 1 and snap.reserved_usd == 0.0
    assert snap.tokens > 100 and snap.cost_usd >= nano_to_usd(prices.max_cost_nano(0, 100))
    assert _sent(server, PATH) == 1


# -- endpoints that cannot be priced before they are sent ---------------------------


_DEPRECATED = pytest.mark.filterwarnings("ignore:The generate_images method is deprecated")


@_DEPRECATED
def test_image_generation_is_refused_under_a_cost_ceiling(
    server: FakeLLMServer, instrumented: GoogleGenAIInstrumentor
) -> None:
    with (
        _vertex(server) as vertex,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
        pytest.raises(BudgetExceededError, match=r"predict .imagen-4.0-generate-001. cannot be"),
    ):
        vertex.models.generate_images(model="imagen-4.0-generate-001", prompt="a cat")
    assert server.request_count == 0
    assert ctx.snapshot().trip is None  # refused, not tripped: the chain goes on


@_DEPRECATED
def test_an_unpriced_endpoint_counts_a_step_without_a_ceiling(
    server: FakeLLMServer, instrumented: GoogleGenAIInstrumentor
) -> None:
    from google.genai import errors

    with _vertex(server) as vertex, ExecutionContext(ExecutionConfig(max_steps=1)) as ctx:
        with pytest.raises(errors.ClientError):  # no such fake route
            vertex.models.generate_images(model="imagen-4.0-generate-001", prompt="a cat")
        with pytest.raises(BudgetExceededError, match="steps"):
            vertex.models.generate_content(model="gemini-2.0-flash", contents="hi")
    assert (ctx.snapshot().steps, server.request_count) == (1, 1)


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(
            lambda c: c.caches.create(model=MODEL, config={"contents": ["x"], "ttl": "3600s"}),
            id="cache",
        ),
        pytest.param(
            lambda c: c.batches.create(
                model=MODEL, src=[{"contents": [{"parts": [{"text": "x"}]}]}]
            ),
            id="batch",
        ),
        pytest.param(_search_grounding, id="search-grounding"),
        pytest.param(
            lambda c: c.interactions.create(model=MODEL, input="hi"),
            id="interactions",
        ),
    ],
)
def test_unpriceable_calls_are_refused_and_never_sent(
    server: FakeLLMServer, client: genai.Client, call: Any, request: pytest.FixtureRequest
) -> None:
    if not hasattr(client, "interactions") and "interactions" in request.node.name:
        pytest.skip("this google-genai has no Interactions API")
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)),
        pytest.raises(BudgetExceededError, match="cannot be priced"),
    ):
        call(client)
    assert server.request_count == 0


# -- installation -------------------------------------------------------------------


def test_uninstrument_restores_the_sdk(server: FakeLLMServer) -> None:
    from google import genai
    from google.genai import _api_client

    instrumentor = GoogleGenAIInstrumentor()
    instrumentor.instrument()
    instrumentor.uninstrument()
    for name in ("request", "request_streamed", "async_request", "async_request_streamed"):
        assert not hasattr(getattr(_api_client.BaseApiClient, name), "__wrapped__")
    with (
        genai.Client(api_key="t", http_options=_options(server.base_url)) as client,
        ExecutionContext(ExecutionConfig(max_steps=1)) as ctx,
    ):
        _generate(client)
        _generate(client)
    assert (ctx.snapshot().steps, _sent(server, PATH)) == (0, 2)


def test_a_version_outside_the_range_fails_closed(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from google import genai
    from opentelemetry.instrumentation import dependencies

    real = hooks_module.version

    def fake(name: str) -> str:
        return "9.0.0" if name == "google-genai" else real(name)

    monkeypatch.setattr(hooks_module, "version", fake)
    monkeypatch.setattr(dependencies, "version", fake)
    instrumentor = GoogleGenAIInstrumentor()
    with pytest.raises(InstrumentationError, match=r"google-genai 9.0.0: the version"):
        instrumentor.instrument()
    try:
        with (
            genai.Client(api_key="t", http_options=_options(server.base_url)) as client,
            ExecutionContext(ExecutionConfig(max_steps=5)),
            pytest.raises(InstrumentationError),
        ):
            _generate(client)
        assert server.request_count == 0
    finally:
        instrumentor.uninstrument()
    with (
        genai.Client(api_key="t", http_options=_options(server.base_url)) as client,
        ExecutionContext(ExecutionConfig(max_steps=5)),
    ):
        _generate(client)  # the refusal is lifted
    assert server.request_count == 1
