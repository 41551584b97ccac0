"""OTLPJsonLinesSpanExporter: spans as OTLP/JSON lines, for files Jaeger's UI can open.

Each ``export`` call appends one line: an ``ExportTraceServiceRequest`` in the
OTLP/JSON encoding (``resourceSpans`` -> ``scopeSpans`` -> ``spans``;
lowerCamelCase keys; enums as integers; 64-bit integers as decimal strings;
attribute values as ``AnyValue``; trace and span ids as lowercase hex, not
the base64 of the generic protobuf JSON mapping). That is the OpenTelemetry
file-exporter format: Jaeger's UI loads such a ``.jsonl`` file (Search ->
Upload), and the Collector's ``otlpjsonfile`` receiver reads it.

Usage::

    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from veronica_otel.exporters.otlp_json import OTLPJsonLinesSpanExporter

    provider.add_span_processor(BatchSpanProcessor(OTLPJsonLinesSpanExporter("traces.jsonl")))

or with zero code: ``OTEL_TRACES_EXPORTER=veronica_otlp_json opentelemetry-instrument ...``.

Configuration: ``path`` (constructor), else ``VERONICA_OTLP_JSON_PATH``, else
``veronica-traces.jsonl`` in the working directory. Needs the ``otlp`` extra
(``opentelemetry-exporter-otlp-proto-common`` and ``opentelemetry-proto``).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["ENV_OTLP_JSON_PATH", "OTLPJsonLinesSpanExporter", "encode_otlp_json"]

_logger = logging.getLogger(__name__)

ENV_OTLP_JSON_PATH = "VERONICA_OTLP_JSON_PATH"
_DEFAULT_PATH = "veronica-traces.jsonl"
_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def _hex(value: Any) -> Any:
    """A base64 id from the protobuf JSON mapping, as the lowercase hex OTLP/JSON wants."""
    if not isinstance(value, str):
        return value
    return base64.b64decode(value).hex()


def _hex_ids(item: dict[str, Any]) -> None:
    for key in _ID_KEYS:
        if key in item:
            item[key] = _hex(item[key])


def encode_otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """``spans`` as one ``ExportTraceServiceRequest`` in the OTLP/JSON encoding."""
    message: dict[str, Any] = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for resource_spans in message.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                _hex_ids(span)
                for link in span.get("links", ()):
                    _hex_ids(link)
    return message


class OTLPJsonLinesSpanExporter(SpanExporter):
    """Append each batch of spans to a file as one OTLP/JSON line.

    Args:
        path: The ``.jsonl`` file (``VERONICA_OTLP_JSON_PATH``, else
            ``veronica-traces.jsonl``); its folder is created when missing.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        if path is None:
            path = os.environ.get(ENV_OTLP_JSON_PATH) or _DEFAULT_PATH
        self.path = Path(path)
        self._lock = threading.Lock()
        self._shutdown = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Append ``spans`` as one line; never raises (failures are logged)."""
        if self._shutdown:
            return SpanExportResult.FAILURE
        if not spans:
            return SpanExportResult.SUCCESS
        try:
            line = json.dumps(encode_otlp_json(spans), separators=(",", ":"), ensure_ascii=False)
            with self._lock:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "a", encoding="utf-8") as handle:
                    handle.write(line + "\n")
        except Exception:
            _logger.exception("writing spans to %s failed", self.path)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Lines are written on export; nothing is buffered."""
        return True

    def shutdown(self) -> None:
        """Refuse further spans."""
        self._shutdown = True
