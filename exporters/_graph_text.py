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
    node_cost,
    node_from_json,
)

__all__ = ["load_graph", "render_text_tree", "summary"]

LEGEND = (
    "legend: [agent] the chain or an agent's turn (cost includes its children), [llm] a model "
    "call, [tool] a tool call, [other] your own span (not a step) · ALLOW/HALT the pre-call "
    "check (a HALT call was denied, never sent) · TRIP the limit that stopped the chain "
    "(limit, observed) · ERROR the span failed · LOOP n a repeat in loop n (the call that "
    "began it is not marked) · partial: written before the root span ended"
)


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
    cost = node_cost(node)
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


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def summary(graph: GraphDict) -> dict[str, str]:
    """The chain's totals in words, the same for the terminal and the page."""
    totals = graph["totals"]

    def number(key: str) -> int:
        value = totals.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    inp, out = number("input_tokens"), number("output_tokens")
    tokens = totals.get("tokens")
    tokens = tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else inp + out
    unsplit, llm_sent = number("calls_without_usage"), number("llm_sent")
    if not unsplit:
        token_text = f"{tokens} ({inp} in / {out} out)"
    elif unsplit >= llm_sent:
        token_text = f"{tokens} (in / out not reported by the {_plural(unsplit, 'LLM call')})"
    else:
        token_text = f"{tokens} ({inp} in / {out} out; {_plural(unsplit, 'LLM call')} without)"
    calls = f"{_plural(llm_sent, 'LLM call')} + {_plural(number('tools_sent'), 'tool call')}"
    steps, other = totals.get("steps"), totals.get("other_steps")
    if not isinstance(steps, int) or isinstance(steps, bool):
        step_text = f"not in the trace ({calls} sent)"
    elif isinstance(other, int) and other > 0:
        step_text = (
            f"{steps} = {calls} + {other} without a span (WebSocket messages, wrapped calls)"
        )
    else:
        step_text = f"{steps} = {calls}" if isinstance(other, int) else str(steps)
    denied = number("denied_calls")
    names = [str(n) for n in totals.get("agent_names", []) if isinstance(n, str)]
    agents = number("agents")
    agent_text = (
        f"{agents} ({', '.join(names)}; {_plural(number('agent_turns'), 'turn')})"
        if agents
        else "none besides the chain"
    )
    return {
        "tokens": token_text,
        "steps": step_text,
        "llm": str(number("llm_calls")) + (f" ({denied} denied, never sent)" if denied else ""),
        "tools": str(number("tool_calls")),
        "agents": agent_text,
    }


def render_text_tree(graph: GraphDict) -> str:
    """The graph as an indented tree with totals, loops and a legend, for a terminal."""
    totals = graph["totals"]
    figures = summary(graph)
    state = "complete" if graph["complete"] else "partial"
    lines = [
        f"chain {_clean(graph['chain_id'])} ({state})  cost {_usd(totals.get('cost_usd', 0.0))}  "
        f"{graph['duration_ms']:.1f} ms",
        f"  tokens {figures['tokens']}",
        f"  steps {figures['steps']}",
        f"  llm calls {figures['llm']}  tool calls {figures['tools']}  "
        f"agents {_clean(figures['agents'])}",
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
    lines.append(LEGEND)
    return "\n".join(lines)
