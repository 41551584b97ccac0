"""CohereInstrumentor: the real cohere SDK (v1 and v2 clients) against the embedded fake server.

The server's request count is the truth for what was sent; the chain's
snapshot for what was charged (DESIGN G1-G3, G10, G12).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import httpx
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
from veronica_otel.instrumentors._admit import _utf8_bytes
from veronica_otel.instrumentors.cohere import CohereInstrumentor
from veronica_otel.testing import FakeLLMServer

if TYPE_CHECKING:
    import cohere

MODEL = "command-a-03-2025"
MESSAGES: list[Any] = [{"role": "user", "content": "Say hello."}]
CHAT = "/v2/chat"
INPUT, OUTPUT, CAP = 12, 5, 50


def _cost(model: str = MODEL, inp: int = INPUT, out: int = OUTPUT) -> float:
    prices = default_price_table().lookup("cohere", model)
    assert prices is not None
    return nano_to_usd(prices.cost_nano(inp, out))


def _reservation(cap: int = CAP) -> float:
    prices = default_price_table().lookup("cohere", MODEL)
    assert prices is not None
    return nano_to_usd(prices.max_cost_nano(input_bound([MESSAGES], 1), cap))


def _charged(snap: ChainSnapshot, cost: float, steps: int = 1) -> None:
    assert (snap.steps, snap.reserved_usd) == (steps, 0.0)
    assert snap.cost_usd == pytest.approx(cost, abs=1e-12)


def _chat(client: cohere.ClientV2, **kwargs: Any) -> Any:
    params: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "max_tokens": CAP}
    params.update(kwargs)
    return client.chat(**params)


@pytest.fixture
def instrumented() -> Iterator[CohereInstrumentor]:
    instrumentor = CohereInstrumentor()
    instrumentor.instrument()
    yield instrumentor
    instrumentor.uninstrument()


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(input_tokens=INPUT, output_tokens=OUTPUT) as fake:
        yield fake


@pytest.fixture
def client(server: FakeLLMServer, instrumented: CohereInstrumentor) -> Iterator[cohere.ClientV2]:
    import cohere

    with httpx.Client() as http:
        yield cohere.ClientV2(
            api_key="k", base_url=server.base_url, httpx_client=http, max_retries=0
        )


@pytest_asyncio.fixture
async def aclient(
    server: FakeLLMServer, instrumented: CohereInstrumentor
) -> AsyncIterator[cohere.AsyncClientV2]:
    import cohere

    async with httpx.AsyncClient() as http:
        yield cohere.AsyncClientV2(
            api_key="k", base_url=server.base_url, httpx_client=http, max_retries=0
        )


class _Clock(FakeClock):
    """The real monotonic clock, moved forward by hand (never slept on)."""

    def __call__(self) -> float:
        return time.monotonic() + self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = _Clock()
    patch_chain_clock(monkeypatch, fake)
    return fake


@pytest.fixture
def backoffs(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The SDK's retry sleeps, recorded instead of slept."""
    from cohere.core import http_client

    slept: list[float] = []

    class _Time:
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        def sleep(self, seconds: float) -> None:
            slept.append(seconds)

    async def _asleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(http_client, "time", _Time())
    monkeypatch.setattr(http_client.asyncio, "sleep", _asleep)
    return slept


# -- usage and spans ----------------------------------------------------------------------


def test_chat_commits_billed_units_and_describes_its_span(
    server: FakeLLMServer, client: cohere.ClientV2, span_exporter: InMemorySpanExporter
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        reply = _chat(client)
    snap = ctx.snapshot()
    _charged(snap, _cost())
    assert snap.tokens == INPUT + OUTPUT
    assert server.count(CHAT) == 1
    (span,) = [s for s in span_exporter.get_finished_spans() if s.kind is SpanKind.CLIENT]
    attributes = dict(span.attributes or {})
    assert span.name == f"chat {MODEL}"
    assert attributes["gen_ai.provider.name"] == "cohere"
    assert attributes["gen_ai.response.id"] == reply.id
    assert attributes["gen_ai.response.finish_reasons"] == ("COMPLETE",)
    assert attributes["gen_ai.usage.output_tokens"] == OUTPUT


def _count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every ``httpx.Response.json()`` decode of a body, counted (httpx's own json.loads)."""
    decodes: list[int] = []

    class _Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(json, name)

        def loads(self, *args: Any, **kwargs: Any) -> Any:
            decodes.append(1)
            return json.loads(*args, **kwargs)

    monkeypatch.setattr(httpx._models, "jsonlib", _Counting())
    return decodes


def test_the_reply_is_decoded_once_and_the_sdk_takes_it(
    server: FakeLLMServer, client: cohere.ClientV2, monkeypatch: pytest.MonkeyPatch
) -> None:
    decodes = _count_decodes(monkeypatch)
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        raw = client.with_raw_response.chat(model=MODEL, messages=MESSAGES, max_tokens=CAP)
    _charged(ctx.snapshot(), _cost())
    assert raw.data.usage is not None and raw.data.usage.billed_units is not None
    assert raw.data.usage.billed_units.output_tokens == OUTPUT
    # The SDK built its reply from our decode: httpx never decoded the body.
    assert decodes == []
    assert "json" not in vars(raw.response)  # handed over once
    # A later call (the caller's) decodes afresh, a new object each time.
    first, second = raw.response.json(), raw.response.json()
    assert first == second == json.loads(raw.response.content) and first is not second
    assert decodes == [1, 1]


class _SlottedReply:
    """An HTTP reply without an instance dict: nothing can be handed to it."""

    __slots__ = ("_reply",)

    def __init__(self, reply: httpx.Response) -> None:
        self._reply = reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reply, name)

    def json(self, **kwargs: Any) -> Any:
        return self._reply.json(**kwargs)


class _SlottedClient(httpx.Client):
    def request(self, *args: Any, **kwargs: Any) -> Any:
        return _SlottedReply(super().request(*args, **kwargs))


def test_a_reply_that_takes_no_handover_is_decoded_by_the_sdk(
    server: FakeLLMServer, instrumented: CohereInstrumentor, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cohere

    decodes = _count_decodes(monkeypatch)
    with (
        _SlottedClient() as http,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        slotted = cohere.ClientV2(
            api_key="k", base_url=server.base_url, httpx_client=http, max_retries=0
        )
        reply = _chat(slotted)
    _charged(ctx.snapshot(), _cost())  # usage read from our own decode
    assert reply.usage is not None and reply.usage.billed_units is not None
    assert reply.usage.billed_units.input_tokens == INPUT
    assert decodes == [1]  # the SDK decoded it again itself
    assert server.count(CHAT) == 1


def test_the_v2_chat_lane_reads_what_the_general_path_reads() -> None:
    """read_request reads the SDK's v2 chat body in one frame (the route's rules,
    copied, and _images asked only when a message is not plain text); the general
    path reads every body the same."""
    from veronica_otel.instrumentors import cohere as adapter_module

    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}}
    with_image = {"role": "user", "content": [{"type": "text", "text": "look"}, image]}
    bodies: list[dict[str, Any]] = [
        {"model": MODEL, "messages": MESSAGES, "tools": ..., "max_tokens": 5, "stream": False},
        {
            "model": MODEL,
            "messages": [*MESSAGES, with_image],
            "documents": ["d"],
            "max_tokens": ...,
        },
        {"model": "", "messages": MESSAGES, "response_format": {"type": "json_object"}},
        {"model": MODEL, "messages": MESSAGES, "images": ["aGk="], "inputs": ...},
        {"model": MODEL, "messages": "not a list", "chat_history": [1, 2]},
        {"model": 7, "messages": [object()]},
        {"model": MODEL, "messages": [*MESSAGES, {"role": "assistant", "content": "héllo ✓"}]},
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}],
        },
    ]
    read = adapter_module._ADAPTER.read_request
    plain_lanes = 0
    for body in bodies:
        for method in ("request", "stream"):
            kwargs = {"method": "POST", "json": body}
            lane = read(None, ("v2/chat",), kwargs, method)
            assert lane == adapter_module._read_request("v2/chat", body, method)
            # The plain lane (messages of strings only): its input bytes are the byte walk's.
            request, size = adapter_module.read_plain(None, ("v2/chat",), kwargs, method)
            assert request == lane
            if size >= 0:
                plain_lanes += 1
                assert size == _utf8_bytes(request.input_parts)
    assert plain_lanes == 4  # bodies 0 and 6, each method
    # The stream hooks have no plain lane (read_plain reads request()'s calls).
    assert adapter_module._STREAMS_ADAPTER.read_plain is None
    images = read(None, ("v2/chat",), {"method": "POST", "json": bodies[1]}, "request")
    assert images is not None and images.extra_input_tokens == adapter_module._IMAGE_TOKENS
    assert read(None, ("v2/chat",), {"method": "GET", "json": bodies[0]}, "request") is None


def test_no_chain_passes_through(server: FakeLLMServer, client: cohere.ClientV2) -> None:
    _chat(client)
    assert server.count(CHAT) == 1


def test_stream_commits_the_message_end_usage(
    server: FakeLLMServer, client: cohere.ClientV2
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        events = list(client.chat_stream(model=MODEL, messages=MESSAGES, max_tokens=CAP))
    assert events[-1].type == "message-end"
    _charged(ctx.snapshot(), _cost())
    assert ctx.get_partial_result() == "tok0 tok1 tok2 tok3 tok4"
    assert server.count(CHAT) == 1


def test_v1_chat_and_its_stream(server: FakeLLMServer, instrumented: CohereInstrumentor) -> None:
    import cohere

    model = "command-r-plus-08-2024"
    with httpx.Client() as http, ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        v1 = cohere.Client(api_key="k", base_url=server.base_url, httpx_client=http)
        v1.chat(message="hi", model=model, max_tokens=CAP)
        events = list(v1.chat_stream(message="hi", model=model, max_tokens=CAP))
    assert events[-1].event_type == "stream-end"
    _charged(ctx.snapshot(), 2 * _cost(model), steps=2)
    assert server.count("/v1/chat") == 2


@pytest.mark.asyncio
async def test_async_chat_and_stream(server: FakeLLMServer, aclient: cohere.AsyncClientV2) -> None:
    async with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        await aclient.chat(model=MODEL, messages=MESSAGES, max_tokens=CAP)
        events = [e async for e in aclient.chat_stream(model=MODEL, messages=MESSAGES)]
    assert events[-1].type == "message-end"
    _charged(ctx.snapshot(), 2 * _cost(), steps=2)
    assert server.count(CHAT) == 2
    assert server.requests[-1].body["max_tokens"] > 0  # uncapped: clamped to what $1 buys


# -- refused before sending ------------------------------------------------------------------


def test_steps_limit_lets_exactly_n_through(server: FakeLLMServer, client: cohere.ClientV2) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=3)) as ctx:
        for _ in range(3):
            _chat(client)
        with pytest.raises(BudgetExceededError) as caught:
            _chat(client)
    assert caught.value.reason == "steps"
    assert (ctx.snapshot().steps, server.count(CHAT)) == (3, 3)


def test_cost_ceiling_denies_before_sending(server: FakeLLMServer, client: cohere.ClientV2) -> None:
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=_reservation(10_000) / 2)) as ctx,
        pytest.raises(BudgetExceededError) as caught,
    ):
        _chat(client, max_tokens=10_000)
    assert caught.value.reason == "cost"
    assert server.request_count == 0
    assert ctx.snapshot().steps == 0


def test_unpriced_models_and_endpoints_are_refused_under_a_ceiling(
    server: FakeLLMServer, client: cohere.ClientV2
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        with pytest.raises(BudgetExceededError, match=r"embed-english-v3\.0.*MODEL_ALIASES"):
            client.embed(
                model="embed-english-v3.0",
                texts=["a"],
                input_type="search_document",
                embedding_types=["float"],
            )
        with pytest.raises(BudgetExceededError, match=r"'v2/rerank:rerank-v3\.5'"):
            client.rerank(model="rerank-v3.5", query="q", documents=["a", "b"])
    assert server.request_count == 0
    assert ctx.snapshot().steps == 0


def test_rerank_without_a_ceiling_counts_a_step(
    server: FakeLLMServer, client: cohere.ClientV2
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=5)) as ctx:
        client.rerank(model="rerank-v3.5", query="q", documents=["a", "b"])
    assert (ctx.snapshot().steps, ctx.snapshot().tokens) == (1, 0)  # billed in search units
    assert server.count("/v2/rerank") == 1


def test_threads_never_pass_the_steps_limit(server: FakeLLMServer, client: cohere.ClientV2) -> None:
    def outcome() -> str:
        try:
            _chat(client)
        except BudgetExceededError as exc:
            return exc.reason
        return "ok"

    with ExecutionContext(ExecutionConfig(max_steps=5)) as ctx, ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(contextvars.copy_context().run, outcome) for _ in range(9)]
        outcomes = [f.result() for f in futures]
    sent = outcomes.count("ok")
    assert 1 <= sent <= 5
    assert outcomes.count("steps") == 9 - sent
    assert ctx.snapshot().steps == sent == server.count(CHAT)


@pytest.mark.asyncio
async def test_tasks_share_the_steps_limit(
    server: FakeLLMServer, aclient: cohere.AsyncClientV2
) -> None:
    async def call() -> str:
        try:
            await aclient.chat(model=MODEL, messages=MESSAGES, max_tokens=CAP)
        except BudgetExceededError as exc:
            return exc.reason
        return "ok"

    async with ExecutionContext(ExecutionConfig(max_steps=4)) as ctx:
        outcomes = await asyncio.gather(*(call() for _ in range(7)))
    assert sorted(outcomes) == ["ok"] * 4 + ["steps"] * 3
    assert ctx.snapshot().steps == server.count(CHAT) == 4


# -- streams cut mid-way ---------------------------------------------------------------------


def test_stream_cut_by_the_deadline_keeps_partial_text(
    server: FakeLLMServer, client: cohere.ClientV2, clock: FakeClock
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, timeout_ms=60_000)) as ctx:
        stream = client.chat_stream(model=MODEL, messages=MESSAGES, max_tokens=CAP)
        kinds = [next(stream).type for _ in range(3)]  # start, content-start, "tok0"
        clock.advance(61)
        with pytest.raises(BudgetExceededError) as caught:
            next(stream)
    assert kinds == ["message-start", "content-start", "content-delta"]
    assert caught.value.reason == "timeout"
    assert ctx.get_partial_result() == "tok0"
    _charged(ctx.snapshot(), _reservation())  # the final usage never came: the worst case


# -- the SDK's own retries ----------------------------------------------------------------------


def test_sdk_retries_are_drawn_from_the_chain(
    server: FakeLLMServer, instrumented: CohereInstrumentor, backoffs: list[float]
) -> None:
    import cohere

    server.fail_next(2, status=503)
    with httpx.Client() as http, ExecutionContext(ExecutionConfig(max_retries_total=5)) as ctx:
        co = cohere.ClientV2(api_key="k", base_url=server.base_url, httpx_client=http)
        _chat(co, request_options={"max_retries": 3})
    snap = ctx.snapshot()
    assert (snap.steps, snap.retries, len(backoffs)) == (1, 2, 2)
    assert server.count(CHAT) == 3


@pytest.mark.asyncio
async def test_sdk_retries_stop_at_max_retries_total(
    server: FakeLLMServer, instrumented: CohereInstrumentor, backoffs: list[float]
) -> None:
    import cohere

    server.fail_next(10, status=429)
    async with httpx.AsyncClient() as http:
        co = cohere.AsyncClientV2(api_key="k", base_url=server.base_url, httpx_client=http)
        async with ExecutionContext(ExecutionConfig(max_retries_total=2)) as ctx:
            with pytest.raises(BudgetExceededError) as caught:
                await co.chat(model=MODEL, messages=MESSAGES, request_options={"max_retries": 8})
    assert caught.value.reason == "retries"
    assert server.count(CHAT) == 3  # the first send and two retries; the third never leaves
    assert ctx.snapshot().retries == 2


# -- what a failed call costs (G10) -----------------------------------------------------------


def test_connection_refused_is_released(
    instrumented: CohereInstrumentor, backoffs: list[float]
) -> None:
    import cohere

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with (
        httpx.Client() as http,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_retries_total=5)) as ctx,
        pytest.raises(httpx.ConnectError),
    ):
        co = cohere.ClientV2(api_key="k", base_url=f"http://127.0.0.1:{port}", httpx_client=http)
        _chat(co, request_options={"max_retries": 2})
    assert len(backoffs) == 2
    _charged(ctx.snapshot(), 0.0, steps=0)


def test_http_error_costs_nothing_and_counts_the_step(
    server: FakeLLMServer, client: cohere.ClientV2
) -> None:
    import cohere

    server.fail_next(1, status=400)
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
        pytest.raises(cohere.BadRequestError) as caught,
    ):
        _chat(client)
    assert caught.value.body == {"id": "err-400", "message": "Injected failure"}
    _charged(ctx.snapshot(), 0.0)


def test_stream_http_error_costs_nothing(server: FakeLLMServer, client: cohere.ClientV2) -> None:
    import cohere

    server.fail_next(1, status=400)
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
        pytest.raises(cohere.BadRequestError),
    ):
        list(client.chat_stream(model=MODEL, messages=MESSAGES, max_tokens=CAP))
    _charged(ctx.snapshot(), 0.0)


def test_timeout_after_sending_commits_the_reservation(
    server: FakeLLMServer, instrumented: CohereInstrumentor
) -> None:
    import cohere

    server.set_latency(2.0)
    with (
        httpx.Client(timeout=0.2) as http,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
        pytest.raises(httpx.ReadTimeout),
    ):
        co = cohere.ClientV2(
            api_key="k", base_url=server.base_url, httpx_client=http, timeout=0.2, max_retries=0
        )
        _chat(co)
    _charged(ctx.snapshot(), _reservation())
    assert server.count(CHAT) == 1


# -- instrument / uninstrument ---------------------------------------------------------------------


def test_uninstrument_restores_the_sdk(server: FakeLLMServer) -> None:
    import cohere
    from cohere.core import http_client

    hooked = [
        (owner, name)
        for owner in (http_client.HttpClient, http_client.AsyncHttpClient)
        for name in ("request", "stream")
    ]
    originals = {(owner, name): owner.__dict__[name] for owner, name in hooked}
    instrumentor = CohereInstrumentor()
    instrumentor.instrument()
    instrumentor._instrument()  # never wraps twice
    try:
        for (owner, name), original in originals.items():
            assert owner.__dict__[name].__wrapped__ is original
        instrumentor.uninstrument()
        assert {key: key[0].__dict__[key[1]] for key in originals} == originals
        with httpx.Client() as http, ExecutionContext(ExecutionConfig(max_steps=0)) as after:
            co = cohere.ClientV2(api_key="k", base_url=server.base_url, httpx_client=http)
            _chat(co)  # not contained any more: max_steps=0 would deny it
        assert after.snapshot().steps == 0
    finally:
        instrumentor.uninstrument()


def test_a_version_outside_the_range_fails_closed(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cohere

    real = hooks_module.version
    monkeypatch.setattr(
        hooks_module, "version", lambda name: "8.0.0" if name == "cohere" else real(name)
    )
    instrumentor = CohereInstrumentor()
    with pytest.raises(InstrumentationError, match=r"cohere 8\.0\.0: the version"):
        instrumentor._instrument()
    try:
        with (
            httpx.Client() as http,
            ExecutionContext(ExecutionConfig(max_steps=5)),
            pytest.raises(InstrumentationError),
        ):
            co = cohere.ClientV2(api_key="k", base_url=server.base_url, httpx_client=http)
            _chat(co)
    finally:
        instrumentor.uninstrument()
        instrumentor._hooks.lift()
    assert server.request_count == 0
