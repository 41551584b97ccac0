"""MCP tool calls contained in the chain, with the real ``mcp`` SDK, client and server.

The servers are real ``MCPServer`` instances whose tools count how often
they really ran: that count is the ground truth of what was sent. Most tests
connect in memory (the SDK's own test transport); one runs a server script
as a subprocess over stdio.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from opentelemetry import baggage
from opentelemetry import context as otel_context
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tests._clock import FakeClock, patch_chain_clock
from veronica_otel import (
    BudgetExceededError,
    CircuitBreaker,
    ExecutionConfig,
    ExecutionContext,
    set_tool_prices,
)
from veronica_otel.instrumentors._breakers import configure_endpoint_breakers
from veronica_otel.instrumentors.mcp import MCPInstrumentor

if TYPE_CHECKING:
    from mcp import Client

    from tests.integration._mcp_counting import CountingServer

COUNTER_SERVER = Path(__file__).parent / "apps" / "mcp_counter_server.py"


# -- fixtures ------------------------------------------------------------------------


@pytest.fixture
def instrumentor() -> Iterator[MCPInstrumentor]:
    instrumentor = MCPInstrumentor()
    instrumentor.instrument()
    yield instrumentor
    instrumentor.uninstrument()


@pytest.fixture
def counting() -> CountingServer:
    from tests.integration._mcp_counting import CountingServer

    return CountingServer()


@pytest.fixture(autouse=True)
def _no_tool_prices() -> Iterator[None]:
    yield
    set_tool_prices(None)


@pytest.fixture
def breaker_clock() -> Iterator[FakeClock]:
    """Tool breakers that open after 2 failures, for 30 s of this clock."""
    fake = FakeClock()
    configure_endpoint_breakers(lambda provider, tool: CircuitBreaker(2, 30.0, clock=fake))
    yield fake
    configure_endpoint_breakers(None)


@pytest.fixture
def chain_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock(time.monotonic())  # the kernel's deadline timer thread reads the real one
    patch_chain_clock(monkeypatch, fake)
    return fake


def connect(counting: CountingServer) -> Client:
    """A client to ``counting`` over the SDK's in-memory transport."""
    from mcp import Client
    from mcp.client._memory import InMemoryTransport

    return Client(InMemoryTransport(counting.server))


async def search(client: Client, query: str, **extra: Any) -> str:
    result = await client.call_tool("search", {"query": query, **extra})
    assert not result.is_error
    return str(result.structured_content["result"])


async def denied(reason: str, client: Client, tool: str, arguments: dict[str, Any]) -> None:
    with pytest.raises(BudgetExceededError) as info:
        await client.call_tool(tool, arguments)
    assert info.value.reason == reason


def tool_spans(exporter: InMemorySpanExporter, name: str = "search") -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name == f"execute_tool {name}"]


# -- limits, checked before the request leaves ---------------------------------------


@pytest.mark.asyncio
async def test_steps_ceiling_stops_the_call_before_the_server_sees_it(
    instrumentor: MCPInstrumentor, counting: CountingServer
) -> None:
    async with connect(counting) as client:
        with ExecutionContext(ExecutionConfig(max_steps=3)) as ctx:
            for query in ("a", "b", "c"):
                await search(client, query)
            await denied("steps", client, "search", {"query": "d"})
        assert counting.runs["search"] == 3
        assert ctx.snapshot().steps == 3


@pytest.mark.asyncio
async def test_same_tool_and_arguments_trip_loop_other_arguments_do_not(
    instrumentor: MCPInstrumentor, counting: CountingServer
) -> None:
    async with connect(counting) as client:
        with ExecutionContext(ExecutionConfig(max_repeats=2)):
            await search(client, "cats", limit=3)
            # The same call, its keys in another order:
            await client.call_tool("search", {"limit": 3, "query": "cats"})
            await search(client, "dogs", limit=3)  # other arguments: not a repeat
            await search(client, "cats", limit=4)
            await denied("loop", client, "search", {"query": "cats", "limit": 3})
        assert counting.runs["search"] == 4


async def fail(client: Client, tool: str) -> None:
    """Call a failing tool: ``broken`` returns an error result, ``unavailable`` raises."""
    from mcp.shared.exceptions import MCPError

    if tool == "broken":
        assert (await client.call_tool(tool, {})).is_error  # returned as it came
        return
    with pytest.raises(MCPError) as info:
        await client.call_tool(tool, {})
    assert type(info.value) is MCPError  # re-raised unchanged
    assert info.value.error.message == "service unavailable"


@pytest.mark.asyncio
@pytest.mark.parametrize("tool", ["broken", "unavailable"], ids=["error-result", "raised"])
async def test_failing_tool_opens_its_breaker_which_denies_without_sending(
    instrumentor: MCPInstrumentor, counting: CountingServer, breaker_clock: FakeClock, tool: str
) -> None:
    async with connect(counting) as client:
        with ExecutionContext(ExecutionConfig(max_steps=100)):
            for _ in range(2):
                await fail(client, tool)
            await denied("circuit_open", client, tool, {})
            assert counting.runs[tool] == 2
            await search(client, "still fine")  # one tool failing does not close the others
            breaker_clock.advance(30)  # the recovery time is over: one probe goes out
            await fail(client, tool)
            await denied("circuit_open", client, tool, {})  # the probe failed: open again
        assert counting.runs[tool] == 3


@pytest.mark.asyncio
async def test_priced_tool_trips_cost(
    instrumentor: MCPInstrumentor, counting: CountingServer
) -> None:
    async with connect(counting) as client:
        set_tool_prices({"search": 0.4})
        with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
            await search(client, "a")
            await search(client, "b")
            await denied("cost", client, "search", {"query": "c"})
        assert counting.runs["search"] == 2
        assert ctx.snapshot().cost_usd == pytest.approx(0.8)


@pytest.mark.asyncio
async def test_deadline_stops_later_calls(
    instrumentor: MCPInstrumentor, counting: CountingServer, chain_clock: FakeClock
) -> None:
    async with connect(counting) as client:
        with ExecutionContext(ExecutionConfig(timeout_ms=60_000)):
            await search(client, "a")
            chain_clock.advance(61)
            await denied("timeout", client, "search", {"query": "b"})
        assert counting.runs["search"] == 1


@pytest.mark.asyncio
async def test_concurrent_tasks_share_one_chain(
    instrumentor: MCPInstrumentor, counting: CountingServer
) -> None:
    async with connect(counting) as client:

        async def attempt(i: int) -> bool:
            try:
                await search(client, f"q{i}")
            except BudgetExceededError:
                return False
            return True

        with ExecutionContext(ExecutionConfig(max_steps=5)) as ctx:
            outcomes = await asyncio.gather(*(attempt(i) for i in range(12)))
        assert outcomes.count(True) == 5
        assert counting.runs["search"] == 5
        assert ctx.snapshot().steps == 5


# -- spans -----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_each_call_is_an_execute_tool_span_over_the_sdks_own(
    instrumentor: MCPInstrumentor, counting: CountingServer, span_exporter: InMemorySpanExporter
) -> None:
    async with connect(counting) as client:
        with ExecutionContext(ExecutionConfig(max_steps=2)) as ctx:
            await search(client, "a")
            assert (await client.call_tool("broken", {})).is_error
            await denied("steps", client, "search", {"query": "b"})
        allowed, halted = tool_spans(span_exporter)
        expected = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "search",
            "gen_ai.system": "mcp",
            "mcp.method.name": "tools/call",
            "veronica.chain.id": ctx.chain_id,
        }
        assert expected.items() <= dict(allowed.attributes or {}).items()
        assert allowed.attributes["veronica.decision"] == "ALLOW"
        assert allowed.status.status_code is not StatusCode.ERROR
        # The SDK's own client span for the request is a child of ours.
        (sent,) = [
            s for s in span_exporter.get_finished_spans() if s.name == "MCP send tools/call search"
        ]
        assert sent.parent is not None
        assert sent.parent.span_id == allowed.context.span_id
        (failed,) = tool_spans(span_exporter, "broken")
        assert failed.status.status_code is StatusCode.ERROR
        assert failed.attributes["error.type"] == "tool_error"
        assert "the backend is down" in (failed.status.description or "")
        assert halted.attributes["veronica.decision"] == "HALT"
        assert halted.attributes["veronica.trip.reason"] == "steps"
        assert [e.name for e in halted.events] == ["veronica.trip"]


@pytest.mark.asyncio
async def test_suppressed_instrumentation_records_no_span_but_still_contains(
    instrumentor: MCPInstrumentor, counting: CountingServer, span_exporter: InMemorySpanExporter
) -> None:
    async with connect(counting) as client:
        with ExecutionContext(ExecutionConfig(max_steps=1)), suppress_instrumentation():
            await search(client, "a")
            await denied("steps", client, "search", {"query": "b"})
        assert counting.runs["search"] == 1
        assert tool_spans(span_exporter) == []


@pytest.mark.asyncio
async def test_chain_baggage_does_not_reach_the_server(
    instrumentor: MCPInstrumentor, counting: CountingServer
) -> None:
    async with connect(counting) as client:
        chain_only = baggage.set_baggage("veronica.chain", "secret-chain")
        token = otel_context.attach(baggage.set_baggage("team", "search", chain_only))
        try:
            with ExecutionContext(ExecutionConfig(max_steps=5)):
                await client.call_tool("whoami", {})
            await client.call_tool("whoami", {})  # no chain: not ours to touch
        finally:
            otel_context.detach(token)
        contained, untouched = counting.metas
        assert contained.get("baggage") == "team=search"
        assert "veronica.chain=secret-chain" in untouched.get("baggage", "")


# -- no chain, instrument and uninstrument ---------------------------------------------


@pytest.mark.asyncio
async def test_without_a_chain_calls_pass_through_untouched(
    instrumentor: MCPInstrumentor, counting: CountingServer, span_exporter: InMemorySpanExporter
) -> None:
    async with connect(counting) as client:
        for _ in range(3):
            assert await search(client, "same") == "5 results for same"
        assert (await client.call_tool("broken", {})).is_error
        assert counting.runs == {"search": 3, "broken": 1}
        assert tool_spans(span_exporter) == []


@pytest.mark.asyncio
async def test_uninstrument_restores_the_original_and_checks_stop(counting: CountingServer) -> None:
    from mcp import Client
    from mcp.client._memory import InMemoryTransport
    from mcp.client.session import ClientSession

    original = ClientSession.__dict__["call_tool"]
    assert not hasattr(original, "__wrapped__")  # the SDK's own, no test left a wrapper
    instrumentor = MCPInstrumentor()
    assert tuple(instrumentor.instrumentation_dependencies()) == ("mcp >= 2.0, < 3",)
    instrumentor.instrument()
    instrumentor.instrument()  # idempotent: one wrapper
    assert ClientSession.__dict__["call_tool"].__wrapped__ is original
    instrumentor.uninstrument()
    instrumentor.uninstrument()
    assert ClientSession.__dict__["call_tool"] is original
    async with Client(InMemoryTransport(counting.server)) as mcp_client:
        with ExecutionContext(ExecutionConfig(max_steps=1, max_repeats=1)) as ctx:
            for _ in range(3):
                await search(mcp_client, "same")
    assert counting.runs["search"] == 3
    assert ctx.snapshot().steps == 0


# -- a real subprocess over stdio --------------------------------------------------------


@pytest.mark.asyncio
async def test_stdio_server_subprocess_is_contained(instrumentor: MCPInstrumentor) -> None:
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=[str(COUNTER_SERVER)])
    async with Client(params) as mcp_client:
        with ExecutionContext(ExecutionConfig(max_repeats=1)):
            await search(mcp_client, "cats")
            await denied("loop", mcp_client, "search", {"query": "cats"})
        with ExecutionContext(ExecutionConfig(max_steps=2)) as ctx:
            assert (await mcp_client.call_tool("broken", {})).is_error
            await search(mcp_client, "dogs")
            await denied("steps", mcp_client, "search", {"query": "birds"})
        ran = await mcp_client.call_tool("ran", {})  # outside the chain: not counted
    assert ran.structured_content == {"search": 2, "broken": 1}
    assert ctx.snapshot().steps == 2


# -- a framework's tool run backed by an MCP tool: one step, not two (G13) -----------


@pytest.mark.asyncio
async def test_a_framework_tool_run_backed_by_mcp_counts_once(
    instrumentor: MCPInstrumentor, counting: CountingServer
) -> None:
    from veronica_otel.instrumentors._framework import as_tool_async

    async with connect(counting) as client, ExecutionContext(ExecutionConfig(max_steps=3)) as ctx:

        async def run(*queries: str) -> None:  # a framework tool whose body calls MCP
            async def body() -> None:
                for query in queries:
                    await search(client, query)

            await as_tool_async("fw", "search", {"queries": queries}, body)

        await run("a")
        assert ctx.snapshot().steps == 1  # its MCP call joined the run
        await run("b", "c")
        assert ctx.snapshot().steps == 3  # a second MCP call in one run is a step of its own
        with pytest.raises(BudgetExceededError):
            await run("d")
    assert counting.runs["search"] == 3
