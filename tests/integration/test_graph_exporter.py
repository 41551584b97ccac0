"""ExecutionGraphExporter: real chains through the SDK become graph files per chain.

The main chain runs through the real ``openai`` SDK against the embedded fake
server, with a sub-agent ping-pong, a repeated tool and a denied call; other
tests feed spans from a private tracer provider to check grouping, age-out,
bounded memory and the exporter contract.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

from tests._clock import FakeClock
from tests.integration._span_sink import attached
from veronica_otel import (
    BudgetExceededError,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    contained_tool,
)
from veronica_otel.exporters import (
    ExecutionGraphExporter,
    GraphDict,
    load_graph,
    render_text_tree,
)
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer

MODEL = "gpt-4o-mini"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Plan the trip."}]
EVIL = '<script>alert("x")</script>'
TOOL = {"gen_ai.operation.name": "execute_tool"}


@contained_tool
def search(query: str) -> str:
    return f"results for {query}"


# -- fixtures -----------------------------------------------------------------


@pytest.fixture
def instrumented() -> Iterator[OpenAIInstrumentor]:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    yield instrumentor
    instrumentor.uninstrument()


@pytest.fixture
def client(instrumented: OpenAIInstrumentor) -> Iterator[openai.OpenAI]:
    with (
        FakeLLMServer(output_tokens=5) as server,
        openai.OpenAI(base_url=server.openai_base_url, api_key="test", max_retries=0) as oai,
    ):
        yield oai


@pytest.fixture
def graph_dir(tmp_path: Path) -> Path:
    return tmp_path / "graphs"


@pytest.fixture
def graph_exporter(
    tracer_provider: TracerProvider, graph_dir: Path
) -> Iterator[ExecutionGraphExporter]:
    """The exporter on the session provider, for this test only."""
    exporter = ExecutionGraphExporter(graph_dir)
    with attached(tracer_provider, SimpleSpanProcessor(exporter)):
        yield exporter


def private_tracer(exporter: ExecutionGraphExporter) -> trace.Tracer:
    """A tracer of its own provider: hand-made spans, nothing global."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test")


def finished_span(name: str, attributes: dict[str, str]) -> ReadableSpan:
    provider = TracerProvider()
    span = provider.get_tracer("test").start_span(name, attributes=attributes)
    span.end()
    assert isinstance(span, ReadableSpan)
    return span


def read(path: Path) -> GraphDict:
    graph: GraphDict = json.loads(path.read_text(encoding="utf-8"))
    return graph


# -- a real chain ---------------------------------------------------------------


def run_chain(client: openai.OpenAI) -> ExecutionContext:
    """A planner: a call, a tool thrice, a user span, two sub-agents ping-ponging, a trip."""
    tracer = trace.get_tracer("test")
    with ExecutionContext(ExecutionConfig(max_steps=9, max_cost_usd=1.0), name="planner") as ctx:
        client.chat.completions.create(model=MODEL, messages=MESSAGES)
        for _ in range(3):
            search("same query")
        with tracer.start_as_current_span(EVIL):
            pass
        ctx.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.001))
        for _ in range(2):
            for name in ("critic", "writer"):
                with ctx.spawn_child(name=name):
                    client.chat.completions.create(model=MODEL, messages=MESSAGES)
        with pytest.raises(BudgetExceededError):
            client.chat.completions.create(model=MODEL, messages=MESSAGES)
    return ctx


def test_a_chain_becomes_one_graph_file(
    graph_exporter: ExecutionGraphExporter, graph_dir: Path, client: openai.OpenAI
) -> None:
    ctx = run_chain(client)
    assert sorted(p.name for p in graph_dir.iterdir()) == [
        f"{ctx.chain_id}.html",
        f"{ctx.chain_id}.json",
    ]
    graph = read(graph_dir / f"{ctx.chain_id}.json")
    assert graph["chain_id"] == ctx.chain_id
    assert graph["complete"] is True
    assert len(graph["trace_ids"]) == 1
    nodes = {node["id"]: node for node in graph["nodes"]}
    (root_id,) = graph["roots"]
    root = nodes[root_id]
    assert (root["kind"], root["name"], root["parent"]) == (
        "agent",
        "invoke_workflow planner",
        None,
    )
    assert root["decision"] == "HALT"
    assert root["trip"] is not None and root["trip"]["reason"] == "steps"
    children = [nodes[c] for c in root["children"]]
    assert [(n["kind"], n["name"]) for n in children] == [
        ("llm", f"chat {MODEL}"),
        ("tool", "execute_tool search"),
        ("tool", "execute_tool search"),
        ("tool", "execute_tool search"),
        ("other", EVIL),
        ("agent", "invoke_agent critic"),
        ("agent", "invoke_agent writer"),
        ("agent", "invoke_agent critic"),
        ("agent", "invoke_agent writer"),
        ("llm", f"chat {MODEL}"),
    ]
    assert [n["depth"] for n in graph["nodes"]][:2] == [0, 1]
    # Sub-agents: one call each, with usage and cost; their chain ids are root.N.
    for agent in children[5:9]:
        assert agent["chain_id"] is not None and agent["chain_id"].startswith(f"{ctx.chain_id}.")
        (call_id,) = agent["children"]
        call = nodes[call_id]
        assert call["kind"] == "llm" and call["model"] == MODEL
        assert call["output_tokens"] == 5 and call["input_tokens"] is not None
        assert call["cost_usd"] is not None and call["cost_usd"] > 0
        assert agent["cost_usd"] == pytest.approx(call["cost_usd"])
        assert call["decision"] == "ALLOW" and call["status"] != "error"
    # The denied call: never sent, its trip recorded, in error.
    denied = children[-1]
    assert denied["decision"] == "HALT" and denied["status"] == "error"
    assert denied["trip"] == {
        "reason": "steps",
        "limit": 9.0,
        "observed": 10.0,
        "pool": None,  # the chain's own limit: no pool, no agent
        "agent": None,
    }
    assert denied["output_tokens"] is None
    # Totals: the chain's own ledger total (the wrapped call has no span, but costs).
    totals = graph["totals"]
    snapshot = ctx.snapshot()
    assert totals["cost_usd"] == pytest.approx(snapshot.cost_usd)
    calls_cost = sum(n["cost_usd"] or 0 for n in graph["nodes"] if n["kind"] == "llm")
    assert totals["cost_usd"] == pytest.approx(calls_cost + 0.001)
    assert totals["llm_calls"] == 6 and totals["tool_calls"] == 3
    # Two agents (critic, writer) took four turns; the workflow span is the chain itself.
    assert (totals["agents"], totals["agent_names"], totals["agent_turns"]) == (
        2,
        ["critic", "writer"],
        4,
    )
    # Steps are the chain's count: 5 calls and 3 tools sent, and the wrapped call (no span).
    assert totals["steps"] == snapshot.steps == 9
    assert (totals["llm_sent"], totals["tools_sent"], totals["other_steps"]) == (5, 3, 1)
    assert totals["tokens"] == snapshot.tokens
    assert totals["tokens"] == totals["input_tokens"] + totals["output_tokens"]
    assert totals["calls_without_usage"] == 0
    assert totals["denied_calls"] == 1 and totals["trip_reasons"] == ["steps"]
    assert totals["output_tokens"] == 25
    # Loops: the tool repeated under the planner, and critic/writer ping-ponging.
    loops = {loop["type"]: loop for loop in graph["loops"]}
    assert set(loops) == {"repeated_signature", "ping_pong"}
    assert loops["repeated_signature"]["nodes"] == [c["id"] for c in children[1:4]]
    assert loops["repeated_signature"]["parent"] == root_id
    assert loops["repeated_signature"]["exact"] is False  # tool inputs are not recorded
    assert loops["ping_pong"]["nodes"] == [c["id"] for c in children[5:9]]
    assert loops["ping_pong"]["count"] == 4
    # The badge marks the repeats only: the first critic and writer began the loop.
    marked = [bool(nodes[i]["loops"]) for i in loops["ping_pong"]["nodes"]]
    assert marked == [False, False, True, True]
    assert [bool(c["loops"]) for c in children[1:4]] == [False, True, True]


def test_html_view_is_self_contained_escaped_and_shows_trips_in_red(
    graph_exporter: ExecutionGraphExporter, graph_dir: Path, client: openai.OpenAI
) -> None:
    ctx = run_chain(client)
    page = (graph_dir / f"{ctx.chain_id}.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"https?://", page, re.IGNORECASE)
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|@import|url\(", page, re.IGNORECASE)
    # The span named like a script is text, not markup.
    assert EVIL not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert page.count("<script>") == 1  # our own inline script only
    # Trips are red: the denied call's row has the trip class, which CSS paints red.
    assert "--trip: #c62828" in page and "tr.trip td { color: var(--trip); }" in page
    trip_rows = re.findall(r'<tr class="node kind-(\w+) trip[^"]*"', page)
    assert sorted(trip_rows) == ["agent", "llm"]
    assert "trip: steps (limit 9, observed 10)" in page
    # Loops are listed and flagged; costs are shown per node.
    assert "alternate 4 times" in page and "repeated 3 times" in page
    assert page.count('class="node kind-agent loop"') == 2  # the repeats, not the first pair
    # Every badge is explained, and the totals say what the trace holds.
    keys = " | ".join(re.sub(r"<[^>]+>", "", k) for k in re.findall(r"<dt>(.*?)</dt>", page))
    for key in ("complete", "partial", "agent", "llm", "tool", "other", "HALT", "trip", "loop"):
        assert key in keys, key
    assert '<tr data-total="steps"><th>steps</th><td>9 = 5 LLM calls + 3 tool calls + 1 ' in page
    assert "2 (critic, writer; 4 turns)" in page
    assert f"${ctx.snapshot().cost_usd:.4f}" in page


def test_graph_file_reads_back_as_a_terminal_tree(
    graph_exporter: ExecutionGraphExporter, graph_dir: Path, client: openai.OpenAI
) -> None:
    ctx = run_chain(client)
    graph = load_graph(graph_dir / f"{ctx.chain_id}.json")
    assert graph == read(graph_dir / f"{ctx.chain_id}.json")
    text = render_text_tree(graph)
    lines = text.splitlines()
    assert lines[0].startswith(f"chain {ctx.chain_id} (complete)")
    assert lines[1].startswith("  tokens ") and "in /" in lines[1]
    assert lines[2].startswith("  steps 9 = 5 LLM calls + 3 tool calls + 1 without a span")
    assert "agents 2 (critic, writer; 4 turns)" in lines[3]
    assert lines[4].startswith("invoke_workflow planner  [agent]")
    assert lines[-2].startswith("  2. agents 'critic' and 'writer' alternate 4 times")
    assert lines[-1].startswith("legend: ") and "LOOP n a repeat" in lines[-1]
    assert any(line.startswith("│  └─ chat gpt-4o-mini") for line in lines)
    assert any(line.startswith("└─ chat gpt-4o-mini") and "TRIP steps" in line for line in lines)


# -- grouping -------------------------------------------------------------------


def test_spans_group_by_root_chain_and_unmarked_spans_join_their_trace(
    graph_exporter: ExecutionGraphExporter, graph_dir: Path
) -> None:
    tracer = trace.get_tracer("test")
    with ExecutionContext(name="outer") as ctx:
        with tracer.start_as_current_span("my step"):  # no veronica.chain.id
            pass
        with ctx.spawn_child(name="inner") as child, child.spawn_child(name="deeper"):
            pass
    assert [p.name for p in graph_dir.glob("*.json")] == [f"{ctx.chain_id}.json"]
    graph = read(graph_dir / f"{ctx.chain_id}.json")
    names = [(n["depth"], n["name"]) for n in graph["nodes"]]
    assert names == [
        (0, "invoke_workflow outer"),
        (1, "my step"),
        (1, "invoke_agent inner"),
        (2, "invoke_agent deeper"),
    ]


def test_a_host_span_completes_the_chains_of_its_trace(tmp_path: Path) -> None:
    exporter = ExecutionGraphExporter(tmp_path)
    tracer = private_tracer(exporter)
    with tracer.start_as_current_span("POST /run"):
        call = {"veronica.chain.id": "req1", "gen_ai.operation.name": "chat"}
        with tracer.start_as_current_span("chat m", attributes=call):
            pass
        assert exporter.held_chains == 1
    graph = read(tmp_path / "req1.json")
    assert graph["complete"] is True
    assert [(n["depth"], n["kind"], n["name"]) for n in graph["nodes"]] == [
        (0, "other", "POST /run"),
        (1, "llm", "chat m"),
    ]
    # A trace with no chain in it is not a chain: held, then dropped unwritten.
    with tracer.start_as_current_span("GET /health"), tracer.start_as_current_span("db"):
        pass
    assert exporter.held_chains == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["req1.html", "req1.json"]


def test_spans_after_a_chain_was_written_are_merged_into_its_files(tmp_path: Path) -> None:
    exporter = ExecutionGraphExporter(tmp_path)
    tracer = private_tracer(exporter)
    attrs = {"veronica.chain.id": "c1", "gen_ai.operation.name": "invoke_workflow"}
    with tracer.start_as_current_span("invoke_workflow c", attributes=attrs):
        pass
    assert len(read(tmp_path / "c1.json")["nodes"]) == 1
    # A thread the chain started outlives its root span.
    with tracer.start_as_current_span("execute_tool late", attributes={"veronica.chain.id": "c1"}):
        pass
    assert exporter.force_flush() is True
    graph = read(tmp_path / "c1.json")
    assert [n["name"] for n in graph["nodes"]] == ["invoke_workflow c", "execute_tool late"]
    assert graph["complete"] is True


def test_chains_whose_root_never_ends_age_out_as_partial_graphs(tmp_path: Path) -> None:
    clock = FakeClock(1000.0)
    exporter = ExecutionGraphExporter(tmp_path, max_age_s=60, clock=clock)
    tracer = private_tracer(exporter)
    with tracer.start_as_current_span("execute_tool a", attributes={"veronica.chain.id": "a"}):
        pass
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
    clock.now += 60
    with tracer.start_as_current_span("execute_tool b", attributes={"veronica.chain.id": "b"}):
        pass
    graph = read(tmp_path / "a.json")
    assert graph["complete"] is False and len(graph["nodes"]) == 1
    assert (tmp_path / "a.html").exists() and not (tmp_path / "b.json").exists()
    assert exporter.held_chains == 1
    with tracer.start_as_current_span("execute_tool a2", attributes={"veronica.chain.id": "a"}):
        pass
    assert exporter.force_flush() is True
    assert [n["name"] for n in read(tmp_path / "a.json")["nodes"]] == [
        "execute_tool a",
        "execute_tool a2",
    ]
    assert read(tmp_path / "b.json")["complete"] is False
    assert exporter.held_chains == 0


# -- bounded memory -------------------------------------------------------------


def test_memory_is_bounded_by_max_chains(tmp_path: Path) -> None:
    exporter = ExecutionGraphExporter(tmp_path, max_chains=100)
    tracer = private_tracer(exporter)
    for i in range(10_000):  # 10k chains whose roots never end
        with tracer.start_as_current_span(
            "execute_tool t", attributes={"veronica.chain.id": f"c{i}"}
        ):
            pass
        assert exporter.held_chains <= 100
    assert exporter.held_chains == 100
    assert exporter.evicted_chains == 9_900
    assert exporter.force_flush() is True
    written = sorted(int(p.stem[1:]) for p in tmp_path.glob("*.json"))
    assert written == list(range(9_900, 10_000))  # the newest were kept
    # A chain let go recently and seen again says what it lost.
    attrs = {"veronica.chain.id": "c9899"}
    with tracer.start_as_current_span("execute_tool t", attributes=attrs):
        pass
    exporter.force_flush()
    assert read(tmp_path / "c9899.json")["dropped_spans"] == 1


def test_spans_held_in_all_are_bounded_by_max_spans(tmp_path: Path) -> None:
    exporter = ExecutionGraphExporter(tmp_path, max_spans=100)
    tracer = private_tracer(exporter)
    for i in range(20):
        for _ in range(30):
            with tracer.start_as_current_span(
                "execute_tool t", attributes={"veronica.chain.id": f"c{i}"}
            ):
                pass
            assert exporter.held_spans <= 100
    assert exporter.held_chains == 3 and exporter.held_spans == 90
    assert exporter.evicted_chains == 17
    exporter.shutdown()
    assert exporter.held_spans == 0
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [f"c{i}.json" for i in range(17, 20)]


def test_spans_per_chain_are_capped_but_the_root_is_kept(tmp_path: Path) -> None:
    exporter = ExecutionGraphExporter(tmp_path, max_spans_per_chain=10)
    tracer = private_tracer(exporter)
    attrs = {"veronica.chain.id": "big", "gen_ai.operation.name": "invoke_workflow"}
    with tracer.start_as_current_span("invoke_workflow big", attributes=attrs):
        for _ in range(50):
            with tracer.start_as_current_span("execute_tool t", attributes={**TOOL, **attrs}):
                pass
    graph = read(tmp_path / "big.json")
    assert graph["complete"] is True
    assert len(graph["nodes"]) == 11 and graph["dropped_spans"] == 40
    assert graph["nodes"][0]["name"] == "invoke_workflow big"


def test_concurrent_exports_from_many_threads(tmp_path: Path) -> None:
    exporter = ExecutionGraphExporter(tmp_path)
    tracer = private_tracer(exporter)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(50):
                attrs = {
                    "veronica.chain.id": f"t{n}-{i}",
                    "gen_ai.operation.name": "invoke_workflow",
                }
                with tracer.start_as_current_span("invoke_workflow w", attributes=attrs):
                    for _ in range(2):
                        child = {"veronica.chain.id": f"t{n}-{i}.1", **TOOL}
                        with tracer.start_as_current_span("execute_tool x", attributes=child):
                            pass
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 400
    assert all(read(f)["complete"] and len(read(f)["nodes"]) == 3 for f in files)
    assert exporter.held_chains == 0
    assert not list(tmp_path.glob(".*.tmp"))


# -- the exporter contract --------------------------------------------------------


def test_force_flush_and_shutdown_contract(tmp_path: Path) -> None:
    exporter = ExecutionGraphExporter(tmp_path)
    assert exporter.force_flush() is True  # nothing held
    span = finished_span("execute_tool t", {"veronica.chain.id": "open"})
    assert exporter.export([span]) is SpanExportResult.SUCCESS
    assert exporter.force_flush(timeout_millis=-1) is False  # out of time: kept
    assert exporter.held_chains == 1
    assert exporter.force_flush(timeout_millis=10_000) is True
    assert read(tmp_path / "open.json")["complete"] is False
    assert exporter.export([finished_span("execute_tool t", {"veronica.chain.id": "last"})]) is (
        SpanExportResult.SUCCESS
    )
    exporter.shutdown()
    assert (tmp_path / "last.json").exists()  # shutdown writes what is held
    assert exporter.export([span]) is SpanExportResult.FAILURE
    exporter.shutdown()  # idempotent


def test_failures_are_logged_never_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    exporter = ExecutionGraphExporter(blocker)
    attrs = {"veronica.chain.id": "c", "gen_ai.operation.name": "invoke_workflow"}
    with caplog.at_level(logging.ERROR, logger="veronica_otel.exporters.graph"):
        assert exporter.export([finished_span("invoke_workflow c", attrs)]) is (
            SpanExportResult.FAILURE
        )
        assert exporter.export([object()]) is SpanExportResult.FAILURE  # type: ignore[list-item]
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 2
    assert exporter.held_chains == 0


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"max_chains": 0}, "max_chains"),
        ({"max_chains": True}, "max_chains"),
        ({"max_spans_per_chain": 1.5}, "max_spans_per_chain"),
        ({"max_age_s": 0}, "max_age_s"),
        ({"max_age_s": float("nan")}, "max_age_s"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        ExecutionGraphExporter("x", **kwargs)  # type: ignore[arg-type]


def test_entry_point_reads_its_directory_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (ep,) = entry_points(group="opentelemetry_traces_exporter", name="veronica_graph")
    assert ep.load() is ExecutionGraphExporter
    monkeypatch.setenv("VERONICA_GRAPH_DIR", str(tmp_path / "env"))
    exporter = ExecutionGraphExporter()  # what the SDK configurator does
    assert exporter.output_dir == tmp_path / "env"
    monkeypatch.delenv("VERONICA_GRAPH_DIR")
    assert ExecutionGraphExporter().output_dir == Path("veronica-graph")
