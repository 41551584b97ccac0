"""Shared fixtures: one SDK tracer provider for the session, spans in memory."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator

import pytest
from opentelemetry import _logs, metrics, trace
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
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


_METRIC_READER = InMemoryMetricReader()
_LOG_EXPORTER = InMemoryLogRecordExporter()


@pytest.fixture(scope="session")
def metric_reader() -> InMemoryMetricReader:
    """The global SDK meter provider's reader (set once per session)."""
    if not isinstance(metrics.get_meter_provider(), MeterProvider):
        metrics.set_meter_provider(MeterProvider(metric_readers=[_METRIC_READER]))
    return _METRIC_READER


@pytest.fixture
def log_exporter() -> Iterator[InMemoryLogRecordExporter]:
    """OpenTelemetry log records emitted during this test."""
    if not isinstance(_logs.get_logger_provider(), LoggerProvider):
        provider = LoggerProvider()
        provider.add_log_record_processor(SimpleLogRecordProcessor(_LOG_EXPORTER))
        _logs.set_logger_provider(provider)
    _LOG_EXPORTER.clear()
    yield _LOG_EXPORTER
    _LOG_EXPORTER.clear()


@pytest.fixture(autouse=True)
def _fresh_endpoint_breakers() -> Iterator[None]:
    """Endpoint breakers are process-wide: no test inherits another's open circuit."""
    from veronica_otel.instrumentors._breakers import reset_endpoint_breakers

    reset_endpoint_breakers()
    yield
    reset_endpoint_breakers()


@pytest.fixture(autouse=True)
def _threads_left_alone() -> Iterator[None]:
    """Fail the test that leaves the chain following into threads after its teardown.

    An instrumentor left holding ``Thread.start`` / ``ThreadPoolExecutor.submit``
    (instrumented and never uninstrumented) would carry contexts into threads
    for whichever test runs next in this process, so tests would pass or fail
    by order (as ``test_threading``'s did under pytest-xdist).
    """
    yield
    threads = sys.modules.get("veronica_otel.instrumentors.threading")
    held = sorted(threads._holders) if threads is not None else []
    assert not held, f"the test left thread propagation on, held by {held}"


@pytest.fixture
def python_sigint() -> Iterator[None]:
    """Python's own SIGINT handler (KeyboardInterrupt), whatever this run inherited.

    A shell that runs the tests in the background, under ``nohup`` or a CI
    runner may start them with SIGINT ignored; Python then installs no handler
    and a test that delivers SIGINT would see nothing happen.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
