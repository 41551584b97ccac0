"""The graph model, the text tree and the HTML page on hand-made nodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from veronica_otel.exporters import load_graph, render_text_tree
from veronica_otel.exporters._graph_html import render_html
from veronica_otel.exporters._graph_model import (
    NodeDict,
    build_graph,
    chain_key,
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
    assert [n["loops"] for n in graph["nodes"]][1:5] == [[0], [0], [], [0]]


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
