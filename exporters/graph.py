"""ExecutionGraphExporter: one JSON graph and one HTML view per chain.

Usage::

    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from veronica_otel.exporters.graph import ExecutionGraphExporter

    provider.add_span_processor(BatchSpanProcessor(ExecutionGraphExporter("graphs")))

or with zero code: ``OTEL_TRACES_EXPORTER=otlp,veronica_graph opentelemetry-instrument ...``.

Configuration: ``output_dir`` (constructor), else ``VERONICA_GRAPH_DIR``, else
``veronica-graph`` in the working directory (created on the first write).

How spans become chains:

- A span with ``veronica.chain.id`` belongs to its *root* chain (the id's
  first segment: child chains are ``root.1``, ``root.1.2``), so a chain and
  all its sub-agents are one graph. Other spans (an HTTP client span, your
  own spans) join the chain their trace belongs to; a trace with no chain
  span in it is not a chain and is never written.
- A chain is complete when its root span ends: ``invoke_workflow`` with no
  local parent, or the local root of a trace that carries the chain (a
  server request around a chain). Then ``<output_dir>/<chain>.json`` and
  ``<chain>.html`` are written, atomically (temporary file, then rename).
- Memory is bounded: at most ``max_chains`` chains are held, each with at
  most ``max_spans_per_chain`` spans (more are counted in the graph's
  ``dropped_spans``, not kept), and at most ``max_spans`` spans in all
  (about 1.2 KB each: some 60 MB at the default). A chain whose root has
  not ended within ``max_age_s`` (the zero-code default chain, a crash, a
  very long chain) is written as a *partial* graph (``"complete": false``)
  and let go; spans that arrive for it later are merged into its files. With ``max_chains`` chains
  open (or ``max_spans`` spans held), the oldest chain is let go unwritten
  (counted in ``evicted_chains``, logged): raise the limits if that happens.
  ``force_flush`` and ``shutdown`` write every chain still held.
- ``complete`` in a graph means its root span was seen to end.

Like every exporter here it never raises into the SDK: failures are logged
and reported as ``SpanExportResult.FAILURE`` or ``False``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from veronica_otel._attributes import CHAIN_ID, GEN_AI_OPERATION_NAME

from ._graph_html import render_html
from ._graph_model import NodeDict, build_graph, chain_key, node_from_span
from ._graph_text import load_graph, render_text_tree

# load_graph, render_html and render_text_tree are here too for the ``graph`` CLI.
__all__ = [
    "ENV_GRAPH_DIR",
    "ExecutionGraphExporter",
    "load_graph",
    "render_html",
    "render_text_tree",
]

_logger = logging.getLogger(__name__)

ENV_GRAPH_DIR = "VERONICA_GRAPH_DIR"
_DEFAULT_DIR = "veronica-graph"
_TRACE = "\x00trace:"  # keys of trace buffers; no chain id can start so
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass
class _Pending:
    """The spans of one chain (or of one trace not yet known to be a chain)."""

    key: str
    created: float
    is_chain: bool
    nodes: list[NodeDict] = field(default_factory=list)
    trace_ids: set[int] = field(default_factory=set)
    complete: bool = False
    dropped: int = 0


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _file_stem(key: str) -> str:
    return _UNSAFE.sub("_", key)[:128] or "chain"


class ExecutionGraphExporter(SpanExporter):
    """Group finished spans by chain and write each chain's graph (JSON and HTML).

    Args:
        output_dir: Where graph files go (``VERONICA_GRAPH_DIR``, else ``veronica-graph``).
        max_chains: Chains held in memory at once; beyond it the oldest is let go.
        max_spans_per_chain: Spans kept per chain; later ones are counted as dropped.
        max_spans: Spans held in all; beyond it the oldest chain is let go.
        max_age_s: A chain held this long without its root ending is written as partial.
        clock: Monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        output_dir: str | os.PathLike[str] | None = None,
        *,
        max_chains: int = 1000,
        max_spans_per_chain: int = 10_000,
        max_spans: int = 50_000,
        max_age_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if output_dir is None:
            output_dir = os.environ.get(ENV_GRAPH_DIR) or _DEFAULT_DIR
        self.output_dir = Path(output_dir)
        self._max_chains = _positive_int("max_chains", max_chains)
        self._max_spans = _positive_int("max_spans_per_chain", max_spans_per_chain)
        self._max_held = _positive_int("max_spans", max_spans)
        self._held_spans = 0  # nodes in all pending chains
        if (
            isinstance(max_age_s, bool)
            or not isinstance(max_age_s, int | float)
            or not math.isfinite(max_age_s)
            or max_age_s <= 0
        ):
            raise ValueError(f"max_age_s must be a positive number of seconds, got {max_age_s!r}")
        self._max_age_s = float(max_age_s)
        self._clock = clock
        self._lock = threading.Lock()  # guards the buffers below
        self._write_lock = threading.Lock()  # serialises file writes and merges
        self._pending: OrderedDict[str, _Pending] = OrderedDict()  # oldest first
        self._traces: dict[int, list[str]] = {}  # trace id -> chains seen in it
        self._written: OrderedDict[str, None] = OrderedDict()  # keys with files from us
        self._evicted: OrderedDict[str, int] = OrderedDict()  # key -> spans let go
        self.evicted_chains = 0  # chains let go unwritten because max_chains were open
        self._dir_ready = False  # output_dir made (checked again after a failed write)
        self._shutdown = False

    @property
    def held_chains(self) -> int:
        """Chains (and trace buffers) held in memory now; never more than ``max_chains``."""
        with self._lock:
            return len(self._pending)

    @property
    def held_spans(self) -> int:
        """Spans held in memory now; at most ``max_spans`` (plus the chain being added to)."""
        with self._lock:
            return self._held_spans

    # -- SpanExporter -------------------------------------------------------

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Take finished spans; write the chains they complete (or that aged out)."""
        if self._shutdown:
            return SpanExportResult.FAILURE
        try:
            ready: list[_Pending] = []
            with self._lock:
                for span in spans:
                    self._add(span, ready)
                self._expire(self._clock(), ready)
            return SpanExportResult.SUCCESS if self._write_all(ready) else SpanExportResult.FAILURE
        except Exception:
            _logger.exception("the execution graph exporter failed; spans were not written")
            return SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Write every chain held now (incomplete ones as partial graphs).

        Returns False when a write failed or ``timeout_millis`` ran out first
        (chains not written by then are kept for the next flush).
        """
        try:
            with self._lock:
                ready = [self._release(key) for key in list(self._pending)]
            return self._write_all([p for p in ready if p.is_chain], timeout_millis)
        except Exception:
            _logger.exception("flushing the execution graph exporter failed")
            return False

    def shutdown(self, timeout_millis: float = 30_000) -> None:
        """Write every chain still held, then refuse further spans."""
        if self._shutdown:
            return
        self.force_flush(int(timeout_millis))
        self._shutdown = True

    # -- grouping -----------------------------------------------------------

    def _add(self, span: ReadableSpan, ready: list[_Pending]) -> None:
        context = span.context
        if context is None:
            return
        attributes = span.attributes or {}
        trace_id = context.trace_id
        chain_id = attributes.get(CHAIN_ID)
        if isinstance(chain_id, str) and chain_key(chain_id):
            pending = self._pending_for(chain_key(chain_id), is_chain=True)
            self._link_trace(trace_id, pending)
        else:
            chain_id = None
            keys = self._traces.get(trace_id)
            if keys:  # the trace's chain, or its buffer while no chain span was seen
                pending = self._pending_for(keys[0], is_chain=not keys[0].startswith(_TRACE))
            else:
                pending = self._pending_for(f"{_TRACE}{trace_id:032x}", is_chain=False)
                pending.trace_ids.add(trace_id)
                self._traces[trace_id] = [pending.key]
        parent = span.parent
        local_root = parent is None or parent.is_remote
        completes = local_root and (
            chain_id is None or attributes.get(GEN_AI_OPERATION_NAME) == "invoke_workflow"
        )
        if len(pending.nodes) < self._max_spans or completes:
            node = node_from_span(span)
            if node is not None:
                pending.nodes.append(node)
                self._held_spans += 1
                while (
                    self._held_spans > self._max_held and next(iter(self._pending)) != pending.key
                ):
                    self._drop_oldest()
        else:
            if not pending.dropped:
                _logger.warning(
                    "chain %s has more than %d spans; later spans are counted, not kept",
                    pending.key,
                    self._max_spans,
                )
            pending.dropped += 1
        if not completes:
            return
        if chain_id is None:
            # A host span ended (a request around chains): every chain in its trace is done.
            for key in tuple(self._traces.get(trace_id, ())):
                done = self._release(key)
                if done.is_chain:
                    done.complete = True
                    ready.append(done)
        else:
            done = self._release(pending.key)
            done.complete = True
            ready.append(done)

    def _pending_for(self, key: str, *, is_chain: bool) -> _Pending:
        pending = self._pending.get(key)
        if pending is None:
            while len(self._pending) >= self._max_chains:
                self._drop_oldest()
            pending = _Pending(key, self._clock(), is_chain)
            lost = self._evicted.pop(key, None)
            if lost is not None:
                pending.dropped = lost
            self._pending[key] = pending
        return pending

    def _drop_oldest(self) -> None:
        """Over ``max_chains`` or ``max_spans``: let the oldest chain go unwritten.

        If more of it arrives later, its graph counts what was let go in ``dropped_spans``.
        """
        oldest = self._release(next(iter(self._pending)))
        if not oldest.is_chain:
            return
        self.evicted_chains += 1
        self._evicted[oldest.key] = oldest.dropped + len(oldest.nodes)
        if len(self._evicted) > 4 * self._max_chains:
            self._evicted.popitem(last=False)
        if self.evicted_chains == 1 or self.evicted_chains % 1000 == 0:
            _logger.warning(
                "over max_chains=%d or max_spans=%d; the oldest chains are let go "
                "unwritten (%d so far): raise the limits",
                self._max_chains,
                self._max_held,
                self.evicted_chains,
            )

    def _link_trace(self, trace_id: int, pending: _Pending) -> None:
        """Record that ``trace_id`` carries this chain; adopt spans buffered for the trace."""
        if trace_id in pending.trace_ids:
            return
        pending.trace_ids.add(trace_id)
        keys = self._traces.setdefault(trace_id, [])
        orphan_key = f"{_TRACE}{trace_id:032x}"
        if orphan_key in keys:
            keys.remove(orphan_key)
            orphan = self._pending.pop(orphan_key, None)
            if orphan is not None:
                room = max(0, self._max_spans - len(pending.nodes))
                pending.nodes.extend(orphan.nodes[:room])
                pending.dropped += orphan.dropped + max(0, len(orphan.nodes) - room)
                self._held_spans -= max(0, len(orphan.nodes) - room)
        if pending.key not in keys:
            keys.append(pending.key)

    def _release(self, key: str) -> _Pending:
        """Take a chain out of memory (the caller writes or drops it)."""
        pending = self._pending.pop(key)
        self._held_spans -= len(pending.nodes)
        for trace_id in pending.trace_ids:
            keys = self._traces.get(trace_id)
            if keys is not None:
                if key in keys:
                    keys.remove(key)
                if not keys:
                    del self._traces[trace_id]
        return pending

    def _expire(self, now: float, ready: list[_Pending]) -> None:
        """Chains held ``max_age_s`` or longer are written as partial graphs and let go."""
        while self._pending:
            oldest = next(iter(self._pending.values()))
            if now - oldest.created < self._max_age_s:
                return
            done = self._release(oldest.key)
            if done.is_chain:
                ready.append(done)

    def _restore(self, pending: _Pending) -> None:
        """Put back a chain that a timed-out flush did not write."""
        self._held_spans += len(pending.nodes)
        current = self._pending.get(pending.key)
        if current is None:
            self._pending[pending.key] = pending
            self._pending.move_to_end(pending.key, last=False)
            current = pending
        else:
            current.nodes[:0] = pending.nodes
            current.dropped += pending.dropped
            current.complete = current.complete or pending.complete
        for trace_id in pending.trace_ids:
            current.trace_ids.add(trace_id)
            keys = self._traces.setdefault(trace_id, [])
            if current.key not in keys:
                keys.append(current.key)

    # -- writing ------------------------------------------------------------

    def _write_all(self, ready: list[_Pending], timeout_millis: float | None = None) -> bool:
        deadline = None if timeout_millis is None else time.monotonic() + timeout_millis / 1000
        ok = True
        for index, pending in enumerate(ready):
            if deadline is not None and time.monotonic() > deadline:
                with self._lock:
                    for left in ready[index:]:
                        self._restore(left)
                _logger.warning("graph flush timed out; %d chains kept", len(ready) - index)
                return False
            try:
                self._write(pending)
            except Exception:
                ok = False
                self._dir_ready = False
                _logger.exception("writing the execution graph of chain %s failed", pending.key)
        return ok

    def _write(self, pending: _Pending) -> None:
        stem = _file_stem(pending.key)
        json_path = self.output_dir / f"{stem}.json"
        with self._write_lock:
            nodes, dropped, complete = pending.nodes, pending.dropped, pending.complete
            if pending.key in self._written and json_path.exists():
                # Spans that came after this chain was written: merge, newest kept first.
                earlier = load_graph(json_path)
                kept = earlier["nodes"][: max(0, self._max_spans - len(nodes))]
                nodes = [*kept, *nodes]
                dropped += earlier["dropped_spans"] + len(earlier["nodes"]) - len(kept)
                complete = complete or earlier["complete"]
            chain_ids = sorted(n["chain_id"] for n in nodes if n["chain_id"])
            chain_id = min(chain_ids, key=len) if chain_ids else pending.key
            graph = build_graph(chain_id, nodes, complete=complete, dropped_spans=dropped)
            if not self._dir_ready:
                self.output_dir.mkdir(parents=True, exist_ok=True)
                self._dir_ready = True
            _atomic_write(json_path, json.dumps(graph, separators=(",", ":"), allow_nan=False))
            _atomic_write(self.output_dir / f"{stem}.html", render_html(graph))
            self._written[pending.key] = None
            self._written.move_to_end(pending.key)
            while len(self._written) > 4 * self._max_chains:
                self._written.popitem(last=False)


def _atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new, never half."""
    # Unique per process and thread; writes within one exporter are serialised.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
