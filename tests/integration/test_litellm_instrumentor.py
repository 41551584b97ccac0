"""LiteLLMInstrumentor: the real litellm against the embedded fake server.

litellm sends ``openai/`` models through the ``openai`` SDK and ``anthropic/``
models through its own ``httpx`` handler (sync) and ``aiohttp`` transport
(async); both routes are counted at the server. The price map is litellm's
bundled copy (``LITELLM_LOCAL_MODEL_COST_MAP``), so importing it sends
nothing (checked in a subprocess below).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before litellm is imported

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel._pricing import default_price_table
from veronica_otel._units import nano_to_usd
from veronica_otel.instrumentors import InstrumentationError
from veronica_otel.instrumentors import _hooks as hooks_module
from veronica_otel.instrumentors.litellm import LiteLLMInstrumentor
from veronica_otel.testing import FakeLLMServer

# litellm's own modules warn as they load and stream (pydantic on its types).
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*ReadOnly.*:UserWarning"),
    pytest.mark.filterwarnings("ignore:Accessing the 'model_:DeprecationWarning"),
    # litellm's logging worker keeps an event loop (and its sockets) of its own
    # that it never closes; collected at random points of later tests.
    pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.usefixtures("litellm_leaks_collected"),
]

# Imported when the module's first test runs, not at collection: every pytest-xdist
# worker collects every module, and litellm's import takes seconds of CPU.
litellm: Any = None


class _Outside:
    """What this process sends off the loopback, from litellm's import on (an
    audit hook cannot be removed, so it records only while ``on``)."""

    def __init__(self) -> None:
        self.on = False
        self.seen: list[tuple[str, Any]] = []

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.on:
            return
        if event == "socket.connect":
            address = args[1]
            host = address[0] if isinstance(address, tuple) else str(address)
            try:
                loopback = ipaddress.ip_address(host).is_loopback
            except ValueError:
                loopback = False
            if not loopback:
                self.seen.append((event, address))
        elif event == "socket.getaddrinfo" and args[0] not in ("127.0.0.1", "localhost"):
            self.seen.append((event, args[0]))


_OUTSIDE = _Outside()
_IMPORTED_HERE = False  # litellm's import watched in this process (not imported before)


@pytest.fixture(scope="module", autouse=True)
def _litellm() -> Iterator[None]:
    global litellm, _IMPORTED_HERE
    if "litellm" not in sys.modules:
        sys.addaudithook(_OUTSIDE)
        _OUTSIDE.on = _IMPORTED_HERE = True
    import litellm as module

    litellm = module
    try:
        yield
    finally:
        _OUTSIDE.on = False


INPUT, OUTPUT = 10, 5
MESSAGES = [{"role": "user", "content": "Say hello."}]
ROUTES = {
    "openai": ("openai/gpt-4o-mini", "openai", "gpt-4o-mini", "/v1/chat/completions"),
    "anthropic": (
        "anthropic/claude-3-5-haiku-latest",
        "anthropic",
        "claude-3-5-haiku-latest",
        "/v1/messages",
    ),
}


@pytest.fixture
def instrumented() -> Iterator[LiteLLMInstrumentor]:
    instrumentor = LiteLLMInstrumentor()
    instrumentor.instrument()
    yield instrumentor
    instrumentor.uninstrument()


@pytest.fixture
def server(instrumented: LiteLLMInstrumentor) -> Iterator[FakeLLMServer]:
    with FakeLLMServer(input_tokens=INPUT, output_tokens=OUTPUT) as fake:
        yield fake


@pytest.fixture(params=sorted(ROUTES))
def route(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _base(server: FakeLLMServer, route: str) -> str:
    return server.openai_base_url if route == "openai" else server.anthropic_base_url


def _args(server: FakeLLMServer, route: str, **extra: Any) -> dict[str, Any]:
    model = ROUTES[route][0]
    return {
        "model": model,
        "messages": MESSAGES,
        "api_base": _base(server, route),
        "api_key": "test",
        "max_retries": 0,
        **extra,
    }


def _cost(route: str, inp: int = INPUT, out: int = OUTPUT) -> float:
    _, provider, model, _ = ROUTES[route]
    prices = default_price_table().lookup(provider, model)
    assert prices is not None
    return nano_to_usd(prices.cost_nano(inp, out))


# -- max_steps: exactly N requests leave, the caller catches our error ----------------


def test_max_steps_lets_exactly_n_calls_out_sync(server: FakeLLMServer, route: str) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=2)) as ctx:
        for _ in range(2):
            reply = litellm.completion(**_args(server, route))
            assert reply.usage.completion_tokens == OUTPUT
        with pytest.raises(BudgetExceededError) as denied:
            litellm.completion(**_args(server, route))
    assert denied.value.reason == "steps"
    assert server.count(ROUTES[route][3]) == 2
    assert ctx.snapshot().cost_usd == pytest.approx(2 * _cost(route))


def test_max_steps_lets_exactly_n_calls_out_async(server: FakeLLMServer, route: str) -> None:
    async def run() -> ExecutionContext:
        with ExecutionContext(ExecutionConfig(max_steps=3)) as ctx:
            await litellm.acompletion(**_args(server, route))
            await asyncio.gather(*(litellm.acompletion(**_args(server, route)) for _ in range(2)))
            with pytest.raises(BudgetExceededError):
                await litellm.acompletion(**_args(server, route))
            # the sync function asked for a coroutine: contained when awaited
            with pytest.raises(BudgetExceededError):
                await litellm.completion(**_args(server, route), acompletion=True)
        return ctx

    ctx = asyncio.run(run())
    assert server.count(ROUTES[route][3]) == 3
    assert ctx.snapshot().cost_usd == pytest.approx(3 * _cost(route))


def test_streams_are_charged_their_final_usage(server: FakeLLMServer, route: str) -> None:
    usage = {"include_usage": True}
    with ExecutionContext(ExecutionConfig(max_steps=2)) as ctx:
        chunks = list(litellm.completion(**_args(server, route, stream=True, stream_options=usage)))
        assert any(getattr(chunk, "usage", None) for chunk in chunks)

        async def consume() -> None:
            stream = await litellm.acompletion(
                **_args(server, route, stream=True, stream_options=usage)
            )
            async for _ in stream:
                pass

        asyncio.run(consume())
        with pytest.raises(BudgetExceededError):
            litellm.completion(**_args(server, route, stream=True))
    assert server.count(ROUTES[route][3]) == 2
    assert ctx.snapshot().cost_usd == pytest.approx(2 * _cost(route))


def test_a_cost_ceiling_holds_at_real_usage(server: FakeLLMServer, route: str) -> None:
    one = _cost(route)
    with ExecutionContext(ExecutionConfig(max_cost_usd=one * 50)) as ctx:
        sent = 0
        with pytest.raises(BudgetExceededError) as denied:
            for _ in range(100):
                litellm.completion(**_args(server, route, max_tokens=OUTPUT))
                sent += 1
    assert denied.value.reason == "cost"
    assert server.count(ROUTES[route][3]) == sent
    assert ctx.snapshot().cost_usd <= one * 50
    assert sent >= 45  # the reservation is a bound, not a multiple of the cost


def test_the_output_cap_is_clamped_when_unset(server: FakeLLMServer) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.01)):
        litellm.completion(**_args(server, "anthropic"))
    sent = server.requests[-1].body
    assert isinstance(sent["max_tokens"], int) and sent["max_tokens"] > 0


# -- Router: each attempt once, re-attempts drawn from max_retries_total ---------------


def _router(server: FakeLLMServer, **settings: Any) -> Any:
    deployments = [
        {
            "model_name": name,
            "litellm_params": {"model": ROUTES[name][0], "api_base": _base(server, name)}
            | {"api_key": "test"},
        }
        for name in ROUTES
    ]
    return litellm.Router(model_list=deployments, **settings)


def test_router_calls_count_once_each(server: FakeLLMServer) -> None:
    router = _router(server, num_retries=0)
    with ExecutionContext(ExecutionConfig(max_steps=3)) as ctx:
        router.completion(model="openai", messages=MESSAGES)
        asyncio.run(router.acompletion(model="anthropic", messages=MESSAGES))
        router.completion(model="anthropic", messages=MESSAGES)
        with pytest.raises(BudgetExceededError):
            router.completion(model="openai", messages=MESSAGES)
    assert server.request_count == 3
    assert ctx.snapshot().cost_usd == pytest.approx(_cost("openai") + 2 * _cost("anthropic"))


def test_router_retries_are_drawn_from_max_retries_total(server: FakeLLMServer) -> None:
    router = _router(server, num_retries=3, retry_after=0)
    server.fail_next(5, status=500, retry_after_ms=1)
    with (
        ExecutionContext(ExecutionConfig(max_retries_total=1)) as ctx,
        pytest.raises(BudgetExceededError) as denied,
    ):
        router.completion(model="anthropic", messages=MESSAGES)
    assert denied.value.reason == "retries"
    assert server.request_count == 2  # the first attempt and the one retry allowed
    assert ctx.snapshot().retries == 1
    assert ctx.snapshot().cost_usd == 0  # two HTTP 500 replies: billed nothing


# -- litellm's own retries, G10 --------------------------------------------------------


def test_litellm_num_retries_are_drawn_from_max_retries_total(server: FakeLLMServer) -> None:
    server.fail_next(5, status=500, retry_after_ms=1)
    with (
        ExecutionContext(ExecutionConfig(max_retries_total=1)) as ctx,
        pytest.raises(BudgetExceededError) as denied,
    ):
        litellm.completion(**_args(server, "anthropic", num_retries=3))
    assert denied.value.reason == "retries"
    assert server.count("/v1/messages") == 2
    assert ctx.snapshot().steps == 1


def test_an_http_error_costs_nothing_and_counts_the_step(server: FakeLLMServer) -> None:
    server.fail_next(1, status=500)
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        with pytest.raises(litellm.InternalServerError):  # litellm's own error, unchanged
            litellm.completion(**_args(server, "anthropic"))
        snapshot = ctx.snapshot()
    assert (snapshot.steps, snapshot.cost_usd, snapshot.reserved_usd) == (1, 0, 0)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_timeout_after_the_send_costs_the_reservation(
    route: str, instrumented: LiteLLMInstrumentor
) -> None:
    with (
        FakeLLMServer(input_tokens=INPUT, output_tokens=OUTPUT, latency_s=2.0) as slow,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        with pytest.raises(litellm.Timeout):
            litellm.completion(**_args(slow, route, timeout=0.2, max_tokens=100))
        snapshot = ctx.snapshot()
        assert slow.count(ROUTES[route][3]) == 1
    assert snapshot.steps == 1
    assert snapshot.cost_usd > _cost(route, out=100) * 0.99  # the worst case, not zero
    assert snapshot.reserved_usd == 0


def test_a_refused_connection_costs_nothing(instrumented: LiteLLMInstrumentor) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        with pytest.raises(litellm.InternalServerError):  # litellm maps it so
            litellm.completion(
                model=ROUTES["anthropic"][0],
                messages=MESSAGES,
                api_base="http://127.0.0.1:9",
                api_key="test",
            )
        snapshot = ctx.snapshot()
    assert (snapshot.steps, snapshot.cost_usd) == (0, 0)


# -- other endpoints ------------------------------------------------------------------


def test_embeddings_and_responses_are_contained(server: FakeLLMServer) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=2, max_cost_usd=1.0)) as ctx:
        embedded = litellm.embedding(
            model="openai/text-embedding-3-small",
            input=["hello"],
            api_base=server.openai_base_url,
            api_key="test",
        )
        assert embedded.usage.prompt_tokens == INPUT
        litellm.responses(
            model="openai/gpt-4o-mini",
            input="Say hello.",
            api_base=server.openai_base_url,
            api_key="test",
        )
        with pytest.raises(BudgetExceededError):
            litellm.embedding(
                model="openai/text-embedding-3-small",
                input=["hello"],
                api_base=server.openai_base_url,
                api_key="test",
            )
    assert server.count("/v1/embeddings") == 1
    assert server.count("/v1/responses") == 1
    assert ctx.snapshot().cost_usd > 0


def test_image_generation_is_refused_under_a_cost_ceiling(server: FakeLLMServer) -> None:
    with (
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)),
        pytest.raises(BudgetExceededError, match="image_generation, not priced per token"),
    ):
        litellm.image_generation(
            prompt="a cat", model="openai/dall-e-3", api_base=server.openai_base_url, api_key="k"
        )
    assert server.request_count == 0


# -- G13: the openai SDK under litellm counts once --------------------------------------


def test_the_openai_sdk_under_litellm_counts_once(server: FakeLLMServer) -> None:
    from veronica_otel.instrumentors.openai import OpenAIInstrumentor

    openai_instrumentor = OpenAIInstrumentor()
    openai_instrumentor.instrument()
    try:
        with ExecutionContext(ExecutionConfig(max_steps=5)) as ctx:
            litellm.completion(**_args(server, "openai"))
        snapshot = ctx.snapshot()
    finally:
        openai_instrumentor.uninstrument()
    assert server.request_count == 1
    assert snapshot.steps == 1
    assert snapshot.cost_usd == pytest.approx(_cost("openai"))


# -- fail closed, uninstrument --------------------------------------------------------


def test_a_version_outside_the_tested_range_fails_closed(
    monkeypatch: pytest.MonkeyPatch, server: FakeLLMServer
) -> None:
    real_version = hooks_module.version
    monkeypatch.setattr(
        hooks_module, "version", lambda name: "2.0.0" if name == "litellm" else real_version(name)
    )
    from opentelemetry.instrumentation import dependencies

    monkeypatch.setattr(
        dependencies, "version", lambda name: "2.0.0" if name == "litellm" else real_version(name)
    )
    instrumentor = LiteLLMInstrumentor()
    instrumentor.uninstrument()  # the fixture's instrumentation, off for this test
    try:
        with pytest.raises(InstrumentationError, match=r"litellm 2\.0\.0: the version"):
            instrumentor.instrument()
        with ExecutionContext(ExecutionConfig(max_steps=5)), pytest.raises(InstrumentationError):
            litellm.completion(**_args(server, "anthropic"))
        assert server.request_count == 0
    finally:
        instrumentor.uninstrument()
        monkeypatch.undo()
        instrumentor.instrument()  # as the fixture left it


def test_uninstrument_restores_every_public_function(instrumented: LiteLLMInstrumentor) -> None:
    from litellm import main
    from litellm.chat_completions import dispatch

    instrumentor = LiteLLMInstrumentor()
    instrumentor.uninstrument()
    try:
        for module in (litellm, dispatch, main):
            assert not hasattr(module.__dict__["completion"], "_self_wrapper")
        assert litellm.completion is dispatch.completion
    finally:
        instrumentor.instrument()
    assert hasattr(litellm.__dict__["completion"], "_self_wrapper")


# -- importing and calling litellm sends nothing but the calls ----------------------


def test_litellm_sends_nothing_but_the_calls(instrumented: LiteLLMInstrumentor) -> None:
    """Nothing leaves the loopback from litellm's import to the end of one more
    call (this module's calls included when watched here): watched in this
    process when this module's fixture imported litellm, else in a fresh one."""
    if not _IMPORTED_HERE:
        _in_a_fresh_process()
        return
    _one_call()
    assert _OUTSIDE.on  # watching since the import
    assert _OUTSIDE.seen == []


def _one_call() -> None:
    with FakeLLMServer() as server, ExecutionContext(ExecutionConfig(max_cost_usd=1.0)):
        litellm.completion(**_args(server, "anthropic"))
        assert server.count("/v1/messages") == 1


_FRESH = """
import sys
from tests.integration import test_litellm_instrumentor as here
sys.addaudithook(here._OUTSIDE)
here._OUTSIDE.on = True
import litellm
from veronica_otel.instrumentors.litellm import LiteLLMInstrumentor
here.litellm = litellm
LiteLLMInstrumentor().instrument()
here._one_call()
print("OUTSIDE", here._OUTSIDE.seen)
"""


def _in_a_fresh_process() -> None:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(
        [sys.executable, "-c", _FRESH],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).parents[2],  # the checkout: ``tests`` importable
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "OUTSIDE []" in done.stdout, done.stdout[-2000:]


def test_the_tested_range_covers_the_installed_litellm() -> None:
    assert version("litellm").startswith("1.110.")
