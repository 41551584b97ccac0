"""The graph model, the text tree and the HTML page on hand-made nodes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from veronica_otel.exporters import load_graph, render_text_tree
from veronica_otel.exporters._graph_html import render_html
from veronica_otel.exporters._graph_model import (
    NodeDict,
    build_graph,
    chain_key,
    describe_trip,
    node_from_json,
)


def node(
    node_id: str, parent: str | None, name: str, kind: str = "agent", **extra: Any
) -> NodeDict:
    start = float(int(node_id, 16))
    made = node_from_json(
        {"id": node_id, "parent": parent, "name": name, "kind": kind, "start": start, **extra}
    )
    assert made is not None
    made["end"] = start + 0.5
    return made


def agents(*names: str) -> list[NodeDict]:
    return [node("1", None, "root")] + [
        node(f"{i + 2:x}", "1", name) for i, name in enumerate(names)
    ]


def test_chain_key_is_the_first_segment() -> None:
    assert chain_key("abc") == "abc"
    assert chain_key("abc.1.2") == "abc"


@pytest.mark.parametrize(
    ("names", "runs"),
    [
        (["A", "B", "A", "B"], [4]),
        (["A", "B", "A"], []),
        (["A", "B", "A", "B", "A", "B", "A"], [7]),
        (["A", "B", "A", "C", "A", "C", "A"], [5]),  # A,C,A,C,A starts one step back
        (["A", "A", "B", "A", "B"], [4]),
        (["A", "B", "A", "B", "B", "C", "B", "C"], [4, 4]),
    ],
)
def test_ping_pong_runs(names: list[str], runs: list[int]) -> None:
    graph = build_graph("c", agents(*names), complete=True)
    found = [loop["count"] for loop in graph["loops"] if loop["type"] == "ping_pong"]
    assert found == runs


def test_repeated_signature_needs_three_of_the_same_under_one_parent() -> None:
    nodes = [
        node("1", None, "root"),
        node("2", "1", "chat m", "llm", model="m", digest="d1"),
        node("3", "1", "chat m", "llm", model="m", digest="d1"),
        node("4", "1", "chat m", "llm", model="m", digest="d2"),  # other input
        node("5", "1", "chat m", "llm", model="m", digest="d1"),
        node("6", "1", "step", "other"),
        node("7", "1", "step", "other"),
        node("8", "1", "step", "other"),  # "other" spans are not calls
    ]
    graph = build_graph("c", nodes, complete=True)
    (loop,) = graph["loops"]
    assert loop["type"] == "repeated_signature" and loop["exact"] is True
    assert loop["nodes"] == ["2", "3", "5"] and loop["parent"] == "1"
    # Only the repeats carry the badge: the first call is where the loop began.
    assert [n["loops"] for n in graph["nodes"]][1:5] == [[], [0], [], [0]]


def test_costs_and_totals() -> None:
    nodes = [
        node("1", None, "host", "other"),
        node("2", "1", "invoke_workflow w", "agent", cost_usd=0.5),
        node("3", "2", "chat m", "llm", cost_usd=0.2, input_tokens=3, output_tokens=4),
        node("4", "1", "chat m", "llm", cost_usd=0.25, decision="HALT"),
    ]
    graph = build_graph("c", nodes, complete=False)
    by_id = {n["id"]: n for n in graph["nodes"]}
    assert by_id["1"]["total_cost_usd"] == pytest.approx(0.75)  # agent's own total + a call
    assert graph["totals"]["cost_usd"] == pytest.approx(0.75)
    assert graph["totals"]["input_tokens"] == 3 and graph["totals"]["output_tokens"] == 4
    assert graph["totals"]["denied_calls"] == 1


def test_parent_cycles_and_deep_trees_are_safe(tmp_path: Path) -> None:
    cycle = [node("1", "2", "a"), node("2", "1", "b"), node("3", "3", "self")]
    graph = build_graph("c", cycle, complete=False)
    assert sorted(n["id"] for n in graph["nodes"]) == ["1", "2", "3"]
    assert graph["roots"] == ["1", "3"]
    deep = [node("1", None, "d0")] + [node(f"{i:x}", f"{i - 1:x}", f"d{i}") for i in range(2, 5000)]
    graph = build_graph("c", deep, complete=True)
    assert graph["nodes"][-1]["depth"] == 4998
    assert render_text_tree(graph).count("\n") >= 4999
    assert render_html(graph).count('<tr class="node') == 4999
    path = tmp_path / "deep.json"
    path.write_text(json.dumps(graph), encoding="utf-8")
    assert load_graph(path)["nodes"][-1]["depth"] == 4998


def test_load_graph_rejects_what_is_not_a_graph(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    for text in ("not json", "[]", '{"nodes": 1}', '{"version": 99, "nodes": []}'):
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError):
            load_graph(path)
    path.write_text(json.dumps({"version": 1, "nodes": [{"id": "1"}, 5]}), encoding="utf-8")
    assert load_graph(path)["nodes"] == []  # malformed nodes are skipped


def test_text_tree_never_emits_terminal_control_characters() -> None:
    graph = build_graph("c\x1b[2J", [node("1", None, "evil\x1b]0;owned\x07name")], complete=True)
    text = render_text_tree(graph)
    assert "\x1b" not in text and "\x07" not in text
    assert "evil\\x1b]0;owned\\x07name" in text


def test_exported_names_and_the_optional_otlp_dependency() -> None:
    import subprocess
    import sys

    from veronica_otel import exporters

    assert set(exporters.__all__) == {
        "ExecutionGraphExporter",
        "GraphDict",
        "OTLPJsonLinesSpanExporter",
        "load_graph",
        "render_text_tree",
    }
    assert all(getattr(exporters, name) is not None for name in exporters.__all__)
    # The graph exporter works without the ``otlp`` extra: it never imports it.
    code = (
        "import sys, veronica_otel.exporters.graph\n"
        "print([m for m in ('google.protobuf', 'opentelemetry.exporter', 'opentelemetry.proto') "
        "if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def websocket_chain() -> list[NodeDict]:
    """The demo's WebSocket chain: 30 steps, 2 of them LLM calls with no usage split."""
    trip = {"reason": "steps", "limit": 30, "observed": 31}
    root = {"chain_id": "c", "tokens": 140, "steps": 30, "cost_usd": 0.00065, "trip": trip}
    call = {"chain_id": "c", "model": "gpt-4o", "cost_usd": 0.000325, "decision": "ALLOW"}
    return [
        node("1", None, "invoke_workflow request", decision="HALT", **root),
        node("2", "1", "chat gpt-4o", "llm", **call),
        node("3", "1", "chat gpt-4o", "llm", **call),
    ]


def test_totals_are_the_chains_own_steps_and_tokens() -> None:
    graph = build_graph("c", websocket_chain(), complete=True)
    totals = graph["totals"]
    assert (totals["tokens"], totals["input_tokens"], totals["output_tokens"]) == (140, 0, 0)
    assert totals["calls_without_usage"] == 2
    assert (totals["steps"], totals["llm_sent"], totals["other_steps"]) == (30, 2, 28)
    text = render_text_tree(graph)
    assert "tokens 140 (in / out not reported by the 2 LLM calls)" in text
    assert "steps 30 = 2 LLM calls + 0 tool calls + 28 without a span (WebSocket messages" in text
    page = render_html(graph)
    assert "<th>tokens</th><td>140 (in / out not reported by the 2 LLM calls)</td>" in page
    assert "<th>steps</th><td>30 = 2 LLM calls + 0 tool calls + 28 without a span" in page
    assert "tokens in / out</th><td>0 / 0" not in page  # the old, contradicting summary


def test_without_a_chain_span_totals_come_from_the_calls() -> None:
    nodes = [
        node("1", None, "POST /chat", "other"),
        node("2", "1", "chat m", "llm", input_tokens=3, output_tokens=4, decision="ALLOW"),
    ]
    totals = build_graph("c", nodes, complete=True)["totals"]
    assert (totals["tokens"], totals["steps"], totals["other_steps"]) == (7, None, None)
    assert "steps not in the trace (1 LLM call + 0 tool calls sent)" in render_text_tree(
        build_graph("c", nodes, complete=True)
    )


def planner_critic(turns: int) -> list[NodeDict]:
    nodes = [node("1", None, "invoke_workflow planner-critic", chain_id="c", steps=turns)]
    for i in range(turns):
        name = "invoke_agent planner" if i % 2 == 0 else "invoke_agent critic"
        turn, call = f"{2 * i + 2:x}", f"{2 * i + 3:x}"
        nodes.append(node(turn, "1", name, chain_id="c"))
        nodes.append(node(call, turn, "chat m", "llm", model="m", decision="ALLOW"))
    return nodes


def test_agents_are_counted_by_name_and_the_loop_badge_marks_repeats() -> None:
    graph = build_graph("c", planner_critic(13), complete=True)
    totals = graph["totals"]
    assert (totals["agents"], totals["agent_names"], totals["agent_turns"]) == (
        2,
        ["critic", "planner"],
        13,
    )
    # One loop (the ping-pong): each agent's own repeats are that loop, not two more.
    (loop,) = graph["loops"]
    assert loop["type"] == "ping_pong" and loop["label"].startswith("agents 'planner' and")
    turns = [n for n in graph["nodes"] if n["kind"] == "agent" and n["depth"] == 1]
    assert [bool(n["loops"]) for n in turns] == [False, False] + [True] * 11
    assert "agents 2 (critic, planner; 13 turns)" in render_text_tree(graph)


def test_the_call_that_begins_a_repeat_carries_no_badge() -> None:
    nodes = [node("1", None, "root")]
    nodes += [node(f"{i:x}", "1", "chat m", "llm", model="m", digest="d") for i in range(2, 6)]
    graph = build_graph("c", nodes, complete=True)
    assert [n["loops"] for n in graph["nodes"]] == [[], [], [0], [0], [0]]
    text = render_text_tree(graph)
    assert text.count("LOOP 1") == 3


@pytest.mark.parametrize("complete", [True, False])
def test_every_badge_is_explained(complete: bool) -> None:
    graph = build_graph("c", websocket_chain(), complete=complete)
    page = render_html(graph)
    state = "complete" if complete else "partial"
    assert f'<span class="badge {state}" title="' in page
    keys = [re.sub(r"<[^>]+>", "", key) for key in re.findall(r"<dt>(.*?)</dt>", page)]
    for badge in ("complete", "partial", "agent", "llm", "tool", "other", "trip", "error"):
        assert badge in keys, badge
    assert "ALLOW / HALT" in keys and "&#10227; loop" in keys
    text = render_text_tree(graph)
    assert f"({state})" in text.splitlines()[0]
    legend_line = text.splitlines()[-1]
    for word in (
        "[agent]",
        "[llm]",
        "[tool]",
        "[other]",
        "HALT",
        "TRIP",
        "ERROR",
        "LOOP",
        "partial",
    ):
        assert word in legend_line, word


@pytest.mark.parametrize(
    ("trip", "words"),
    [
        ({"reason": "steps", "limit": 5.0, "observed": 6.0}, "steps (limit 5, observed 6)"),
        (
            {"reason": "cost", "limit": 0.01, "observed": 0.010155, "pool": "tenant:acme"},
            "cost (pool tenant:acme: limit $0.01, observed $0.010155)",
        ),
        (
            {"reason": "steps", "limit": 2.0, "observed": 3.0, "agent": "Alpha"},
            "steps (agent Alpha: limit 2, observed 3)",
        ),
        ({"reason": "cost", "limit": None, "observed": None, "pool": "p"}, "cost (pool p)"),
    ],
)
def test_a_trip_names_whose_limit_it_was_and_money_in_dollars(
    trip: dict[str, Any], words: str
) -> None:
    made = node_from_json({"id": "1", "parent": None, "name": "chat", "kind": "llm", "trip": trip})
    assert made is not None and made["trip"] is not None
    assert describe_trip(made["trip"]) == words
    assert "TRIP " + words in render_text_tree(build_graph("c", [made], complete=True))
