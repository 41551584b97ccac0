"""Traces read back from Jaeger's query API, and the execution graphs in them.

Jaeger v2 answers ``/api/v3/traces`` in the OTLP/JSON encoding
(``resourceSpans`` -> ``scopeSpans`` -> ``spans``). The spans are rebuilt as
SDK :class:`ReadableSpan` objects, so the graph exporter's own
``node_from_span`` turns them into graph nodes, and the terminal and HTML
views are the ones ``veronica-otel graph FILE`` shows.

Usage::

    from veronica_otel.exporters.jaeger_query import JaegerQuery, graphs_from_spans

    query = JaegerQuery("http://localhost:16686")
    for graph in graphs_from_spans(query.find("agent", limit=5)):
        print(render_text_tree(graph))

How spans become chains is the graph exporter's rule: a span with
``veronica.chain.id`` belongs to its root chain (``root.1`` is ``root``'s);
another span joins the chain of its nearest ancestor that has one, else the
first chain of its trace; a trace with no chain span is not a chain. A graph
is complete when its chain's own span is in it (Jaeger stores ended spans).
Standard library plus the OpenTelemetry SDK; it never writes anything.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util.types import AttributeValue

from ._graph_model import GraphDict, NodeDict, build_graph, chain_key, node_from_span

__all__ = ["JaegerQuery", "JaegerQueryError", "graphs_from_spans", "spans_from_otlp"]

_STATUS = {
    0: StatusCode.UNSET,
    1: StatusCode.OK,
    2: StatusCode.ERROR,
    "STATUS_CODE_UNSET": StatusCode.UNSET,
    "STATUS_CODE_OK": StatusCode.OK,
    "STATUS_CODE_ERROR": StatusCode.ERROR,
}
_KINDS = {
    1: SpanKind.INTERNAL,
    2: SpanKind.SERVER,
    3: SpanKind.CLIENT,
    4: SpanKind.PRODUCER,
    5: SpanKind.CONSUMER,
}
# OTLP span flags: bit 8 says whether bit 9 (the parent is remote) is known.
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200


class JaegerQueryError(Exception):
    """Jaeger could not be reached or refused the query (the message says which)."""


class JaegerQuery:
    """A client of one Jaeger's HTTP query API (``/api/v3``).

    Args:
        url: The query service, e.g. ``http://localhost:16686``.
        timeout: Seconds per request.
    """

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"url must be an http(s) URL like http://localhost:16686, got {url!r}")
        self.url = url.rstrip("/")
        self.timeout = timeout

    def trace(self, trace_id: str) -> list[ReadableSpan]:
        """The spans of one trace (32 hex digits); empty when Jaeger has no such trace."""
        clean = trace_id.strip().lower()
        if len(clean) != 32 or any(c not in "0123456789abcdef" for c in clean):
            raise ValueError(f"trace id must be 32 hex digits, got {trace_id!r}")
        document = self._get(f"/api/v3/traces/{clean}", {}, missing_ok=True)
        return [] if document is None else spans_from_otlp(document)

    def find(
        self, service: str, *, limit: int = 20, lookback: timedelta = timedelta(days=7)
    ) -> list[ReadableSpan]:
        """All spans of the ``limit`` most recent traces that ``service`` took part in."""
        if limit < 1:
            raise ValueError(f"limit must be a positive integer, got {limit!r}")
        now = datetime.now(UTC)
        params = {
            "query.service_name": service,
            "query.start_time_min": (now - lookback).isoformat().replace("+00:00", "Z"),
            "query.start_time_max": (now + timedelta(minutes=1)).isoformat().replace("+00:00", "Z"),
            "query.num_traces": str(limit),
        }
        document = self._get("/api/v3/traces", params, missing_ok=True)
        return [] if document is None else spans_from_otlp(document)

    def services(self) -> list[str]:
        """The services Jaeger has spans of."""
        document = self._get("/api/v3/services", {}, missing_ok=False) or {}
        found = document.get("services")
        return sorted(s for s in found if isinstance(s, str)) if isinstance(found, list) else []

    def _get(self, path: str, params: Mapping[str, str], *, missing_ok: bool) -> Any:
        url = self.url + path + (f"?{urllib.parse.urlencode(params)}" if params else "")
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as reply:
                body = reply.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and missing_ok:  # api/v3 says 404 for "no trace found"
                return None
            detail = exc.read(500).decode("utf-8", "replace").strip()
            raise JaegerQueryError(f"{url}: HTTP {exc.code} {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise JaegerQueryError(f"cannot reach Jaeger at {self.url}: {reason}") from None
        try:
            return json.loads(body)
        except ValueError as exc:
            raise JaegerQueryError(f"{url}: not a JSON answer ({exc})") from None


# -- OTLP/JSON -> SDK spans ----------------------------------------------------


def _id(value: object, size: int) -> int:
    """An id as Jaeger writes it: lowercase hex (OTLP/JSON) or base64 (protobuf JSON)."""
    if not isinstance(value, str) or not value:
        return 0
    if len(value) == 2 * size:
        try:
            return int(value, 16)
        except ValueError:
            pass
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return 0
    return int.from_bytes(raw, "big") if len(raw) == size else 0


def _int(value: object) -> int:
    try:
        return int(value)  # type: ignore[call-overload,no-any-return]
    except (TypeError, ValueError):
        return 0


def _value(any_value: object) -> AttributeValue | None:
    """One OTLP ``AnyValue`` (None for kinds a span attribute cannot hold)."""
    if not isinstance(any_value, dict):
        return None
    if "stringValue" in any_value:
        return str(any_value["stringValue"])
    if "boolValue" in any_value:
        return bool(any_value["boolValue"])
    if "intValue" in any_value:
        return _int(any_value["intValue"])
    if "doubleValue" in any_value:
        try:
            return float(any_value["doubleValue"])  # "NaN", "Infinity" arrive as strings
        except (TypeError, ValueError):
            return math.nan
    array = any_value.get("arrayValue")
    if isinstance(array, dict):
        items = [_value(item) for item in array.get("values") or []]
        scalars = [i for i in items if isinstance(i, str | bool | int | float)]
        return tuple(scalars)
    return None


def _attributes(pairs: object) -> dict[str, AttributeValue]:
    found: dict[str, AttributeValue] = {}
    for pair in pairs if isinstance(pairs, list) else []:
        if isinstance(pair, dict) and isinstance(pair.get("key"), str):
            value = _value(pair.get("value"))
            if value is not None:
                found[pair["key"]] = value
    return found


def _span(span: Mapping[str, Any], resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    trace_id = _id(span.get("traceId"), 16)
    flags = _int(span.get("flags"))
    context = SpanContext(trace_id, _id(span.get("spanId"), 8), False, TraceFlags(1))
    parent_id = _id(span.get("parentSpanId"), 8)
    parent = None
    if parent_id:
        remote = bool(flags & _HAS_IS_REMOTE and flags & _IS_REMOTE)
        parent = SpanContext(trace_id, parent_id, remote, TraceFlags(1))
    raw_status = span.get("status")
    status: Mapping[str, Any] = raw_status if isinstance(raw_status, dict) else {}
    code = _STATUS.get(status.get("code", 0), StatusCode.UNSET)
    message = status.get("message") if code is StatusCode.ERROR else None
    events = [
        Event(str(e.get("name", "")), _attributes(e.get("attributes")), _int(e.get("timeUnixNano")))
        for e in span.get("events") or []
        if isinstance(e, dict)
    ]
    kind = span.get("kind")
    return ReadableSpan(
        name=str(span.get("name", "")),
        context=context,
        parent=parent,
        resource=resource,
        attributes=_attributes(span.get("attributes")),
        events=events,
        kind=_KINDS.get(kind, SpanKind.INTERNAL) if isinstance(kind, int) else SpanKind.INTERNAL,
        status=Status(code, message if isinstance(message, str) else None),
        start_time=_int(span.get("startTimeUnixNano")),
        end_time=_int(span.get("endTimeUnixNano")),
        instrumentation_scope=scope,
    )


def spans_from_otlp(document: object) -> list[ReadableSpan]:
    """The spans in an OTLP/JSON document (Jaeger wraps it in ``{"result": ...}``)."""
    if isinstance(document, dict) and isinstance(document.get("result"), dict):
        document = document["result"]
    if not isinstance(document, dict):
        return []
    spans: list[ReadableSpan] = []
    for resource_spans in document.get("resourceSpans") or []:
        if not isinstance(resource_spans, dict):
            continue
        raw_resource = resource_spans.get("resource") or {}
        resource = Resource(_attributes(raw_resource.get("attributes")))
        for scope_spans in resource_spans.get("scopeSpans") or []:
            if not isinstance(scope_spans, dict):
                continue
            raw_scope = scope_spans.get("scope") or {}
            scope = InstrumentationScope(
                str(raw_scope.get("name", "")), raw_scope.get("version") or None
            )
            spans.extend(
                _span(span, resource, scope)
                for span in scope_spans.get("spans") or []
                if isinstance(span, dict)
            )
    return spans


# -- spans -> graphs -----------------------------------------------------------


def _chain_of(node: NodeDict, by_id: Mapping[str, NodeDict]) -> str | None:
    """The root chain of ``node``: its own, else its nearest ancestor's (cycle-safe)."""
    seen: set[str] = set()
    current: NodeDict | None = node
    while current is not None and current["id"] not in seen:
        if current["chain_id"]:
            return chain_key(current["chain_id"])
        seen.add(current["id"])
        parent = current["parent"]
        current = by_id.get(parent) if parent is not None else None
    return None


def graphs_from_spans(spans: Iterable[ReadableSpan]) -> list[GraphDict]:
    """One graph per chain in ``spans``, in the order the chains started."""
    traces: dict[str, dict[str, NodeDict]] = {}
    for span in spans:
        node = node_from_span(span)
        if node is not None:
            traces.setdefault(node["trace_id"], {})[node["id"]] = node
    chains: dict[str, list[NodeDict]] = {}
    for by_id in traces.values():
        ordered = sorted(by_id.values(), key=lambda n: (n["start"], n["id"]))
        keys = [_chain_of(node, by_id) for node in ordered]
        first = next((key for key in keys if key), None)
        if first is None:
            continue  # a trace with no chain in it is not a chain
        for node, key in zip(ordered, keys, strict=True):
            chains.setdefault(key or first, []).append(node)
    graphs = []
    for key, nodes in chains.items():
        chain_ids = sorted(n["chain_id"] for n in nodes if n["chain_id"])
        complete = any(n["chain_id"] == key and n["kind"] == "agent" for n in nodes)
        graphs.append(build_graph(min(chain_ids, key=len, default=key), nodes, complete=complete))
    return sorted(graphs, key=lambda g: (g["start"], g["chain_id"]))
