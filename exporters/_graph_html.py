"""The execution graph as one self-contained HTML page.

No external URL of any kind (styles and the small script are inline), so the
page works offline and from ``file://``. The tree is a table, one row per
span, indented by depth: name, kind, cost, tokens, duration, a timeline bar
and the decision. Trips are red, loop repeats orange; a row with children
has a toggle to collapse its subtree. A legend explains every badge. Every
string that came from span data is HTML-escaped; numbers are formatted here,
so nothing from a span reaches the page unescaped (a Content-Security-Policy
forbids loading anything too).
"""

from __future__ import annotations

from html import escape

from ._graph_model import GraphDict, LoopDict, NodeDict, describe_trip, node_cost
from ._graph_text import summary

__all__ = ["render_html"]

_MAX_INDENT = 40
_STATE_TITLE = {
    "complete": "the chain's root span ended",
    "partial": "written before the root span ended: numbers cover the spans received so far",
}

_CSS = """
:root { --trip: #c62828; --loop: #e65100; --bar: #5c6bc0; --muted: #6b6b6b; }
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1b1b1b; }
h1 { font-size: 1.3em; margin: 0 0 .4em; }
h2 { font-size: 1.05em; margin: 1.2em 0 .4em; }
code { font-family: ui-monospace, monospace; }
.badge { display: inline-block; padding: 0 .5em; border-radius: .8em; font-size: .8em;
  border: 1px solid currentColor; }
.complete { color: #2e7d32; } .partial { color: var(--muted); }
table { border-collapse: collapse; }
.totals td, .totals th { padding: .15em .9em .15em 0; text-align: left; }
.tree { width: 100%; margin-top: .6em; }
.tree th { text-align: left; font-weight: 600; border-bottom: 1px solid #ccc;
  padding: .2em .5em; position: sticky; top: 0; background: #fff; }
.tree td { padding: .15em .5em; border-bottom: 1px solid #eee; white-space: nowrap;
  vertical-align: middle; }
.tree td.num { text-align: right; font-variant-numeric: tabular-nums; }
.tree td.name { max-width: 36em; overflow: hidden; text-overflow: ellipsis; }
.kind { font-size: .8em; padding: 0 .4em; border-radius: .3em; background: #eceff1; }
.kind-agent .kind { background: #e3f2fd; } .kind-llm .kind { background: #ede7f6; }
.kind-tool .kind { background: #e8f5e9; }
.timeline { width: 28%; min-width: 10em; }
.bar { height: .7em; background: var(--bar); border-radius: 2px; min-width: 2px; }
tr.error td.name, tr.error .decision { color: var(--trip); }
tr.trip { background: #ffebee; } tr.trip td { color: var(--trip); }
tr.trip .bar { background: var(--trip); }
tr.loop td.name::after { content: " \\27F3 loop"; color: var(--loop); font-size: .85em; }
tr.trip.loop td.name::after { color: var(--trip); }
.loops li { color: var(--loop); }
.toggle { border: 0; background: none; cursor: pointer; width: 1.2em; padding: 0;
  font: inherit; color: inherit; }
.spacer { display: inline-block; width: 1.2em; }
tr.hidden { display: none; }
.controls button { margin-right: .5em; }
.legend { color: var(--muted); font-size: .85em; }
.legend-list { display: grid; grid-template-columns: max-content 1fr; gap: .25em 1em;
  font-size: .9em; }
.legend-list dt { text-align: right; } .legend-list dd { margin: 0; }
.trip-key { background: #ffebee; color: var(--trip); padding: 0 .3em; }
.error-key { color: var(--trip); } .loop-key { color: var(--loop); }
"""

_JS = """
(function () {
  var rows = Array.prototype.slice.call(document.querySelectorAll("tr.node"));
  function refresh() {
    var hideBelow = Infinity;
    rows.forEach(function (row) {
      var depth = Number(row.getAttribute("data-depth"));
      if (depth > hideBelow) { row.classList.add("hidden"); return; }
      hideBelow = Infinity;
      row.classList.remove("hidden");
      if (row.classList.contains("collapsed")) { hideBelow = depth; }
    });
  }
  function setAll(collapsed) {
    rows.forEach(function (row) {
      var button = row.querySelector("button.toggle");
      if (!button) { return; }
      row.classList.toggle("collapsed", collapsed);
      button.setAttribute("aria-expanded", String(!collapsed));
      button.textContent = collapsed ? "\\u25B8" : "\\u25BE";
    });
    refresh();
  }
  rows.forEach(function (row) {
    var button = row.querySelector("button.toggle");
    if (!button) { return; }
    button.addEventListener("click", function () {
      var collapsed = row.classList.toggle("collapsed");
      button.setAttribute("aria-expanded", String(!collapsed));
      button.textContent = collapsed ? "\\u25B8" : "\\u25BE";
      refresh();
    });
  });
  document.getElementById("expand-all").addEventListener("click", function () { setAll(false); });
  document.getElementById("collapse-all").addEventListener("click", function () { setAll(true); });
  document.body.setAttribute("data-ready", "true");  // the script ran (checked in a browser)
})();
"""


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _usd(value: float | None) -> str:
    if value is None:
        return ""
    return f"${value:.6f}" if value < 0.01 else f"${value:.4f}"


def _ms(value: float) -> str:
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.1f} ms"


def _tokens(node: NodeDict) -> str:
    if node["input_tokens"] is not None or node["output_tokens"] is not None:
        return f"{node['input_tokens'] or 0} / {node['output_tokens'] or 0}"
    return "" if node["tokens"] is None else str(node["tokens"])


def _decision(node: NodeDict) -> str:
    parts = []
    if node["decision"]:
        parts.append(_e(node["decision"]))
    trip = node["trip"]
    if trip is not None:
        parts.append("trip: " + _e(describe_trip(trip)))
    elif node["status"] == "error":
        parts.append("error")
    return " &middot; ".join(parts)


def _title(node: NodeDict, loops: list[LoopDict]) -> str:
    lines = [node["name"], f"kind: {node['kind']}", f"span: {node['id']}"]
    if node["chain_id"]:
        lines.append(f"chain: {node['chain_id']}")
    if node["model"]:
        lines.append(f"model: {node['model']}")
    if node["steps"] is not None:
        lines.append(f"steps: {node['steps']}")
    if node["status_message"]:
        lines.append(f"status: {node['status_message']}")
    lines.extend(f"loop: {loops[i]['label']}" for i in node["loops"] if i < len(loops))
    return _e("\n".join(lines)).replace("\n", "&#10;")


def _row(node: NodeDict, graph: GraphDict) -> str:
    classes = ["node", f"kind-{node['kind']}"]
    if node["trip"] is not None:
        classes.append("trip")
    if node["status"] == "error":
        classes.append("error")
    if node["loops"]:
        classes.append("loop")
    span_s = max(graph["end"] - graph["start"], 1e-9)
    left = min(100.0, max(0.0, (node["start"] - graph["start"]) / span_s * 100))
    width = min(100.0 - left, max(0.0, (node["end"] - node["start"]) / span_s * 100))
    indent = min(node["depth"], _MAX_INDENT) * 1.2
    toggle = (
        '<button class="toggle" type="button" aria-expanded="true" '
        'aria-label="collapse or expand">&#9662;</button>'
        if node["children"]
        else '<span class="spacer"></span>'
    )
    cost = node_cost(node)
    return (
        f'<tr class="{" ".join(classes)}" data-depth="{node["depth"]}" '
        f'title="{_title(node, graph["loops"])}">'
        f'<td class="name" style="padding-left:{indent:.1f}em">{toggle}{_e(node["name"])}</td>'
        f'<td><span class="kind">{_e(node["kind"])}</span></td>'
        f'<td class="num">{_usd(cost)}</td>'
        f'<td class="num">{_tokens(node)}</td>'
        f'<td class="num">{_ms(node["duration_ms"])}</td>'
        f'<td class="timeline"><div class="bar" style="margin-left:{left:.3f}%;'
        f'width:{width:.3f}%"></div></td>'
        f'<td class="decision">{_decision(node)}</td></tr>'
    )


def _totals(graph: GraphDict) -> str:
    figures = summary(graph)
    reasons = ", ".join(_e(r) for r in graph["totals"].get("trip_reasons", [])) or "none"
    cells = [
        ("cost", _usd(float(graph["totals"].get("cost_usd", 0.0)))),
        ("tokens", _e(figures["tokens"])),
        ("steps", _e(figures["steps"])),
        ("LLM calls", _e(figures["llm"])),
        ("tool calls", _e(figures["tools"])),
        ("agents", _e(figures["agents"])),
        ("trips", reasons),
        ("duration", _ms(graph["duration_ms"])),
    ]
    if graph["dropped_spans"]:
        cells.append(("spans dropped (over the per-chain cap)", str(graph["dropped_spans"])))
    rows = "".join(
        f'<tr data-total="{label}"><th>{label}</th><td>{value}</td></tr>' for label, value in cells
    )
    return f'<table class="totals">{rows}</table>'


_LEGEND = (
    (
        '<span class="badge complete">complete</span>',
        "the chain's root span ended; every span it sent is here",
    ),
    (
        '<span class="badge partial">partial</span>',
        "written before the root span ended (a long or default chain, a crash): "
        "the numbers cover the spans received so far",
    ),
    (
        '<span class="kind-agent"><span class="kind">agent</span></span>',
        "the chain (<code>invoke_workflow</code>) or one agent's turn; "
        "its cost is the total, children included",
    ),
    ('<span class="kind-llm"><span class="kind">llm</span></span>', "a model call, one step"),
    ('<span class="kind-tool"><span class="kind">tool</span></span>', "a tool call, one step"),
    ('<span class="kind">other</span>', "a span of your own or an HTTP client span; not a step"),
    (
        "ALLOW / HALT",
        "the pre-call check: a call marked HALT was denied and never sent (it costs "
        "nothing); a chain marked HALT tripped",
    ),
    (
        '<span class="trip-key">trip</span>',
        "a red row: the limit that stopped the chain (limit, observed), on the denied call "
        "and on the chain",
    ),
    ('<span class="error-key">error</span>', "a red name: the span ended in error"),
    (
        '<span class="loop-key">&#10227; loop</span>',
        "a repeat in a loop listed under Loops; the call that began it is not marked",
    ),
)


def _legend() -> str:
    items = "".join(f"<dt>{key}</dt><dd>{text}</dd>" for key, text in _LEGEND)
    return f'<h2>Legend</h2><dl class="legend-list">{items}</dl>'


def _loops(graph: GraphDict) -> str:
    if not graph["loops"]:
        return "<h2>Loops</h2><p>None found.</p>"
    items = "".join(
        f"<li>{_e(loop['label'])}"
        + ("" if loop["exact"] else " (same call shape; inputs not recorded)")
        + "</li>"
        for loop in graph["loops"]
    )
    return f'<h2>Loops</h2><ul class="loops">{items}</ul>'


def render_html(graph: GraphDict) -> str:
    """The whole page for ``graph`` (a document from ``build_graph``)."""
    state = "complete" if graph["complete"] else "partial"
    chain = _e(graph["chain_id"])
    rows = "\n".join(_row(node, graph) for node in graph["nodes"])
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">"
        f"<title>veronica chain {chain}</title><style>{_CSS}</style></head><body>\n"
        f'<h1>Chain <code>{chain}</code> <span class="badge {state}" '
        f'title="{_STATE_TITLE[state]}">{state}</span></h1>\n'
        f"{_totals(graph)}\n{_loops(graph)}\n"
        '<h2>Call tree</h2><div class="controls">'
        '<button id="expand-all" type="button">Expand all</button>'
        '<button id="collapse-all" type="button">Collapse all</button>'
        '<span class="legend">red: trip or error &middot; orange: loop &middot; '
        "agent cost is the chain's total, children included (see the legend below)"
        "</span></div>\n"
        '<table class="tree"><thead><tr><th>span</th><th>kind</th><th>cost</th>'
        "<th>tokens in / out</th><th>duration</th><th>timeline</th><th>decision</th>"
        f"</tr></thead><tbody>\n{rows}\n</tbody></table>\n{_legend()}\n"
        f"<script>{_JS}</script></body></html>\n"
    )
