"""Execution graphs in a real Jaeger, read back through its query API.

Jaeger v2 (built from source once, :mod:`veronica_otel.testing.jaeger`) runs
in memory on loopback; a second process of the same binary, configured as a
plain Collector, forwards to it. The apps export over OTLP (HTTP and gRPC)
from fresh venvs built as users build them (:mod:`tests._venvs`): the
standard recipe, and ``examples/jaeger``'s own install line. Every check
reads what Jaeger stored (``/api/v3/traces``), never our own files, except
where the graph file is the thing compared against.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan

from tests.e2e.test_cli import cli
from tests.e2e.test_real_installs import _venv
from tests.e2e.test_two_services import run_client_a, start_service_b, stop
from veronica_otel.exporters.graph import load_graph
from veronica_otel.exporters.jaeger_query import JaegerQuery, graphs_from_spans
from veronica_otel.testing import FakeLLMServer
from veronica_otel.testing.jaeger import (
    ENV_BINARY,
    JaegerProcess,
    JaegerUnavailable,
    find_go,
    jaeger_binary,
    jaeger_cache,
)

ROOT = Path(__file__).resolve().parents[2]
APPS = Path(__file__).parent / "apps"
EXAMPLE = ROOT / "examples" / "jaeger" / "agent.py"
PROTOCOLS = ("http/protobuf", "grpc")
SETTLE_S = 30.0
TIMEOUT = 120


@pytest.fixture(scope="module")
def binary() -> Path:
    built = os.environ.get(ENV_BINARY) or (jaeger_cache() / "jaeger").is_file()
    if find_go() is None and not built:
        pytest.skip("no Go toolchain here to build Jaeger")
    try:
        return jaeger_binary(progress=sys.stderr)
    except JaegerUnavailable as exc:
        pytest.fail(f"Jaeger could not be built: {exc}")


@pytest.fixture(scope="module")
def jaeger(binary: Path) -> Iterator[JaegerProcess]:
    with JaegerProcess(binary) as process:
        yield process


@pytest.fixture(scope="module")
def collector(binary: Path, jaeger: JaegerProcess) -> Iterator[JaegerProcess]:
    """A separate Collector in front of Jaeger: OTLP in, OTLP/gRPC on to Jaeger."""
    with JaegerProcess(binary, forward_to=jaeger.otlp_grpc_address) as process:
        yield process


@pytest.fixture(scope="module")
def recipe() -> Path:
    return _venv("RECIPE")


@pytest.fixture(scope="module")
def example_venv() -> Path:
    return _venv("JAEGER_EXAMPLE")


@pytest.fixture(scope="module")
def planner_critic_runs(
    recipe: Path, jaeger: JaegerProcess, collector: JaegerProcess
) -> dict[tuple[str, str], dict[str, Any]]:
    """The demo chain sent once per protocol straight to Jaeger ("direct") and
    through the Collector ("forwarded"): each run's report."""
    targets = {"direct": jaeger, "forwarded": collector}
    keys = [(route, protocol) for route in targets for protocol in PROTOCOLS]
    runs = [
        otlp_env(targets[route], protocol, f"planner-critic-{protocol}") for route, protocol in keys
    ]
    return dict(zip(keys, run_planner_critic(recipe, runs), strict=True))


@pytest.fixture(scope="module")
def demo_runs(
    planner_critic_runs: dict[tuple[str, str], dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """The demo chain sent straight to Jaeger once per protocol (its report)."""
    return {protocol: planner_critic_runs["direct", protocol] for protocol in PROTOCOLS}


@pytest.fixture(scope="module")
def forwarded_runs(
    planner_critic_runs: dict[tuple[str, str], dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """The demo chain sent through the Collector once per protocol (its report)."""
    return {protocol: planner_critic_runs["forwarded", protocol] for protocol in PROTOCOLS}


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=20) as server:
        yield server


def otlp_env(target: JaegerProcess, protocol: str, service: str) -> dict[str, str]:
    endpoint = target.otlp_grpc_url if protocol == "grpc" else target.otlp_http_url
    return {
        "OTEL_SERVICE_NAME": service,
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("VERONICA_", "OTEL_", "OPENAI_", "PYTHONPATH"))
    }
    env.update(extra)
    return env


def settled(fetch: Callable[[], list[ReadableSpan]], at_least: int = 1) -> list[ReadableSpan]:
    """What Jaeger holds once at least ``at_least`` spans arrived and the count stopped moving."""
    deadline = time.monotonic() + SETTLE_S
    last: list[ReadableSpan] = []
    while True:  # bounded poll: batches reach storage a little after the app exits
        spans = fetch()
        if len(spans) >= at_least and len(spans) == len(last):
            return spans
        if time.monotonic() > deadline:
            raise AssertionError(f"Jaeger holds {len(spans)} spans, expected {at_least} or more")
        last = spans
        time.sleep(0.25)


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def service_of(span: ReadableSpan) -> object:
    return span.resource.attributes.get("service.name")


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def children_of(spans: list[ReadableSpan]) -> dict[int, list[ReadableSpan]]:
    found: dict[int, list[ReadableSpan]] = {}
    for span in spans:
        if span.parent is not None:
            found.setdefault(span.parent.span_id, []).append(span)
    return found


def is_http_client(span: ReadableSpan) -> bool:
    found = attrs(span)
    return "http.request.method" in found or "http.method" in found


def check_chain(spans: list[ReadableSpan], agents: set[str]) -> dict[str, Any]:
    """One trace per chain, the workflow root, every LLM call under it with its
    attributes, each sent call with its HTTP child, the denied one with its trip
    event and none; agent spans for ``agents``. Returns what was counted."""
    assert len({s.context.trace_id for s in spans if s.context}) == 1
    by_id = {span_id(s): s for s in spans}
    roots = [s for s in spans if s.parent is None or s.parent.span_id not in by_id]
    assert [r.name for r in roots] == [roots[0].name]
    root = roots[0]
    assert root.name.startswith("invoke_workflow ")
    assert attrs(root)["gen_ai.operation.name"] == "invoke_workflow"
    chain_id = attrs(root)["veronica.chain.id"]
    assert attrs(root)["veronica.decision"] == "HALT"
    children = children_of(spans)

    def under_root(span: ReadableSpan) -> bool:
        while span.parent is not None and span.parent.span_id in by_id:
            span = by_id[span.parent.span_id]
        return span is root

    calls = [s for s in spans if attrs(s).get("gen_ai.operation.name") == "chat"]
    sent = [s for s in calls if attrs(s)["veronica.decision"] == "ALLOW"]
    denied = [s for s in calls if attrs(s)["veronica.decision"] == "HALT"]
    assert len(denied) == 1 and sent
    for call in calls:
        found = attrs(call)
        assert under_root(call)
        assert found["gen_ai.provider.name"] == "openai"
        assert found["gen_ai.request.model"]
        assert str(found["veronica.chain.id"]).split(".")[0] == chain_id
    for call in sent:
        found = attrs(call)
        assert found["gen_ai.usage.input_tokens"] > 0
        assert found["gen_ai.usage.output_tokens"] > 0
        assert found["veronica.cost_usd"] > 0
        http = [c for c in children.get(span_id(call), []) if is_http_client(c)]
        assert len(http) == 1, f"{call.name}: {[c.name for c in children.get(span_id(call), [])]}"
    halt = denied[0]
    assert children.get(span_id(halt), []) == []  # never left the process
    trips = [e for e in halt.events if e.name == "veronica.trip"]
    assert len(trips) == 1
    trip = dict(trips[0].attributes or {})
    assert trip["veronica.trip.reason"] == attrs(root)["veronica.trip.reason"]
    assert trip["veronica.trip.observed"] > trip["veronica.trip.limit"]
    assert halt.status.description and "veronica trip" in halt.status.description
    turns = Counter(
        s.name.split(" ", 1)[1]
        for s in spans
        if attrs(s).get("gen_ai.operation.name") == "invoke_agent"
    )
    assert set(turns) == agents
    return {"spans": len(spans), "sent": len(sent), "trip": trip["veronica.trip.reason"]}


def shape(spans: list[ReadableSpan], chain_id: str) -> Counter[tuple[Any, ...]]:
    """What must survive a hop: each span's name, its parent's, its ``veronica.*``
    attributes and its events (the run's chain id written as ``<chain>``)."""
    by_id = {span_id(s): s for s in spans}

    def same(pairs: Any) -> tuple[tuple[str, str], ...]:
        return tuple(
            sorted((k, str(v).replace(chain_id, "<chain>")) for k, v in dict(pairs).items())
        )

    return Counter(
        (
            s.name,
            by_id[s.parent.span_id].name if s.parent and s.parent.span_id in by_id else None,
            same({k: v for k, v in attrs(s).items() if k.startswith("veronica.")}),
            tuple((e.name, same(e.attributes or {})) for e in s.events),
        )
        for s in spans
    )


def run_planner_critic(venv: Path, runs: list[dict[str, str]]) -> list[dict[str, Any]]:
    """The app once per ``runs`` (its OTLP variables), each in a process of its own
    forked from one that imported what they all import; their reports in order."""
    result = subprocess.run(
        [
            str(venv / "bin" / "python"),
            str(APPS / "jaeger_planner_critic.py"),
            *(json.dumps(run) for run in runs),
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    reports = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(reports) == len(runs), result.stdout
    return reports


def run_example(
    venv: Path, target: JaegerProcess, protocol: str, service: str, llm: FakeLLMServer, cwd: Path
) -> subprocess.CompletedProcess[str]:
    """examples/jaeger/agent.py with the environment its README gives."""
    env = clean_env(
        OPENAI_BASE_URL=llm.openai_base_url,
        OPENAI_API_KEY="test",
        OTEL_TRACES_EXPORTER="otlp,veronica_graph",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        VERONICA_MAX_STEPS="6",
        **otlp_env(target, protocol, service),
    )
    result = subprocess.run(
        [
            str(venv / "bin" / "opentelemetry-instrument"),
            str(venv / "bin" / "python"),
            str(EXAMPLE),
        ],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "stopped: steps (limit 6, this call would be 7)" in result.stdout
    return result


def one_trace(query: JaegerQuery, service: str) -> list[ReadableSpan]:
    spans = settled(lambda: query.find(service, limit=10))
    assert len({s.context.trace_id for s in spans if s.context}) == 1
    return spans


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_demo_chain_is_one_trace_in_jaeger(
    demo_runs: dict[str, dict[str, Any]], jaeger: JaegerProcess, protocol: str
) -> None:
    report = demo_runs[protocol]
    assert (report["trip"], report["sent"]) == ("loop", 9)
    spans = settled(lambda: jaeger.query.trace(report["trace_id"]))
    counted = check_chain(spans, agents={"planner", "critic"})
    assert counted["sent"] == report["sent"] == 9
    assert {service_of(s) for s in spans} == {f"planner-critic-{protocol}"}


@pytest.mark.parametrize(("venv_name", "protocol"), [("recipe", p) for p in PROTOCOLS])
def test_the_zero_code_example_is_one_trace_in_jaeger(
    request: pytest.FixtureRequest,
    venv_name: str,
    protocol: str,
    jaeger: JaegerProcess,
    llm: FakeLLMServer,
    tmp_path: Path,
) -> None:
    venv = request.getfixturevalue(venv_name)
    service = f"example-{venv_name}-{protocol}"
    run_example(venv, jaeger, protocol, service, llm, tmp_path)
    spans = one_trace(jaeger.query, service)
    counted = check_chain(spans, agents={"critic"})
    # 6 steps: the plan, the tool, the critic's call and 3 revisions; the 7th is denied.
    assert counted["sent"] == llm.count("/v1/chat/completions") == 5
    assert any(attrs(s).get("gen_ai.operation.name") == "execute_tool" for s in spans)


def test_the_example_install_line_gives_every_span_its_readme_shows(
    example_venv: Path, jaeger: JaegerProcess, llm: FakeLLMServer, tmp_path: Path
) -> None:
    # `pip install 'veronica-otel[openai,otlp,propagation]'`, nothing else.
    run_example(example_venv, jaeger, "http/protobuf", "example-readme", llm, tmp_path)
    spans = one_trace(jaeger.query, "example-readme")
    check_chain(spans, agents={"critic"})
    # The README's tree: the workflow, 6 calls (5 sent, each with its POST),
    # the tool and the critic's turn.
    assert len(spans) == 14
    # The Jaeger-read graph is the graph the exporter wrote beside it.
    (written,) = (tmp_path / "veronica-graph").glob("*.json")
    from_file = load_graph(written)
    (from_jaeger,) = graphs_from_spans(spans)

    def rows(graph: Any) -> list[tuple[Any, ...]]:
        keys = ("id", "parent", "name", "kind", "decision", "trip", "tokens", "cost_usd")
        return [tuple(str(node[k]) for k in keys) for node in graph["nodes"]]

    assert rows(from_jaeger) == rows(from_file)
    assert from_jaeger["totals"] == from_file["totals"]


def test_two_services_are_one_trace_in_jaeger(
    jaeger: JaegerProcess, llm: FakeLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    otlp = otlp_env(jaeger, "http/protobuf", "service-b")
    service = start_service_b(llm, tmp_path_factory, **otlp)
    try:
        report = run_client_a(llm, service, 5, **{**otlp, "OTEL_SERVICE_NAME": "client-a"})
        assert report["b_status"] == 200
        spans = settled(lambda: jaeger.query.find("client-a", limit=10), at_least=2)
        trace_ids = {s.context.trace_id for s in spans if s.context}
        assert len(trace_ids) == 1
        # Wait for B's batch too: its spans end before A's root does, but arrive on their own.
        (trace_id,) = trace_ids
        spans = settled(
            lambda: [
                s for s in jaeger.query.trace(f"{trace_id:032x}") if service_of(s) == "service-b"
            ]
        )
        spans = jaeger.query.trace(f"{trace_id:032x}")
    finally:
        stop(service)
    by_service = Counter(str(service_of(s)) for s in spans)
    assert set(by_service) == {"client-a", "service-b"}
    by_id = {span_id(s): s for s in spans}
    # B's spans hang under A's one HTTP call to B (B has no server span of its own).
    entry = [
        s
        for s in spans
        if service_of(s) == "service-b" and s.parent and s.parent.span_id in by_id
        if service_of(by_id[s.parent.span_id]) == "client-a"
    ]
    callers = {by_id[s.parent.span_id] for s in entry if s.parent}
    assert entry and len(callers) == 1
    (caller,) = callers
    assert is_http_client(caller) and attrs(caller).get("gen_ai.operation.name") is None
    b_calls = [
        s
        for s in spans
        if service_of(s) == "service-b" and attrs(s).get("gen_ai.operation.name") == "chat"
    ]
    assert [attrs(s)["veronica.decision"] for s in b_calls].count("ALLOW") == report["b"]["made"]
    assert all(str(attrs(s)["veronica.chain.id"]).startswith(report["chain_id"]) for s in b_calls)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_through_a_collector_nothing_is_lost(
    demo_runs: dict[str, dict[str, Any]],
    forwarded_runs: dict[str, dict[str, Any]],
    jaeger: JaegerProcess,
    protocol: str,
) -> None:
    direct = demo_runs[protocol]
    forwarded = forwarded_runs[protocol]
    assert direct["sent"] == forwarded["sent"]
    expected = settled(lambda: jaeger.query.trace(direct["trace_id"]))
    arrived = settled(lambda: jaeger.query.trace(forwarded["trace_id"]), at_least=len(expected))
    check_chain(arrived, agents={"planner", "critic"})
    assert shape(arrived, forwarded["chain_id"]) == shape(expected, direct["chain_id"])


def test_graph_reads_chains_from_jaeger(
    demo_runs: dict[str, dict[str, Any]],
    forwarded_runs: dict[str, dict[str, Any]],
    jaeger: JaegerProcess,
    tmp_path: Path,
) -> None:
    report = demo_runs["http/protobuf"]
    spans = settled(lambda: jaeger.query.trace(report["trace_id"]))
    result = cli("graph", "--jaeger", jaeger.query_url, "--trace", report["trace_id"])
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.splitlines()[0] == f"trace {report['trace_id']}"
    assert f"chain {report['chain_id']} (complete)" in out
    calls = [line for line in out.splitlines() if "[llm]" in line and "legend" not in line]
    assert len(calls) == 10
    assert [line for line in calls if "HALT" in line] == [calls[-1]]
    assert "TRIP loop (limit 8, observed 9)" in calls[-1]
    assert "agents 2 (critic, planner;" in out
    assert out.count("POST  [other]") == 9  # each sent call's POST
    (graph,) = graphs_from_spans(spans)
    assert graph["totals"]["llm_sent"] == 9

    # The service's latest traces: the one sent through the Collector, and the
    # one sent straight before it.
    latest = forwarded_runs["http/protobuf"]
    settled(lambda: jaeger.query.trace(latest["trace_id"]))
    result = cli(
        "graph",
        "--jaeger",
        jaeger.query_url,
        "--service",
        "planner-critic-http/protobuf",
        "--last",
        "2",
        "--html",
        str(tmp_path / "pages"),
    )
    assert result.returncode == 0, result.stderr
    pages = sorted((tmp_path / "pages").glob("*.html"))
    assert len(pages) == 2 and result.stdout.count("wrote ") == 2
    assert any(latest["chain_id"] in p.name for p in pages)
    assert "TRIP" in pages[0].read_text() or "trip" in pages[0].read_text()


def test_graph_says_what_jaeger_lacks(jaeger: JaegerProcess) -> None:
    missing = cli("graph", "--jaeger", jaeger.query_url, "--trace", "0" * 31 + "1")
    assert missing.returncode == 1
    assert "has no spans for trace" in missing.stderr
    gone = cli("graph", "--jaeger", "http://127.0.0.1:9", "--service", "x")
    assert gone.returncode == 1
    assert "cannot reach Jaeger at http://127.0.0.1:9" in gone.stderr
    both = cli("graph", "x.json", "--jaeger", jaeger.query_url, "--trace", "1" * 32)
    assert both.returncode == 2 and "not both" in both.stderr
    alone = cli("graph", "--service", "x")
    assert alone.returncode == 2 and "--jaeger" in alone.stderr
