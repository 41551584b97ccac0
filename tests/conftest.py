"""Shared fixtures: one SDK tracer provider for the session, spans in memory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="session")
def tracer_provider() -> TracerProvider:
    """The global SDK provider (OpenTelemetry allows setting it once)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    return provider


@pytest.fixture
def span_exporter(tracer_provider: TracerProvider) -> Iterator[InMemorySpanExporter]:
    """Finished spans of this test only."""
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()
