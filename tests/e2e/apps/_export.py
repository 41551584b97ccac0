"""The test apps' tracer provider: recording, and exporting over OTLP when asked.

With ``OTEL_EXPORTER_OTLP_ENDPOINT`` set, spans go there in batches, over
``grpc`` or ``http/protobuf`` as ``OTEL_EXPORTER_OTLP_PROTOCOL`` says (the
exporters read both variables themselves); the service name comes from
``OTEL_SERVICE_NAME``. The provider flushes at exit.
"""

from __future__ import annotations

import os

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter


def tracer_provider() -> TracerProvider:
    provider = TracerProvider()
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        provider.add_span_processor(BatchSpanProcessor(_otlp_exporter()))
    return provider


def _otlp_exporter() -> SpanExporter:
    if os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[assignment]
            OTLPSpanExporter,
        )
    return OTLPSpanExporter()
