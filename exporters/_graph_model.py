"""The execution graph of one chain: nodes from finished spans, totals and loop flags.

A chain's spans become flat *nodes* (one per span, with a ``parent`` pointer)
that :func:`build_graph` turns into a graph document: the nodes in tree order
with their ``children`` and ``depth``, the chain's totals and the loops it
found. The document is plain JSON; :func:`build_graph` also accepts the nodes
of a document written earlier, so a chain flushed in pieces is merged.

Node kinds follow the GenAI ``gen_ai.operation.name``: ``invoke_agent`` /
``invoke_workflow`` / ``create_agent`` are ``agent``, ``execute_tool`` is
``tool``, model operations (or a span with ``gen_ai.request.model``) are
``llm``, anything else is ``other``.

Loops flagged (heuristics, shown beside the graph; they never stop a chain):

- ``repeated_signature``: three or more children of one parent with the same
  (kind, name, model, input digest). The digest is the span's
  ``veronica.signature`` attribute when present; without it the flag is
  marked ``"exact": false`` (same call shape, inputs unknown).
- ``ping_pong``: two sibling agents alternating A, B, A, B ... four or more
  times in start order.

A loop lists all its members (``nodes``), but only the *repeats* carry its
badge (a node's ``loops``): the first call of a repeated signature, and the
first A and B of a ping-pong, are where the loop began, not part of it.

Totals agree with the chain's own numbers: ``cost_usd``, ``tokens`` and
``steps`` are the chain span's totals (the ledger's) when the graph has one,
so steps with no span of their own (WebSocket messages under the middleware,
calls wrapped without a span) show as ``other_steps``, and calls that
reported no input/output split as ``calls_without_usage``. ``agents`` counts
distinct agent names (not the chain's own workflow span); ``agent_turns``
counts their spans.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, NotRequired, TypedDict

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from veronica_otel._attributes import (
    AGENT,
    CHAIN_ID,
    COST_USD,
    DECISION,
    GEN_AI_OPERATION_NAME,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    POOL,
    SIGNATURE,
    STEPS,
    TOKENS,
    TRIP_EVENT,
    TRIP_LIMIT,
    TRIP_OBSERVED,
    TRIP_REASON,
)

__all__ = [
    "GRAPH_VERSION",
    "GraphDict",
    "LoopDict",
    "NodeDict",
    "TripDict",
    "build_graph",
    "chain_key",
    "describe_trip",
    "node_from_json",
    "node_from_span",
    "agent_name",
    "node_cost",
    "repeats",
]

GRAPH_VERSION = 1
REPEAT_THRESHOLD = 3
PING_PONG_THRESHOLD = 4
_MAX_LOOPS = 100
_AGENT_OPS = frozenset({"invoke_agent", "invoke_workflow", "create_agent"})
_LLM_OPS = frozenset({"chat", "text_completion", "generate_content", "embeddings"})
_KINDS = frozenset({"agent", "llm", "tool", "other"})
_STATUS = {StatusCode.OK: "ok", StatusCode.ERROR: "error", StatusCode.UNSET: "unset"}
_NS = 1_000_000_000


class TripDict(TypedDict):
    """A ``veronica.trip`` on a node: what tripped, the limit and what was seen,
    and the budget pool or agent whose limit it was (None: the chain's own)."""

    reason: str
    limit: float | None
    observed: float | None
    pool: NotRequired[str | None]
    agent: NotRequired[str | None]


class NodeDict(TypedDict):
    """One span of the chain.

    ``id``/``parent``/``trace_id`` are lowercase hex; ``start``/``end`` are Unix
    seconds. ``total_cost_usd``, ``children``, ``depth`` (in the tree) and
    ``loops`` (indexes into the graph's loops) are filled in by build_graph.
    """

    id: str
    parent: str | None
    trace_id: str
    kind: str
    name: str
    chain_id: str | None
    model: str | None
    start: float
    end: float
    duration_ms: float
    status: str
    status_message: str | None
    cost_usd: float | None
    total_cost_usd: float
    input_tokens: int | None
    output_tokens: int | None
    tokens: int | None
    steps: int | None
    decision: str | None
    trip: TripDict | None
    digest: str | None
    children: list[str]
    depth: int
    loops: list[int]


class LoopDict(TypedDict):
    """One loop flag: its type, where it is and the nodes that make it."""

    type: str
    parent: str | None
    label: str
    count: int
    exact: bool
    nodes: list[str]


class GraphDict(TypedDict):
    """The graph document written per chain."""

    version: int
    chain_id: str
    complete: bool
    trace_ids: list[str]
    start: float
    end: float
    duration_ms: float
    totals: dict[str, Any]
    roots: list[str]
    nodes: list[NodeDict]
    loops: list[LoopDict]
    dropped_spans: int


def chain_key(chain_id: str) -> str:
    """The root chain of ``chain_id``: child chains are ``root.1``, ``root.1.2`` ..."""
    return chain_id.split(".", 1)[0]


def describe_trip(trip: TripDict) -> str:
    """``steps (limit 9, observed 10)``, ``cost (pool acme: limit $0.01, observed
    $0.010155)``: a trip in words, whose limit it was, money as dollars."""
    text = trip["reason"]
    owner = (
        f"pool {trip['pool']}: "
        if trip.get("pool")
        else f"agent {trip['agent']}: "
        if trip.get("agent")
        else ""
    )
    if trip["limit"] is not None or trip["observed"] is not None:
        money = "$" if trip["reason"] == "cost" else ""
        limit = "?" if trip["limit"] is None else f"{money}{trip['limit']:g}"
        observed = "?" if trip["observed"] is None else f"{money}{trip['observed']:g}"
        text += f" ({owner}limit {limit}, observed {observed})"
    elif owner:
        text += f" ({owner.rstrip(': ')})"
    return text


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return max(0, int(value))


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _kind(attributes: Mapping[str, object]) -> str:
    operation = attributes.get(GEN_AI_OPERATION_NAME)
    if operation in _AGENT_OPS:
        return "agent"
    if operation == "execute_tool":
        return "tool"
    if operation in _LLM_OPS or GEN_AI_REQUEST_MODEL in attributes:
        return "llm"
    return "other"


def _trip(span: ReadableSpan, attributes: Mapping[str, object]) -> TripDict | None:
    for event in span.events:
        if event.name == TRIP_EVENT:
            found = event.attributes or {}
            return {
                "reason": str(found.get(TRIP_REASON, "unknown")),
                "limit": _finite(found.get(TRIP_LIMIT)),
                "observed": _finite(found.get(TRIP_OBSERVED)),
                "pool": _text(found.get(POOL)),
                "agent": _text(found.get(AGENT)),
            }
    reason = attributes.get(TRIP_REASON)
    if isinstance(reason, str):
        return {
            "reason": reason,
            "limit": None,
            "observed": None,
            "pool": _text(attributes.get(POOL)),
            "agent": _text(attributes.get(AGENT)),
        }
    return None


def node_from_span(span: ReadableSpan) -> NodeDict | None:
    """The node for one finished span (None for a span with no context)."""
    context = span.context
    if context is None:
        return None
    attributes: Mapping[str, object] = span.attributes or {}
    start_ns = span.start_time or 0
    end_ns = span.end_time if span.end_time is not None else start_ns
    input_tokens = _count(attributes.get(GEN_AI_USAGE_INPUT_TOKENS))
    output_tokens = _count(attributes.get(GEN_AI_USAGE_OUTPUT_TOKENS))
    tokens = _count(attributes.get(TOKENS))
    if tokens is None and (input_tokens is not None or output_tokens is not None):
        tokens = (input_tokens or 0) + (output_tokens or 0)
    parent = span.parent
    return {
        "id": f"{context.span_id:016x}",
        "parent": f"{parent.span_id:016x}" if parent is not None else None,
        "trace_id": f"{context.trace_id:032x}",
        "kind": _kind(attributes),
        "name": span.name,
        "chain_id": _text(attributes.get(CHAIN_ID)),
        "model": _text(attributes.get(GEN_AI_REQUEST_MODEL)),
        "start": round(start_ns / _NS, 6),
        "end": round(end_ns / _NS, 6),
        "duration_ms": round(max(0, end_ns - start_ns) / 1e6, 3),
        "status": _STATUS.get(span.status.status_code, "unset"),
        "status_message": span.status.description,
        "cost_usd": _finite(attributes.get(COST_USD)),
        "total_cost_usd": 0.0,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "tokens": tokens,
        "steps": _count(attributes.get(STEPS)),
        "decision": _text(attributes.get(DECISION)),
        "trip": _trip(span, attributes),
        "digest": _text(attributes.get(SIGNATURE)),
        "children": [],
        "depth": 0,
        "loops": [],
    }


def node_from_json(obj: object) -> NodeDict | None:
    """A node read back from a graph document (None when it is not one)."""
    if not isinstance(obj, dict):
        return None
    node_id, name = obj.get("id"), obj.get("name")
    if not isinstance(node_id, str) or not isinstance(name, str):
        return None
    trip = obj.get("trip")
    kind = obj.get("kind")
    return {
        "id": node_id,
        "parent": _text(obj.get("parent")),
        "trace_id": _text(obj.get("trace_id")) or "",
        "kind": kind if isinstance(kind, str) and kind in _KINDS else "other",
        "name": name,
        "chain_id": _text(obj.get("chain_id")),
        "model": _text(obj.get("model")),
        "start": _finite(obj.get("start")) or 0.0,
        "end": _finite(obj.get("end")) or 0.0,
        "duration_ms": _finite(obj.get("duration_ms")) or 0.0,
        "status": _text(obj.get("status")) or "unset",
        "status_message": _text(obj.get("status_message")),
        "cost_usd": _finite(obj.get("cost_usd")),
        "total_cost_usd": 0.0,
        "input_tokens": _count(obj.get("input_tokens")),
        "output_tokens": _count(obj.get("output_tokens")),
        "tokens": _count(obj.get("tokens")),
        "steps": _count(obj.get("steps")),
        "decision": _text(obj.get("decision")),
        "trip": (
            {
                "reason": str(trip.get("reason", "unknown")),
                "limit": _finite(trip.get("limit")),
                "observed": _finite(trip.get("observed")),
                "pool": _text(trip.get("pool")),
                "agent": _text(trip.get("agent")),
            }
            if isinstance(trip, dict)
            else None
        ),
        "digest": _text(obj.get("digest")),
        "children": [],
        "depth": 0,
        "loops": [],
    }


def build_graph(
    chain_id: str,
    nodes: Iterable[NodeDict],
    *,
    complete: bool,
    dropped_spans: int = 0,
) -> GraphDict:
    """Build the graph document of one chain from its nodes (later duplicates win).

    The nodes' computed fields (children, depth, loops, total cost) are filled in place.
    """
    by_id: dict[str, NodeDict] = {}
    for node in nodes:
        node["children"], node["depth"], node["loops"] = [], 0, []
        by_id[node["id"]] = node
    ordered, roots = _tree_order(by_id)
    loops = _find_loops(ordered, roots)
    for index, loop in enumerate(loops):
        for node_id in repeats(loop):
            by_id[node_id]["loops"].append(index)
    _total_costs(ordered, by_id)
    start = min((n["start"] for n in ordered), default=0.0)
    end = max((n["end"] for n in ordered), default=0.0)
    return {
        "version": GRAPH_VERSION,
        "chain_id": chain_id,
        "complete": complete,
        "trace_ids": sorted({n["trace_id"] for n in ordered if n["trace_id"]}),
        "start": start,
        "end": end,
        "duration_ms": round(max(0.0, end - start) * 1000, 3),
        "totals": _totals(ordered, roots, by_id),
        "roots": roots,
        "nodes": ordered,
        "loops": loops,
        "dropped_spans": dropped_spans,
    }


def repeats(loop: LoopDict) -> list[str]:
    """The members of ``loop`` that repeat an earlier one (they carry its badge)."""
    first = 2 if loop["type"] == "ping_pong" else 1  # A, B begin a ping-pong
    return loop["nodes"][first:]


def node_cost(node: NodeDict) -> float | None:
    """The cost to show on a row: a call's own, else its children's total (None if nothing)."""
    own = node["cost_usd"]
    if own is not None and node["kind"] != "other":
        return own
    return node["total_cost_usd"] or None


def agent_name(node: NodeDict) -> str | None:
    """The agent a node is a turn of; None for a workflow (the chain itself) or a non-agent."""
    if node["kind"] != "agent":
        return None
    operation, _, rest = node["name"].partition(" ")
    if operation == "invoke_workflow":
        return None
    return rest if operation in _AGENT_OPS and rest else node["name"]


def _tree_order(by_id: dict[str, NodeDict]) -> tuple[list[NodeDict], list[str]]:
    """Depth-first order (children by start time); iterative, cycle-safe."""
    by_start = sorted(by_id.values(), key=lambda n: (n["start"], n["id"]))
    for node in by_start:
        parent = node["parent"]
        if parent is not None and parent in by_id and parent != node["id"]:
            by_id[parent]["children"].append(node["id"])
    candidates = [node["id"] for node in by_start if node["parent"] not in by_id]
    # Nodes caught in a parent cycle (only in a hand-edited file) become roots.
    leftovers = [node["id"] for node in by_start]
    ordered: list[NodeDict] = []
    roots: list[str] = []
    seen: set[str] = set()
    for root in [*candidates, *leftovers]:
        if root in seen:
            continue
        roots.append(root)
        stack = [(root, 0)]
        while stack:
            node_id, depth = stack.pop()
            if node_id in seen:
                continue
            seen.add(node_id)
            node = by_id[node_id]
            node["depth"] = depth
            ordered.append(node)
            stack.extend((child, depth + 1) for child in reversed(node["children"]))
    for node in ordered:  # a cycle's back edge is not a child
        node["children"] = [c for c in node["children"] if by_id[c]["depth"] == node["depth"] + 1]
    return ordered, roots


def _signature(node: NodeDict) -> tuple[str, str, str | None, str | None]:
    return (node["kind"], node["name"], node["model"], node["digest"])


def _find_loops(ordered: list[NodeDict], roots: list[str]) -> list[LoopDict]:
    by_id = {node["id"]: node for node in ordered}
    loops: list[LoopDict] = []
    groups: list[tuple[str | None, list[str]]] = [(None, roots)]
    groups.extend((node["id"], node["children"]) for node in ordered if node["children"])
    for parent, sibling_ids in groups:
        if len(loops) >= _MAX_LOOPS:
            break
        siblings = [by_id[s] for s in sibling_ids]
        pongs = _ping_pongs(parent, [n for n in siblings if n["kind"] == "agent"])
        in_pongs = {node_id for loop in pongs for node_id in loop["nodes"]}
        # An agent's turns inside a ping-pong are that loop, not a second one.
        loops.extend(r for r in _repeats(parent, siblings) if not set(r["nodes"]) <= in_pongs)
        loops.extend(pongs)
    return loops[:_MAX_LOOPS]


def _repeats(parent: str | None, siblings: list[NodeDict]) -> list[LoopDict]:
    same: dict[tuple[str, str, str | None, str | None], list[str]] = {}
    for node in siblings:
        if node["kind"] != "other":
            same.setdefault(_signature(node), []).append(node["id"])
    found: list[LoopDict] = []
    for (kind, name, model, digest), ids in same.items():
        if len(ids) >= REPEAT_THRESHOLD:
            what = f"{kind} {name!r}" + (f" ({model})" if model else "")
            found.append(
                {
                    "type": "repeated_signature",
                    "parent": parent,
                    "label": f"{what} repeated {len(ids)} times",
                    "count": len(ids),
                    "exact": digest is not None,
                    "nodes": ids,
                }
            )
    return found


def _ping_pongs(parent: str | None, agents: list[NodeDict]) -> list[LoopDict]:
    """Maximal runs A, B, A, B ... of two alternating agent names."""
    names = [agent["name"] for agent in agents]
    found: list[LoopDict] = []
    start = 0
    for i in range(1, len(names) + 1):
        if (
            i < len(names)
            and names[i] != names[i - 1]
            and (i - start < 2 or names[i] == names[i - 2])
        ):
            continue
        if i - start >= PING_PONG_THRESHOLD:
            a, b = (agent_name(agents[start + k]) or names[start + k] for k in (0, 1))
            found.append(
                {
                    "type": "ping_pong",
                    "parent": parent,
                    "label": f"agents {a!r} and {b!r} alternate {i - start} times",
                    "count": i - start,
                    "exact": True,
                    "nodes": [agent["id"] for agent in agents[start:i]],
                }
            )
        if i < len(names):  # the next run may begin one step back: A,B,A,C,A,C
            start = i - 1 if names[i] != names[i - 1] else i
    return found


def _total_costs(ordered: list[NodeDict], by_id: dict[str, NodeDict]) -> None:
    """``total_cost_usd``: an agent's own chain total, a call's cost, else its children's sum."""
    for node in reversed(ordered):  # children before parents
        own = node["cost_usd"]
        if node["kind"] != "other" and own is not None:
            node["total_cost_usd"] = own
        else:
            node["total_cost_usd"] = round(
                sum(by_id[child]["total_cost_usd"] for child in node["children"]), 12
            )


def _totals(
    ordered: list[NodeDict], roots: list[str], by_id: dict[str, NodeDict]
) -> dict[str, Any]:
    llm = [n for n in ordered if n["kind"] == "llm"]
    tripped = [n for n in ordered if n["trip"] is not None]
    # The root chain's own spans (child chains are "root.N"): their totals are the ledger's.
    chains = [
        n for n in ordered if n["kind"] == "agent" and n["chain_id"] and "." not in n["chain_id"]
    ]
    chain_tokens = [n["tokens"] for n in chains if n["tokens"] is not None]
    chain_steps = [n["steps"] for n in chains if n["steps"] is not None]
    steps = sum(chain_steps) if chain_steps else None
    sent = [n["kind"] for n in ordered if n["decision"] not in (None, "HALT")]
    llm_sent, tools_sent = sent.count("llm"), sent.count("tool")
    admitted = llm_sent + tools_sent
    unsplit = [n for n in llm if n["input_tokens"] is None and n["output_tokens"] is None]
    call_tokens = sum((n["input_tokens"] or 0) + (n["output_tokens"] or 0) for n in llm)
    call_tokens += sum(n["tokens"] or 0 for n in unsplit)
    turns = [name for name in map(agent_name, ordered) if name is not None]
    return {
        "cost_usd": round(sum(by_id[r]["total_cost_usd"] for r in roots), 12),
        "tokens": sum(chain_tokens) if chain_tokens else call_tokens,
        "input_tokens": sum(n["input_tokens"] or 0 for n in llm),
        "output_tokens": sum(n["output_tokens"] or 0 for n in llm),
        "calls_without_usage": sum(1 for n in unsplit if n["decision"] != "HALT"),
        "steps": steps,
        "other_steps": steps - admitted if steps is not None and steps >= admitted else None,
        "nodes": len(ordered),
        "agents": len(set(turns)),
        "agent_names": sorted(set(turns)),
        "agent_turns": len(turns),
        "llm_calls": len(llm),
        "llm_sent": llm_sent,
        "tools_sent": tools_sent,
        "tool_calls": sum(1 for n in ordered if n["kind"] == "tool"),
        "denied_calls": sum(
            1 for n in ordered if n["kind"] in ("llm", "tool") and n["decision"] == "HALT"
        ),
        "errors": sum(1 for n in ordered if n["status"] == "error"),
        "tripped_nodes": len(tripped),
        "trip_reasons": sorted({n["trip"]["reason"] for n in tripped if n["trip"] is not None}),
    }
