"""Exporters: what ships a chain's execution graph and its spans out of the process.

- :class:`ExecutionGraphExporter` (``veronica_otel.exporters.graph``): one
  JSON graph and a self-contained HTML view per chain, with loop flags.
- :class:`OTLPJsonLinesSpanExporter` (``veronica_otel.exporters.otlp_json``):
  OTLP/JSON lines for offline files (needs the ``otlp`` extra; imported on
  first use, so the graph exporter works without it).
- :func:`load_graph`, :func:`render_text_tree`: read a graph file back and
  draw it in a terminal.

Both exporters are registered as ``opentelemetry_traces_exporter`` entry
points (``veronica_graph``, ``veronica_otlp_json``), so
``OTEL_TRACES_EXPORTER=otlp,veronica_graph`` works under
``opentelemetry-instrument``. Collectors and Jaeger are reached through the
standard OTLP exporters. These modules use the OpenTelemetry SDK; the kernel
never imports them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._graph_model import GraphDict
from ._graph_text import load_graph, render_text_tree
from .graph import ExecutionGraphExporter

if TYPE_CHECKING:
    from .otlp_json import OTLPJsonLinesSpanExporter

__all__ = [
    "ExecutionGraphExporter",
    "GraphDict",
    "OTLPJsonLinesSpanExporter",
    "load_graph",
    "render_text_tree",
]


def __getattr__(name: str) -> Any:
    # The OTLP/JSON exporter needs the optional ``otlp`` extra: import it on use.
    if name == "OTLPJsonLinesSpanExporter":
        from .otlp_json import OTLPJsonLinesSpanExporter

        return OTLPJsonLinesSpanExporter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
