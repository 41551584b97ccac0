"""Reading a graph file back, and the graph as a tree for the terminal.

Used by ``veronica-otel graph FILE``::

    from veronica_otel.exporters import load_graph, render_text_tree

    print(render_text_tree(load_graph("veronica-graph/3f2a....json")))
"""

from __future__ import annotations

import json
import os

from ._graph_model import (
    GRAPH_VERSION,
    GraphDict,
    NodeDict,
    build_graph,
    describe_trip,
    node_from_json,
)

__all__ = ["load_graph", "render_text_tree"]


def load_graph(path: str | os.PathLike[str]) -> GraphDict:
    """Read a graph document written by the graph exporter.

    The nodes are re-read field by field and the tree, totals and loops are
    rebuilt, so a hand-edited or truncated file cannot yield a malformed graph.

    Raises:
        OSError: The file cannot be read.
        ValueError: The file is not a veronica graph document.
    """
    with open(path, encoding="utf-8") as handle:
        try:
            data = json.load(handle)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{os.fspath(path)!s} is not JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise ValueError(f"{os.fspath(path)!s} is not a veronica graph document")
    version = data.get("version")
    if not isinstance(version, int) or version > GRAPH_VERSION:
        raise ValueError(f"{os.fspath(path)!s}: unsupported graph version {version!r}")
    nodes = [node for node in map(node_from_json, data["nodes"]) if node is not None]
    chain_id = data.get("chain_id")
    dropped = data.get("dropped_spans")
    return build_graph(
        chain_id if isinstance(chain_id, str) else "unknown",
        nodes,
        complete=data.get("complete") is True,
        dropped_spans=dropped if isinstance(dropped, int) and dropped > 0 else 0,
    )


def _clean(text: str) -> str:
    """Span data may hold terminal escape sequences: show them, never run them."""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def _usd(value: float | None) -> str:
    return "" if value is None else f"${value:.6f}"


def _line(node: NodeDict) -> str:
    parts = [_clean(node["name"]), f"[{node['kind']}]"]
    cost = node["cost_usd"] if node["kind"] != "other" else node["total_cost_usd"] or None
    if cost is not None:
        parts.append(_usd(cost))
    if node["input_tokens"] is not None or node["output_tokens"] is not None:
        parts.append(f"{node['input_tokens'] or 0}+{node['output_tokens'] or 0} tok")
    elif node["tokens"] is not None:
        parts.append(f"{node['tokens']} tok")
    parts.append(f"{node['duration_ms']:.1f} ms")
    if node["decision"]:
        parts.append(_clean(node["decision"]))
    trip = node["trip"]
    if trip is not None:
        parts.append("TRIP " + _clean(describe_trip(trip)))
    elif node["status"] == "error":
        parts.append("ERROR")
    if node["loops"]:
        parts.append("LOOP " + ",".join(str(i + 1) for i in node["loops"]))
    return "  ".join(parts)


def render_text_tree(graph: GraphDict) -> str:
    """The graph as an indented tree with totals and loops, for a terminal."""
    totals = graph["totals"]
    state = "complete" if graph["complete"] else "partial"
    lines = [
        f"chain {_clean(graph['chain_id'])} ({state})  cost {_usd(totals.get('cost_usd', 0.0))}  "
        f"tokens {totals.get('input_tokens', 0)} in / {totals.get('output_tokens', 0)} out  "
        f"llm {totals.get('llm_calls', 0)}  tools {totals.get('tool_calls', 0)}  "
        f"agents {totals.get('agents', 0)}  denied {totals.get('denied_calls', 0)}  "
        f"{graph['duration_ms']:.1f} ms"
    ]
    by_id = {node["id"]: node for node in graph["nodes"]}
    stack: list[tuple[str, str, str]] = [
        (root, "", "") for root in reversed(graph["roots"]) if root in by_id
    ]
    while stack:
        node_id, branch, prefix = stack.pop()
        node = by_id[node_id]
        lines.append(f"{prefix}{branch}{_line(node)}")
        if branch == "├─ ":
            prefix += "│  "
        elif branch == "└─ ":
            prefix += "   "
        children = [c for c in node["children"] if c in by_id]
        for index in range(len(children) - 1, -1, -1):
            last = index == len(children) - 1
            stack.append((children[index], "└─ " if last else "├─ ", prefix))
    if graph["loops"]:
        lines.append("loops:")
        lines.extend(
            f"  {i + 1}. {_clean(loop['label'])}" + ("" if loop["exact"] else " (inputs unknown)")
            for i, loop in enumerate(graph["loops"])
        )
    if graph["dropped_spans"]:
        lines.append(f"spans dropped over the per-chain cap: {graph['dropped_spans']}")
    return "\n".join(lines)
