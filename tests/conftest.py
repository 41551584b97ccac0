"""Shared fixtures: one SDK tracer provider for the session, spans in memory."""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.configuration import set_hypothesis_home_dir
from hypothesis.database import DirectoryBasedExampleDatabase
from opentelemetry import _logs, metrics, trace
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_CACHE = Path(os.environ.get("VERONICA_E2E_CACHE", Path.home() / ".cache" / "veronica-otel-e2e"))

# Hypothesis keeps what it stores (failing examples, the constants it scans the
# sources for) outside the clone, not in .hypothesis/.
set_hypothesis_home_dir(_CACHE / "hypothesis")
# On a busy machine generating an example or running one can take seconds: that
# is the machine, not the code, so neither fails a test (the example counts stay).
settings.register_profile(
    "veronica",
    database=DirectoryBasedExampleDatabase(_CACHE / "hypothesis" / "examples"),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("veronica")

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


@pytest.fixture(scope="session")
def zero_code_scripts() -> Iterator[Any]:
    """One zero-code process running unchanged scripts as scenarios, for every module
    of this worker that runs them (:func:`tests._zero_code.script_scenarios`): its
    start-up and openai's import once, not once per module. A module aims its runs
    at its own server with :class:`tests._zero_code.ScriptRuns`."""
    from tests._zero_code import script_scenarios
    from veronica_otel.testing import FakeLLMServer

    with FakeLLMServer() as unused, script_scenarios(unused) as scripts:
        yield scripts


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


# -- Order and placement under pytest-xdist ----------------------------------------------
#
# The longest tests (apps in fresh venvs, servers, long property runs) start first,
# so that none of them begins near the end and stretches the run's tail while the
# other workers sit idle: modules run in order of the time their tests took last
# time (recorded outside the clone), tests inside a module in their own order; with
# nothing recorded, tests/e2e first. The controller reads the record once and hands
# it to its workers, which must all collect in the same order.
# Under ``--dist loadgroup`` (scripts/check.sh) the modules below run on one worker,
# so their module-scoped servers and runs happen once, not once per worker that
# draws one of their tests. The scheduler groups them by module itself
# (``pytest_xdist_make_scheduler``): xdist 3.8 tells its scheduler a test's
# ``xdist_group`` by appending it to the test's id, which pytest 9.2's structured
# ids silently drop (pytest-dev/pytest-xdist#1386), and every group was spread over
# the workers, its module fixtures run again on each. A library those modules
# import is then imported by one worker, not by each.

_DURATIONS = _CACHE / "test-durations.json"
_ONE_WORKER = {
    "tests/e2e/test_jaeger.py": "jaeger",  # a Jaeger and a Collector
    "tests/e2e/test_grant_fanout.py": "grant_fanout",  # Valkey and two services
    "tests/e2e/test_two_services.py": "two_services",
    # module fixtures that run subprocesses, their tests only read the result:
    "tests/e2e/test_stainless_majors.py": "stainless_majors",  # one run per older SDK
    "tests/e2e/test_release_build.py": "release_build",  # sdist and wheel built once
    "tests/e2e/test_cli_errors.py": "cli_errors",  # one demo run (tests/e2e/conftest.py)
    "tests/e2e/test_numbers.py": "cli_errors",  # reads the same run
    "tests/e2e/test_doc_pages.py": "doc_pages",  # the pages' snippets run once
    # one app process per framework serves all its tests (tests/e2e/_frameworks.py):
    "tests/e2e/test_frameworks_openai_2.py": "frameworks_openai_2",
    "tests/e2e/test_frameworks_openai_3.py": "frameworks_openai_3",
    "tests/e2e/test_frameworks_text_and_ag2.py": "frameworks_text_and_ag2",
    "tests/e2e/test_frameworks_gemini_bedrock.py": "frameworks_gemini_bedrock",
    "tests/e2e/test_examples.py": "examples",  # each example run once, read by many tests
    "tests/e2e/test_zero_code.py": "zero_code",  # one zero-code process serves its scenarios
    "tests/integration/test_zero_code_redis.py": "zero_code",  # the same process serves it
    "tests/integration/test_redis_cluster.py::"
    "test_two_unchanged_processes_share_a_chain_on_the_cluster": "zero_code",  # likewise
    # a single test (every parametrisation of it) sharing its module fixture's runs:
    "tests/e2e/test_real_installs.py::test_each_peer_in_either_order_leaves_every_limit_exact": (
        "real_installs_peers"
    ),
    # tests reading the runs of one module fixture (``started``):
    **{
        f"tests/e2e/test_real_installs.py::{test}": "real_installs_started"
        for test in (
            "test_standard_recipe_sends_exactly_max_steps",
            "test_standard_recipe_reports_a_malformed_value_and_refuses_calls",
            "test_threads_follow_the_chain_unless_turned_off",
            "test_zero_code_propagates_to_your_service_and_sends_vendors_no_baggage",
        )
    },
    # Modules whose tests import an SDK or framework in the worker (none imports one at its
    # top, so a worker that runs none of their tests never imports it). ag2 (~3 CPU-s
    # itself) imports anthropic, google-genai, mistralai, boto3, ollama and mcp too, so the
    # other modules of those SDKs go with it, and litellm (~4 CPU-s):
    "tests/integration/test_agent_limits_ag2.py": "ag2",
    "tests/integration/test_ag2.py": "ag2",
    "tests/integration/test_threads_by_default.py": "ag2",
    "tests/integration/test_litellm_instrumentor.py": "ag2",
    "tests/integration/test_counted_once.py": "ag2",
    "tests/integration/test_google_genai_instrumentor.py": "ag2",
    "tests/integration/test_google_genai_live.py": "ag2",
    "tests/integration/test_mistralai_instrumentor.py": "ag2",
    "tests/integration/test_cohere_instrumentor.py": "ag2",
    "tests/integration/test_bedrock_instrumentor.py": "ag2",
    "tests/integration/test_ollama_instrumentor.py": "ag2",
    "tests/integration/test_billable_endpoints.py": "ag2",
    "tests/integration/test_runaway_server.py": "ag2",
    "tests/integration/test_mcp_instrumentor.py": "ag2",
    # anthropic (~1.5 CPU-s), LangChain and LangGraph (~1.4), groq:
    "tests/unit/test_endpoint_table.py": "anthropic",  # each SDK's resources walked once
    # ... and openai's resource modules walked again (every one imported, its
    # sources read) where they already are, not on a worker of their own:
    "tests/integration/test_openai_realtime.py::"
    "test_every_websocket_manager_of_the_sdk_is_hooked": "anthropic",
    "tests/integration/test_anthropic_instrumentor.py": "anthropic",
    "tests/integration/test_failure_paths_anthropic.py": "anthropic",
    "tests/integration/test_deployment_model_ids.py": "anthropic",
    "tests/integration/test_every_send_counts.py": "anthropic",
    "tests/integration/test_utilisation.py": "anthropic",
    "tests/integration/test_worst_case.py": "anthropic",
    "tests/integration/test_fake_server.py": "anthropic",
    "tests/integration/test_sdk_drift.py": "anthropic",
    "tests/integration/test_langchain.py": "anthropic",
    "tests/integration/test_langgraph_nodes.py": "anthropic",
    "tests/integration/test_groq_instrumentor.py": "anthropic",
    "tests/integration/test_redis_numbers.py": "anthropic",  # one anthropic test each
    "tests/unit/test_front_lanes.py": "anthropic",
}


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _group(nodeid: str) -> str | None:
    """The one-worker group of a test: its own (any parametrisation), else its module's."""
    return _ONE_WORKER.get(nodeid.split("[", 1)[0]) or _ONE_WORKER.get(_module(nodeid))


def _recorded() -> dict[str, float]:
    try:
        record = json.loads(_DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in record.items()} if isinstance(record, dict) else {}


_LAST = functools.cache(_recorded)  # read once per process
_TAKEN: dict[str, float] = {}  # this run's seconds per test (the controller's, under xdist)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_configure_node(node: Any) -> None:
    """xdist's controller hands its workers one record, so they all sort alike."""
    node.workerinput["veronica_durations"] = _LAST()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workerinput = getattr(config, "workerinput", None)
    record: dict[str, float] = workerinput["veronica_durations"] if workerinput else _LAST()
    per_module: dict[str, float] = {}
    for nodeid, seconds in record.items():
        per_module[_module(nodeid)] = per_module.get(_module(nodeid), 0.0) + seconds
    items.sort(
        key=lambda item: (-per_module.get(_module(item.nodeid), 0.0), "/e2e/" not in item.nodeid)
    )


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own scheduler factory
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """loadgroup, with ``_ONE_WORKER``'s modules and tests grouped by their ids."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class _ModuleGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            group = _group(nodeid)
            return group if group is not None else super()._split_scope(nodeid)

    return _ModuleGroups(config, log)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    nodeid = report.nodeid.split("@", 1)[0]  # loadgroup's suffix off
    _TAKEN[nodeid] = _TAKEN.get(nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Record what each test took (the controller, or a run without xdist)."""
    if hasattr(session.config, "workerinput") or not _TAKEN:
        return
    record = {**_recorded(), **_TAKEN}
    _DURATIONS.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=_DURATIONS.parent, delete=False) as out:
        json.dump(record, out)
    os.replace(out.name, _DURATIONS)
