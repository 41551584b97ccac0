"""OllamaInstrumentor: the real ``ollama`` SDK against the embedded fake server.

The fake server speaks Ollama's wire format (JSON replies, NDJSON streams,
``{"error": ...}`` bodies); its request count is the truth for what was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import pytest_asyncio
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests._bounds import input_bound
from tests._clock import patch_chain_clock
from tests.integration._raw_server import RawServer, Reply
from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel._pricing import DEFAULT_MAX_OUTPUT_TOKENS, PriceTable, UnitPrices
from veronica_otel._units import nano_to_usd
from veronica_otel.instrumentors import InstrumentationError
from veronica_otel.instrumentors import _hooks as hooks_module
from veronica_otel.instrumentors._admit import _utf8_bytes
from veronica_otel.instrumentors.ollama import IMAGE_TOKENS, OllamaInstrumentor
from veronica_otel.testing import FakeLLMServer

if TYPE_CHECKING:
    import ollama

MODEL = "llama3.2"
MESSAGES = [{"role": "user", "content": "Say hello."}]
CHAT, GENERATE, EMBED = "/api/chat", "/api/generate", "/api/embed"
INPUT, OUTPUT = 12, 5
FREE = PriceTable({"ollama:*": UnitPrices(0, 0, 0, 0)})
PRICED = UnitPrices.from_usd_per_mtok(1.0, 2.0)
REFUSED = (ConnectionError, httpx.ConnectError)  # 0.4.7 on map it to the first; 0.4.0 did not


def _client_module() -> Any:
    """``ollama._client``, the module (as an attribute it is the package's default Client)."""
    return importlib.import_module("ollama._client")


# -- fixtures -----------------------------------------------------------------------


@contextlib.contextmanager
def _local(host: str, **kwargs: Any) -> Iterator[ollama.Client]:
    """A client, closed after (ollama before 0.6 has no ``with`` or ``close()``)."""
    import ollama

    local = ollama.Client(host=host, **kwargs)
    try:
        yield local
    finally:
        local._client.close()


@contextlib.asynccontextmanager
async def _alocal(host: str) -> AsyncIterator[ollama.AsyncClient]:
    import ollama

    local = ollama.AsyncClient(host=host)
    try:
        yield local
    finally:
        await local._client.aclose()


@pytest.fixture
def instrumented() -> Iterator[OllamaInstrumentor]:
    instrumentor = OllamaInstrumentor()
    instrumentor.instrument()
    yield instrumentor
    instrumentor.uninstrument()


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(input_tokens=INPUT, output_tokens=OUTPUT) as fake:
        yield fake


@pytest.fixture
def client(server: FakeLLMServer, instrumented: OllamaInstrumentor) -> Iterator[ollama.Client]:
    with _local(server.base_url) as local:
        yield local


@pytest_asyncio.fixture
async def aclient(
    server: FakeLLMServer, instrumented: OllamaInstrumentor
) -> AsyncIterator[ollama.AsyncClient]:
    async with _alocal(server.base_url) as local:
        yield local


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on: connecting is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


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


def _chat(local: ollama.Client, **kwargs: Any) -> Any:
    params: dict[str, Any] = {"model": MODEL, "messages": MESSAGES}
    params.update(kwargs)
    return local.chat(**params)


def _outcome(local: ollama.Client) -> str:
    try:
        _chat(local)
    except BudgetExceededError as exc:
        return exc.reason
    return "ok"


def _nums(body: Any) -> Any:
    return (body.get("options") or {}).get("num_predict")


# -- usage, prices, the cap ------------------------------------------------------------


def test_usage_is_committed_from_prompt_eval_and_eval_counts(
    server: FakeLLMServer, client: ollama.Client
) -> None:
    table = PriceTable({"ollama:llama3.2": PRICED})
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0), price_table=table) as ctx:
        reply = _chat(client)
        generated = client.generate(model=MODEL, prompt="hi", options={"num_predict": 3})
        embedded = client.embed(model=MODEL, input=["a", "b"])
    assert (reply.prompt_eval_count, reply.eval_count) == (INPUT, OUTPUT)
    assert (generated.eval_count, generated.done_reason) == (3, "length")
    assert len(embedded.embeddings) == 2
    snap = ctx.snapshot()
    expected = PRICED.cost_nano(INPUT, OUTPUT) + PRICED.cost_nano(INPUT, 3)
    expected += PRICED.cost_nano(INPUT, 0)
    assert snap.cost_usd == nano_to_usd(expected)
    assert (snap.steps, snap.tokens, snap.reserved_usd) == (3, 3 * INPUT + OUTPUT + 3, 0.0)
    assert server.request_count == 3


def test_an_unpriced_model_is_denied_under_a_ceiling_until_ollama_star_prices_it(
    server: FakeLLMServer, client: ollama.Client
) -> None:
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)),
        pytest.raises(BudgetExceededError, match=r"llama3\.2") as caught,
    ):
        _chat(client)
    assert caught.value.reason == "cost"
    assert server.request_count == 0
    with ExecutionContext(
        ExecutionConfig(max_cost_usd=0.0001, max_steps=5), price_table=FREE
    ) as ctx:
        for _ in range(3):
            _chat(client)
        _chat(client, model="deepseek-r1:7b")  # genai-prices would price it as DeepSeek's API
    snap = ctx.snapshot()
    assert (snap.cost_usd, snap.steps, snap.tokens) == (0.0, 4, 4 * (INPUT + OUTPUT))
    assert server.request_count == 4


def test_cloud_models_do_not_match_the_local_wildcard(
    server: FakeLLMServer, client: ollama.Client, instrumented: OllamaInstrumentor
) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0), price_table=FREE):
        for model in ("gpt-oss:120b-cloud", "glm-4.6:cloud"):
            with pytest.raises(BudgetExceededError, match=model):
                _chat(client, model=model)
        with (
            _local("https://ollama.com") as hosted,  # denied before any send
            pytest.raises(BudgetExceededError, match="gpt-oss:120b"),
        ):
            _chat(hosted, model="gpt-oss:120b")
    assert server.request_count == 0
    cloud = PriceTable({"ollama:*": UnitPrices(0, 0, 0, 0), "ollama.cloud:*": PRICED})
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0), price_table=cloud) as ctx:
        _chat(client, model="gpt-oss:120b-cloud")
    assert ctx.snapshot().cost_usd == nano_to_usd(PRICED.cost_nano(INPUT, OUTPUT))


def test_an_uncapped_call_is_clamped_in_a_copy_of_its_options(
    server: FakeLLMServer, client: ollama.Client
) -> None:
    import ollama

    options: dict[str, Any] = {"temperature": 0.5}
    unbounded: dict[str, Any] = {"num_predict": -1}
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0), price_table=FREE):
        _chat(client)
        _chat(client, options=options)
        _chat(client, options=unbounded)
        _chat(client, options={"num_predict": 7})
        client.generate(model=MODEL, prompt="hi", options=ollama.Options(num_predict=-2))
    assert options == {"temperature": 0.5} and unbounded == {"num_predict": -1}
    sent = [_nums(r.body) for r in server.requests]
    assert sent == [DEFAULT_MAX_OUTPUT_TOKENS] * 3 + [7, DEFAULT_MAX_OUTPUT_TOKENS]
    assert server.requests[1].body["options"]["temperature"] == 0.5
    # With a token ceiling, the cap is what the chain has left after the input.
    server.reset()
    bound = input_bound([MESSAGES], 1)
    with ExecutionContext(ExecutionConfig(max_tokens=bound + 40)):
        _chat(client)
    assert _nums(server.requests[0].body) == 40
    # A chain that limits neither money nor tokens leaves the request as it is.
    server.reset()
    with ExecutionContext(ExecutionConfig(max_steps=1)):
        _chat(client)
    assert _nums(server.requests[0].body) is None


def test_images_and_context_count_in_the_input_bound(
    server: FakeLLMServer, client: ollama.Client
) -> None:
    image = "iVBORw0KGgo="  # a few base64 bytes: an image costs tokens by resolution
    messages = [{"role": "user", "content": "What is this?", "images": [image]}]
    with ExecutionContext(ExecutionConfig(max_tokens=IMAGE_TOKENS)):
        with pytest.raises(BudgetExceededError) as caught:
            client.chat(model=MODEL, messages=messages, options={"num_predict": 1})
        with pytest.raises(BudgetExceededError):
            client.generate(
                model=MODEL,
                prompt="hi",
                context=list(range(IMAGE_TOKENS)),
                options={"num_predict": 1},
            )
    assert caught.value.reason == "tokens"
    assert server.request_count == 0
    with ExecutionContext(ExecutionConfig(max_tokens=IMAGE_TOKENS + 200)) as ctx:
        client.chat(model=MODEL, messages=messages, options={"num_predict": 1})
    assert ctx.snapshot().tokens == INPUT + 1


def test_the_chat_lane_reads_what_the_general_rules_read(server: FakeLLMServer) -> None:
    """read_request reads the SDK's chat in one frame (_cap's common case and _hosted
    copied into it); a chat by full URL or under a path no route names takes the
    general path, which hands it to the lane."""
    from veronica_otel.instrumentors import ollama as adapter_module

    image = {"role": "user", "content": "look", "images": ["aGk=", "aGk="]}
    plain = {"role": "user", "content": "look"}
    tool = [{"type": "function"}]
    # body, then its input parts, messages and unseen tokens
    cases: list[tuple[dict[str, Any], list[object], int, int]] = [
        ({"model": MODEL, "messages": MESSAGES, "tools": []}, [MESSAGES], 1, 0),
        (
            {"model": MODEL, "messages": [image, *MESSAGES], "images": ["aGk="], "context": [1, 2]},
            [[plain, *MESSAGES]],
            2,
            2 + 3 * IMAGE_TOKENS,
        ),
        ({"model": "", "messages": [], "tools": tool, "format": "json"}, [tool, "json"], 1, 0),
        (
            {"model": 7, "messages": "not a list", "options": {"num_predict": 2.5}},
            ["not a list"],
            1,
            0,
        ),
        (
            {"model": "glm-4.6:cloud", "messages": MESSAGES, "options": {"num_predict": -1}},
            [MESSAGES],
            1,
            0,
        ),
        ({"model": MODEL, "options": None}, [], 1, 0),
        # the plain chat (read_plain's lane): strings only, a cap, no tools
        (
            {
                "model": MODEL,
                "messages": [*MESSAGES, plain],
                "tools": [],
                "options": {"num_predict": 3},
            },
            [[*MESSAGES, plain]],
            2,
            0,
        ),
        (
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "héllo ✓"}],
                "options": {"num_predict": 0},
            },
            [[{"role": "user", "content": "héllo ✓"}]],
            1,
            0,
        ),
    ]
    read = adapter_module.OllamaAdapter().read_request
    plain_lanes = 0
    for host in (server.base_url, "https://ollama.com"):
        with _local(host) as local:
            for body, parts, n_messages, extra in cases:
                kwargs = {"json": body, "stream": False}
                lane = read(local, (dict, "POST", CHAT), kwargs, "_request")
                assert lane is not None
                # The plain lane reads what the general chat rules read, and its
                # input bytes are the byte walk's (a local client's plain chat).
                request, size = adapter_module.read_plain(None, (dict, "POST", CHAT), kwargs, local)
                assert request == lane == adapter_module._chat(local, body, kwargs)
                if size >= 0:
                    plain_lanes += 1
                    assert size == _utf8_bytes(request.input_parts)
                    assert (request.provider, host) == (None, server.base_url)
                assert (lane.operation, lane.input_parts, lane.n_messages) == (
                    "chat",
                    parts,
                    n_messages,
                )
                assert lane.extra_input_tokens == extra
                assert (lane.cap, lane.clampable) == adapter_module._cap(body.get("options"))
                model = body["model"] if type(body["model"]) is str and body["model"] else "unknown"
                hosted = adapter_module._hosted(local, model)
                assert hosted == (host != server.base_url or model.endswith("cloud"))
                assert (lane.model, lane.provider) == (model, "ollama.cloud" if hosted else None)
                assert read(local, (dict, "POST", f"{host}{CHAT}"), kwargs, "_request") == lane
                other = read(local, (dict, "POST", "/v9/chat"), kwargs, "_request")
                assert other == lane._replace(
                    input_parts=[body], cap=DEFAULT_MAX_OUTPUT_TOKENS, clampable=False
                )
    assert plain_lanes == 2  # the plain cases on the local host (a hosted call is not plain)


def test_the_local_lane_takes_local_clients_and_hands_the_rest_to_request(
    server: FakeLLMServer, instrumented: OllamaInstrumentor
) -> None:
    """Where the shared lane exists, ``_request``'s plain function is the lane, its
    reader given the client: a local client's plain chat runs in it, a hosted
    client's call and a cloud tag go the general way, each priced as before.
    Without one, ``_request`` is the hook as it is."""
    from veronica_otel.instrumentors import ollama as adapter_module

    if not hasattr(adapter_module._request, "veronica_lane"):
        return
    hooked = _client_module().Client.__dict__["_request"]
    assert hooked.veronica_hook is adapter_module._request  # the lane, found as ours
    cloud = PriceTable({"ollama:*": UnitPrices(0, 0, 0, 0), "ollama.cloud:*": PRICED})
    with _local(server.base_url) as local:
        with ExecutionContext(ExecutionConfig(max_cost_usd=1.0), price_table=cloud) as ctx:
            _chat(local)  # the plain chat: the lane
            _chat(local, model="glm-4.6:cloud")  # a cloud tag: the general way, in the lane
            local.generate(model=MODEL, prompt="hi", options={"num_predict": 3})
        with (
            ExecutionContext(ExecutionConfig(max_cost_usd=1.0), price_table=FREE),
            _local("https://ollama.com") as hosted,
            pytest.raises(BudgetExceededError),
        ):
            _chat(hosted)  # hosted: ollama.cloud, unpriced here: denied unsent
    assert ctx.snapshot().steps == 3
    assert ctx.snapshot().cost_usd == nano_to_usd(PRICED.cost_nano(INPUT, OUTPUT))
    assert server.request_count == 3


def test_legacy_embeddings_report_no_usage_and_commit_the_reservation(
    server: FakeLLMServer, client: ollama.Client
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=2)) as ctx:
        client.embeddings(model=MODEL, prompt="hello")
    assert ctx.snapshot().tokens == input_bound(["hello"], 1)
    assert server.count("/api/embeddings") == 1


def test_systemone_is_contained_with_its_usage(
    server: FakeLLMServer, client: ollama.Client
) -> None:
    questions = {"mood": {"type": "noul", "instructions": "Is it happy?"}}
    with ExecutionContext(ExecutionConfig(max_steps=1)) as ctx:
        answer = client.systemone(MODEL, "I won!", questions)
        with pytest.raises(BudgetExceededError):
            client.systemone(MODEL, "again", questions)
    assert answer.usage.input_tokens == INPUT
    assert ctx.snapshot().tokens == INPUT + 1
    assert server.count("/v1/systemone") == 1


def test_model_management_passes_uncounted(server: FakeLLMServer, client: ollama.Client) -> None:
    import ollama

    with (
        ExecutionContext(ExecutionConfig(max_steps=0)) as ctx,
        pytest.raises(ollama.ResponseError) as caught,  # the fake has no /api/tags
    ):
        client.list()
    assert caught.value.status_code == 404
    assert ctx.snapshot().steps == 0
    assert server.count("/api/tags") == 1


def test_no_chain_passes_through(server: FakeLLMServer, client: ollama.Client) -> None:
    reply = _chat(client)
    assert reply.eval_count == OUTPUT
    assert _nums(server.requests[0].body) is None  # untouched


# -- steps: sync, threads, asyncio ----------------------------------------------------


def test_max_steps_lets_exactly_n_requests_through(
    server: FakeLLMServer, client: ollama.Client
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=3)) as ctx:
        outcomes = [_outcome(client) for _ in range(5)]
    assert outcomes == ["ok"] * 3 + ["steps"] * 2
    assert ctx.snapshot().steps == 3 == server.count(CHAT)


def test_threads_oversubscribed_never_pass_the_limit(
    server: FakeLLMServer, client: ollama.Client
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=5)) as ctx, ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(contextvars.copy_context().run, _outcome, client) for _ in range(12)]
        outcomes = [f.result() for f in futures]
    sent = outcomes.count("ok")
    assert 1 <= sent <= 5
    assert outcomes.count("steps") == 12 - sent
    assert ctx.snapshot().steps == sent == server.count(CHAT)
    assert ctx.snapshot().reserved_usd == 0.0


@pytest.mark.asyncio
async def test_tasks_share_the_chain(server: FakeLLMServer, aclient: ollama.AsyncClient) -> None:
    async def call() -> str:
        try:
            await aclient.chat(model=MODEL, messages=MESSAGES)
        except BudgetExceededError as exc:
            return exc.reason
        return "ok"

    async with ExecutionContext(ExecutionConfig(max_steps=4)) as ctx:
        outcomes = await asyncio.gather(*(call() for _ in range(7)))
    assert sorted(outcomes) == ["ok"] * 4 + ["steps"] * 3
    assert ctx.snapshot().steps == 4 == server.count(CHAT)


# -- streams ------------------------------------------------------------------------


def test_a_stream_is_counted_from_its_last_chunk(
    server: FakeLLMServer, client: ollama.Client
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=2)) as ctx:
        chunks = list(_chat(client, stream=True))
        pieces = [c.response for c in client.generate(model=MODEL, prompt="x", stream=True)]
    assert [c.done for c in chunks] == [False] * OUTPUT + [True]
    assert chunks[-1].eval_count == OUTPUT and "".join(pieces) == ctx.get_partial_result()
    snap = ctx.snapshot()
    assert (snap.steps, snap.tokens, snap.reserved_usd) == (2, 2 * (INPUT + OUTPUT), 0.0)
    assert server.count(CHAT) == server.count(GENERATE) == 1


@pytest.mark.asyncio
async def test_an_async_stream_is_counted_from_its_last_chunk(
    server: FakeLLMServer, aclient: ollama.AsyncClient
) -> None:
    async with ExecutionContext(ExecutionConfig(max_steps=1)) as ctx:
        stream = await aclient.chat(model=MODEL, messages=MESSAGES, stream=True)
        chunks = [chunk async for chunk in stream]
    assert chunks[-1].done and chunks[-1].eval_count == OUTPUT
    assert ctx.snapshot().tokens == INPUT + OUTPUT
    assert ctx.get_partial_result() == " ".join(f"tok{i}" for i in range(OUTPUT))


def test_a_stream_is_cut_when_its_chain_trips(
    server: FakeLLMServer, client: ollama.Client, clock: FakeClock
) -> None:
    import ollama

    with ExecutionContext(ExecutionConfig(timeout_ms=60_000)) as ctx:
        stream = _chat(client, stream=True)
        seen = []
        with pytest.raises(BudgetExceededError) as caught:
            for chunk in stream:
                seen.append(chunk.message.content)
                if len(seen) == 2:
                    clock.advance(61)
    assert caught.value.reason == "timeout"
    assert type(caught.value) is not ollama.ResponseError
    assert ctx.get_partial_result() == "tok0 tok1"
    snap = ctx.snapshot()
    assert (snap.steps, snap.reserved_usd, snap.aborted) == (1, 0.0, True)
    assert server.count(CHAT) == 1


@pytest.mark.asyncio
async def test_an_async_stream_is_cut_by_a_trip_from_another_call(
    server: FakeLLMServer, aclient: ollama.AsyncClient
) -> None:
    async with ExecutionContext(ExecutionConfig(max_steps=2)) as ctx:
        stream = await aclient.generate(model=MODEL, prompt="x", stream=True)
        first = await stream.__anext__()
        await aclient.chat(model=MODEL, messages=MESSAGES)  # step 2
        with pytest.raises(BudgetExceededError):
            await aclient.chat(model=MODEL, messages=MESSAGES)  # trips the chain
        with pytest.raises(BudgetExceededError) as caught:
            await stream.__anext__()
    assert first.response == "tok0" and caught.value.reason == "steps"
    assert ctx.snapshot().reserved_usd == 0.0
    assert server.count(GENERATE) == 1 and server.count(CHAT) == 1


# -- failures (G10) -----------------------------------------------------------------


def test_connection_refused_charges_nothing(
    instrumented: OllamaInstrumentor, closed_port: int
) -> None:
    with (
        _local(f"http://127.0.0.1:{closed_port}") as local,
        ExecutionContext(ExecutionConfig(max_steps=5), price_table=FREE) as ctx,
    ):
        with pytest.raises(REFUSED):
            _chat(local)
        with pytest.raises(httpx.ConnectError):  # the SDK maps it only when not streaming
            list(_chat(local, stream=True))
    snap = ctx.snapshot()
    assert (snap.steps, snap.tokens, snap.reserved_usd) == (0, 0, 0.0)


@pytest.mark.asyncio
async def test_async_connection_refused_charges_nothing(
    instrumented: OllamaInstrumentor, closed_port: int
) -> None:
    async with (
        _alocal(f"http://127.0.0.1:{closed_port}") as local,
        ExecutionContext(ExecutionConfig(max_steps=5)) as ctx,
    ):
        with pytest.raises(REFUSED):
            await local.chat(model=MODEL, messages=MESSAGES)
    assert (ctx.snapshot().steps, ctx.snapshot().tokens) == (0, 0)


def test_an_http_error_reply_costs_nothing_and_counts_the_step(
    server: FakeLLMServer, client: ollama.Client
) -> None:
    import ollama

    table = PriceTable({"ollama:llama3.2": PRICED})
    server.fail_next(2, status=500)
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0), price_table=table) as ctx:
        with pytest.raises(ollama.ResponseError) as caught:
            _chat(client)
        with pytest.raises(ollama.ResponseError):
            list(_chat(client, stream=True))
    assert caught.value.status_code == 500
    assert caught.value.error == "Injected failure"  # Ollama's {"error": ...} body
    snap = ctx.snapshot()
    assert (snap.steps, snap.cost_usd, snap.tokens, snap.reserved_usd) == (2, 0.0, 0, 0.0)
    assert server.count(CHAT) == 2


@pytest.mark.asyncio
async def test_async_http_error_reply_costs_nothing_and_counts_the_step(
    server: FakeLLMServer, aclient: ollama.AsyncClient
) -> None:
    import ollama

    server.fail_next(1, status=429)
    async with ExecutionContext(ExecutionConfig(max_steps=3)) as ctx:
        with pytest.raises(ollama.ResponseError):
            async for _ in await aclient.chat(model=MODEL, messages=MESSAGES, stream=True):
                pass
    assert (ctx.snapshot().steps, ctx.snapshot().tokens) == (1, 0)


def test_a_timeout_after_sending_commits_the_reservation(
    server: FakeLLMServer, instrumented: OllamaInstrumentor
) -> None:
    table = PriceTable({"ollama:llama3.2": PRICED})
    server.set_latency(2.0)
    with (
        _local(server.base_url, timeout=0.2) as local,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0), price_table=table) as ctx,
        pytest.raises(httpx.ReadTimeout),
    ):
        _chat(local, options={"num_predict": 50})
    bound = input_bound([MESSAGES], 1)
    snap = ctx.snapshot()
    assert snap.cost_usd == nano_to_usd(PRICED.max_cost_nano(bound, 50))
    assert (snap.steps, snap.tokens, snap.reserved_usd) == (1, bound + 50, 0.0)
    assert server.count(CHAT) == 1


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode() + b"\n"


@pytest.mark.parametrize("ending", ["error line", "cut"])
def test_a_stream_that_fails_after_its_first_chunk_commits_the_reservation(
    instrumented: OllamaInstrumentor, ending: str
) -> None:
    import ollama

    first = _line({"model": MODEL, "created_at": "x", "response": "tok0", "done": False})
    if ending == "error line":  # HTTP 200, then Ollama's error object on its own line
        reply = Reply(chunks=[first, _line({"error": "model runner crashed"})])
    else:
        reply = Reply(chunks=[first], cut=True)
    table = PriceTable({"ollama:llama3.2": PRICED})
    with RawServer() as raw, _local(raw.base_url) as local:
        raw.script(Reply(**{**reply.__dict__, "content_type": "application/x-ndjson"}))
        with (
            ExecutionContext(ExecutionConfig(max_cost_usd=1.0), price_table=table) as ctx,
            pytest.raises((ollama.ResponseError, httpx.RemoteProtocolError)),
        ):
            for _ in local.generate(
                model=MODEL, prompt="x", stream=True, options={"num_predict": 20}
            ):
                pass
        assert raw.count == 1
    bound = input_bound(["x"], 1)
    snap = ctx.snapshot()
    assert snap.cost_usd == nano_to_usd(PRICED.max_cost_nano(bound, 20))
    assert (snap.steps, snap.tokens, snap.reserved_usd) == (1, bound + 20, 0.0)


# -- spans, tools, counted once ------------------------------------------------------


def test_one_genai_span_per_call(
    server: FakeLLMServer, client: ollama.Client, span_exporter: InMemorySpanExporter
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=5)):
        _chat(client, options={"temperature": 0.25, "num_predict": 9})
    (span,) = [s for s in span_exporter.get_finished_spans() if s.name == f"chat {MODEL}"]
    attributes = dict(span.attributes or {})
    assert span.kind is SpanKind.CLIENT
    assert attributes["gen_ai.provider.name"] == "ollama"
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.temperature"] == 0.25
    assert attributes["gen_ai.request.max_tokens"] == 9
    assert attributes["gen_ai.usage.input_tokens"] == INPUT
    assert attributes["gen_ai.usage.output_tokens"] == OUTPUT
    assert attributes["gen_ai.response.model"] == MODEL
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert attributes["server.address"] == "127.0.0.1"
    assert attributes["server.port"] == server.port


class _ToFake(httpx.HTTPTransport):
    """Sends what the SDK addresses to ollama.com to the fake server instead."""

    def __init__(self, server: FakeLLMServer) -> None:
        super().__init__()
        self._port = server.port

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.url = request.url.copy_with(scheme="http", host="127.0.0.1", port=self._port)
        return super().handle_request(request)


def test_web_tools_are_contained_as_tool_calls(
    server: FakeLLMServer, instrumented: OllamaInstrumentor, span_exporter: InMemorySpanExporter
) -> None:
    with (
        _local(
            server.base_url,
            headers={"Authorization": "Bearer k"},
            mounts={"https://ollama.com": _ToFake(server)},
        ) as local,
        ExecutionContext(ExecutionConfig(max_steps=2)) as ctx,
    ):
        found = local.web_search("otel", max_results=2)
        page = local.web_fetch("https://example.com")
        with pytest.raises(BudgetExceededError):
            local.web_search("again")
    assert len(found.results) == 2 and page.title == "https://example.com"
    assert ctx.snapshot().steps == 2
    assert server.count("/api/web_search") == server.count("/api/web_fetch") == 1
    names = [s.name for s in span_exporter.get_finished_spans()]
    assert "execute_tool web_search" in names and "execute_tool web_fetch" in names


def test_an_outer_wrap_llm_call_does_not_count_it_again(
    server: FakeLLMServer, client: ollama.Client
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=5)) as ctx:
        ctx.wrap_llm_call(lambda: _chat(client))
    assert server.count(CHAT) == 1
    assert ctx.snapshot().steps == 1


# -- instrument / uninstrument, drift --------------------------------------------------


def test_uninstrument_restores_the_sdk(server: FakeLLMServer) -> None:
    ollama_client = _client_module()
    originals = {
        name: getattr(ollama_client, name).__dict__["_request"]
        for name in ("Client", "AsyncClient")
    }
    instrumentor = OllamaInstrumentor()
    instrumentor.instrument()
    instrumentor._instrument()  # never wraps twice
    try:
        for name, original in originals.items():
            assert getattr(ollama_client, name).__dict__["_request"].__wrapped__ is original
        with _local(server.base_url) as local:
            with ExecutionContext(ExecutionConfig(max_steps=5)) as ctx:
                _chat(local)
            assert ctx.snapshot().steps == 1
            instrumentor.uninstrument()
            for name, original in originals.items():
                assert getattr(ollama_client, name).__dict__["_request"] is original
            with ExecutionContext(ExecutionConfig(max_steps=0)) as after:
                _chat(local)  # not contained any more: max_steps=0 would deny it
            assert after.snapshot().steps == 0
    finally:
        instrumentor.uninstrument()
    assert server.count(CHAT) == 2


def test_a_version_outside_the_range_is_refused_and_nothing_is_sent(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = hooks_module.version
    monkeypatch.setattr(hooks_module, "version", lambda n: "1.0.0" if n == "ollama" else real(n))
    instrumentor = OllamaInstrumentor()
    try:
        with pytest.raises(InstrumentationError, match=r"ollama 1\.0\.0: the version"):
            instrumentor.instrument()
        with _local(server.base_url) as local:
            with (
                ExecutionContext(ExecutionConfig(max_steps=5)),
                pytest.raises(InstrumentationError),
            ):
                _chat(local)
            _chat(local)  # outside a chain: passes
    finally:
        instrumentor.uninstrument()
    assert server.count(CHAT) == 1
    assert version("ollama") == real("ollama")


def test_a_changed_hook_is_refused(server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    ollama_client = _client_module()
    original = ollama_client.AsyncClient.__dict__["_request"]

    async def drifted(self: Any, cls: Any, *args: Any, **kwargs: Any) -> Any:  # stream not kw-only
        return await original(self, cls, *args, **kwargs)

    monkeypatch.setattr(ollama_client.AsyncClient, "_request", drifted)
    instrumentor = OllamaInstrumentor()
    try:
        with pytest.raises(
            InstrumentationError, match=r"AsyncClient\._request has no keyword-only"
        ):
            instrumentor.instrument()
        with (
            _local(server.base_url) as local,
            ExecutionContext(ExecutionConfig(max_steps=5)),
            pytest.raises(InstrumentationError),
        ):
            _chat(local)
    finally:
        instrumentor.uninstrument()
    assert server.request_count == 0
