"""Attach a span processor to the session's tracer provider for one test only.

OpenTelemetry sets the global provider once per process and has no way to
remove a processor, so each test adds a switch that forwards to its processor
and turns it off (and shuts the processor down) at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider

__all__ = ["attached"]


class _Switch(SpanProcessor):
    """Forwards to ``inner`` until switched off; a no-op afterwards."""

    def __init__(self, inner: SpanProcessor) -> None:
        self.inner: SpanProcessor | None = inner

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        inner = self.inner
        if inner is not None:
            inner.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        inner = self.inner
        if inner is not None:
            inner.on_end(span)

    def shutdown(self) -> None:
        self.inner = None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        inner = self.inner
        return True if inner is None else inner.force_flush(timeout_millis)


@contextmanager
def attached(provider: TracerProvider, processor: SpanProcessor) -> Iterator[SpanProcessor]:
    """Send the provider's finished spans to ``processor`` inside the block."""
    switch = _Switch(processor)
    provider.add_span_processor(switch)
    try:
        yield processor
    finally:
        switch.inner = None
        processor.shutdown()
