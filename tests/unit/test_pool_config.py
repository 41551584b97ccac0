"""Budget pools from configuration: the policy file's [pools], hot reload, VERONICA_POOLS, gauges.

Calls go through the real openai SDK to the fake server; its request
counts are the truth. Each test uses its own ledger (or pool names of its
own on the process ledger), so no test sees another's spend.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from tests._clock import FakeClock
from veronica_otel import (
    BudgetExceededError,
    BudgetPool,
    ExecutionConfig,
    ExecutionContext,
    _propagation,
)
from veronica_otel._ledger import LocalLedger
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.policy_file import PolicyFile, PolicyFileError, PoolRule
from veronica_otel.startup import distro
from veronica_otel.testing import FakeLLMServer

CHAT = "/v1/chat/completions"


def write(path: Path, text: str) -> Path:
    """Write ``text``, moving the modification time on so a reload always sees it."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text, encoding="utf-8")
    stamp = max(path.stat().st_mtime_ns, before + 1_000_000)
    os.utime(path, ns=(stamp, stamp))
    return path


def policy_file(tmp_path: Path, text: str, **kwargs: Any) -> PolicyFile:
    return PolicyFile(write(tmp_path / "policy.toml", text), **kwargs)


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=5) as fake:
        yield fake


@pytest.fixture
def client(server: FakeLLMServer) -> Iterator[openai.OpenAI]:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    try:
        with openai.OpenAI(base_url=server.openai_base_url, api_key="t", max_retries=0) as oai:
            yield oai
    finally:
        instrumentor.uninstrument()


def ask(client: openai.OpenAI) -> None:
    client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )


def run_task(client: openai.OpenAI, pool: BudgetPool, ledger: LocalLedger, calls: int) -> int:
    """One chain making up to ``calls`` calls; how many the pool let through."""
    sent = 0
    with ExecutionContext(ExecutionConfig(max_steps=100), ledger=ledger, pools=[pool]):
        for _ in range(calls):
            try:
                ask(client)
            except BudgetExceededError as exc:
                assert exc.pool == pool.name
                break
            sent += 1
    return sent


# -- the [pools] tables --------------------------------------------------------------


def test_pools_tables_parse_into_rules(tmp_path: Path) -> None:
    policy = policy_file(
        tmp_path,
        '[pools."tenant:acme"]\nmax_cost_usd = 50\nwindow = "1d"\n'
        '[pools."user:alice"]\nmax_steps = 10\nmax_tokens = 5000\nwindow = 3600\n'
        '[pools."org"]\nmax_cost_usd = 1.5\n',
    )
    pools = policy.current().pools
    assert pools["tenant:acme"] == PoolRule(
        "tenant:acme", 'pools."tenant:acme"', max_cost_usd=50.0, window="1d"
    )
    assert pools["user:alice"].max_steps == 10 and pools["user:alice"].max_tokens == 5000
    assert pools["org"].window is None
    acme = policy.pool("tenant:acme")
    assert (acme.max_cost_usd, acme.window_s) == (50.0, 86400.0)
    assert policy.pool("user:alice").window_s == 3600.0
    assert policy.pool("org").window_s is None


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ('[pools."a"]\nmax_cost_usd = -1\n', 'pools."a".max_cost_usd'),
        ('[pools."a"]\nmax_cost_usd = "5"\n', 'pools."a".max_cost_usd'),
        ('[pools."a"]\nmax_steps = 1.5\n', 'pools."a".max_steps'),
        ('[pools."a"]\nmax_tokens = true\n', 'pools."a".max_tokens'),
        ('[pools."a"]\nmax_steps = 1\nwindow = "1w"\n', 'pools."a".window'),
        ('[pools."a"]\nmax_steps = 1\nwindow = 0.5\n', 'pools."a".window'),
        ('[pools."a"]\nmax_steps = 1\nwindow = [1]\n', 'pools."a".window'),
        ('[pools."a"]\nmax_steps = 1\nlimit = 3\n', 'pools."a".limit'),
        ('[pools."a"]\nwindow = "1h"\n', 'pools."a"'),
        ('[pools."a b"]\nmax_steps = 1\n', 'pools."a b"'),
        ("pools = 3\n", "pools"),
    ],
)
def test_a_bad_pool_table_names_the_file_and_the_key(tmp_path: Path, body: str, key: str) -> None:
    with pytest.raises(PolicyFileError) as info:
        policy_file(tmp_path, body)
    assert info.value.key == key
    assert str(tmp_path / "policy.toml") in str(info.value)


def test_a_pool_the_file_does_not_define_is_a_value_error_naming_it(tmp_path: Path) -> None:
    policy = policy_file(tmp_path, '[pools."tenant:acme"]\nmax_steps = 1\n')
    with pytest.raises(ValueError, match=r"pool 'tenant:bob' is not defined.*'tenant:acme'"):
        policy.pool("tenant:bob")


# -- hot reload ----------------------------------------------------------------------


def test_a_reloaded_pool_limit_applies_to_the_next_call(
    tmp_path: Path, client: openai.OpenAI, server: FakeLLMServer
) -> None:
    clock = FakeClock(100.0)
    policy = policy_file(
        tmp_path, '[pools."tenant:acme"]\nmax_steps = 3\n', check_interval_s=1.0, clock=clock
    )
    ledger = LocalLedger()
    pool = policy.pool("tenant:acme", ledger=ledger)
    assert run_task(client, pool, ledger, 5) == 3
    assert server.count(CHAT) == 3
    write(policy.path, '[pools."tenant:acme"]\nmax_steps = 7\n')
    assert run_task(client, pool, ledger, 5) == 0  # not looked at yet: still 3
    clock.advance(1.0)
    assert run_task(client, pool, ledger, 5) == 4  # 7 in all, the 3 spent still count
    assert server.count(CHAT) == 7
    assert pool.max_steps == 7 and policy.version == 2
    # Lowered below what was spent: nothing more, and a new pool object agrees.
    write(policy.path, '[pools."tenant:acme"]\nmax_steps = 2\n')
    clock.advance(1.0)
    assert run_task(client, policy.pool("tenant:acme", ledger=ledger), ledger, 5) == 0
    assert server.count(CHAT) == 7


def test_a_reloaded_window_frees_old_spend_and_a_removed_pool_keeps_its_limits(
    tmp_path: Path, client: openai.OpenAI, server: FakeLLMServer
) -> None:
    clock = FakeClock(100.0)
    policy = policy_file(tmp_path, '[pools."p"]\nmax_steps = 2\n', check_interval_s=0, clock=clock)
    ledger = LocalLedger(clock=clock)
    pool = policy.pool("p", ledger=ledger)
    assert run_task(client, pool, ledger, 3) == 2
    write(policy.path, '[pools."p"]\nmax_steps = 2\nwindow = "60s"\n')
    assert run_task(client, pool, ledger, 3) == 0  # the lifetime spend counts from now
    clock.advance(61.0)
    assert run_task(client, pool, ledger, 3) == 2  # and leaves the window after 60 s
    write(policy.path, '[pools."other"]\nmax_steps = 9\n')
    clock.advance(61.0)
    assert run_task(client, pool, ledger, 3) == 2  # the last limits stay: 2 per 60 s
    assert pool.max_steps == 2 and pool.window_s == 60.0
    assert server.count(CHAT) == 6


def test_a_bad_new_version_keeps_the_pool_limits_in_force(
    tmp_path: Path, client: openai.OpenAI, server: FakeLLMServer
) -> None:
    policy = policy_file(tmp_path, '[pools."p"]\nmax_steps = 2\n', check_interval_s=0)
    ledger = LocalLedger()
    pool = policy.pool("p", ledger=ledger)
    write(policy.path, '[pools."p"]\nmax_steps = -5\n')
    assert run_task(client, pool, ledger, 4) == 2
    assert server.count(CHAT) == 2


# -- VERONICA_POOLS (zero code, in-process: the enforcement hooks are not installed) --


@pytest.fixture
def zero_code(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(distro, "_installed", True)
    yield
    _propagation.set_default_context(None)


@pytest.mark.usefixtures("zero_code")
def test_veronica_pools_joins_the_default_chain_to_the_files_pools(
    tmp_path: Path, client: openai.OpenAI, server: FakeLLMServer
) -> None:
    tenant, user = f"tenant:{uuid.uuid4().hex}", f"user:{uuid.uuid4().hex}"
    path = write(
        tmp_path / "policy.toml",
        f'[limits]\nmax_steps = 50\n[pools."{tenant}"]\nmax_steps = 4\n'
        f'[pools."{user}"]\nmax_steps = 3\nwindow = "1h"\n',
    )
    ctx = distro.install_zero_code(
        {"VERONICA_POLICY_FILE": str(path), "VERONICA_POOLS": f" {tenant} , {user}"}
    )
    assert ctx is not None
    assert [p.name for p in ctx.pools] == [tenant, user]
    sent = 0
    with pytest.raises(BudgetExceededError) as info:
        for _ in range(5):
            ask(client)  # no chain entered: the default chain
            sent += 1
    assert sent == 3 and server.count(CHAT) == 3
    assert info.value.pool == user
    assert info.value.retry_after_s is not None and 0 < info.value.retry_after_s <= 3600


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("tenant:acme,tenant:bob", "VERONICA_POOLS: pool 'tenant:bob' is not defined"),
        ("tenant:acme,,x", "VERONICA_POOLS='tenant:acme,,x': has an empty entry"),
        ("tenant acme", "VERONICA_POOLS='tenant acme': 'tenant acme' is not a pool name"),
        ("tenant:acme,tenant:acme", "lists pool 'tenant:acme' twice"),
        (",".join(f"p{i}" for i in range(17)), "VERONICA_POOLS: lists 17 pools"),
    ],
)
@pytest.mark.usefixtures("zero_code")
def test_a_bad_veronica_pools_refuses_calls_naming_the_variable(
    tmp_path: Path, value: str, expected: str
) -> None:
    path = write(tmp_path / "policy.toml", '[pools."tenant:acme"]\nmax_steps = 4\n')
    environ = {"VERONICA_POLICY_FILE": str(path), "VERONICA_POOLS": value}
    assert distro.install_zero_code(environ) is None
    with pytest.raises(ValueError) as info:
        _propagation.default_context()
    assert expected in str(info.value)


@pytest.mark.usefixtures("zero_code")
def test_veronica_pools_without_a_policy_file_refuses_calls() -> None:
    assert distro.install_zero_code({"VERONICA_POOLS": "tenant:acme"}) is None
    with pytest.raises(ValueError, match="VERONICA_POOLS is set but VERONICA_POLICY_FILE"):
        _propagation.default_context()


@pytest.mark.usefixtures("zero_code")
def test_the_default_chain_rebuilt_on_reload_keeps_its_pools(tmp_path: Path) -> None:
    name = f"tenant:{uuid.uuid4().hex}"
    path = write(
        tmp_path / "policy.toml", f'[limits]\nmax_steps = 5\n[pools."{name}"]\nmax_steps = 4\n'
    )
    clock = FakeClock(0.0)
    policy = PolicyFile(path, check_interval_s=0, clock=clock)
    from veronica_otel.policy_file import install_default_chain

    first = install_default_chain(policy, {}, pools=[policy.pool(name)])
    write(path, f'[limits]\nmax_steps = 6\n[pools."{name}"]\nmax_steps = 4\n')
    assert policy.refresh()
    rebuilt = _propagation.default_context()
    assert rebuilt is not first and rebuilt.config.max_steps == 6
    assert [p.name for p in rebuilt.pools] == [name]


# -- gauges --------------------------------------------------------------------------


def gauge(reader: InMemoryMetricReader, metric: str, pool: str) -> float | None:
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for found in scope.metrics:
                if found.name != metric:
                    continue
                for point in found.data.data_points:
                    if point.attributes.get("veronica.pool") == pool:
                        return float(point.value)
    return None


def test_gauges_report_each_pools_spent_and_remaining_usd(
    metric_reader: InMemoryMetricReader, client: openai.OpenAI, server: FakeLLMServer
) -> None:
    ledger = LocalLedger()
    name = f"tenant:{uuid.uuid4().hex}"
    pool = BudgetPool(name, max_cost_usd=1.0, window="1d", ledger=ledger)
    steps_only = BudgetPool(f"steps:{uuid.uuid4().hex}", max_steps=9, ledger=ledger)
    assert gauge(metric_reader, "veronica.pool.spent_usd", name) == 0.0
    assert gauge(metric_reader, "veronica.pool.remaining_usd", name) == 1.0
    with ExecutionContext(ExecutionConfig(max_steps=10), ledger=ledger, pools=[pool, steps_only]):
        ask(client)
        ask(client)
    spent = pool.snapshot().cost_usd
    assert spent > 0 and server.count(CHAT) == 2
    assert gauge(metric_reader, "veronica.pool.spent_usd", name) == pytest.approx(spent)
    assert gauge(metric_reader, "veronica.pool.remaining_usd", name) == pytest.approx(1.0 - spent)
    # A pool with no cost limit has spend but no remaining USD.
    assert gauge(metric_reader, "veronica.pool.spent_usd", steps_only.name) == pytest.approx(spent)
    assert gauge(metric_reader, "veronica.pool.remaining_usd", steps_only.name) is None


@pytest.mark.usefixtures("zero_code")
def test_a_pools_first_cost_limit_rebuilds_the_default_chain_so_calls_are_priced(
    tmp_path: Path,
) -> None:
    name = f"tenant:{uuid.uuid4().hex}"
    path = write(tmp_path / "policy.toml", f'[pools."{name}"]\nmax_steps = 4\n')
    policy = PolicyFile(path, check_interval_s=0, clock=FakeClock(0.0))
    from veronica_otel.policy_file import install_default_chain

    first = install_default_chain(policy, {}, pools=[policy.pool(name)])
    assert not first.has_cost_ceiling  # nothing to price calls for
    write(path, f'[pools."{name}"]\nmax_steps = 4\nmax_cost_usd = 0.5\n')
    assert policy.refresh()
    rebuilt = _propagation.default_context()
    assert rebuilt is not first and rebuilt.chain_id == first.chain_id
    assert rebuilt.has_cost_ceiling  # calls now reserve their worst case in the pool


def test_a_pool_denial_names_the_pool_on_the_trip_record_and_counter(
    metric_reader: InMemoryMetricReader,
    log_exporter: InMemoryLogRecordExporter,
    client: openai.OpenAI,
    server: FakeLLMServer,
) -> None:
    ledger = LocalLedger()
    name = f"tenant:{uuid.uuid4().hex}"
    pool = BudgetPool(name, max_steps=1, window="1h", ledger=ledger)
    ctx = ExecutionContext(ExecutionConfig(max_steps=10), ledger=ledger, pools=[pool])
    with ctx, pytest.raises(BudgetExceededError):
        ask(client)
        ask(client)
    assert server.count(CHAT) == 1
    records = [
        r.log_record
        for r in log_exporter.get_finished_logs()
        if r.log_record.attributes and r.log_record.attributes.get("veronica.pool") == name
    ]
    assert len(records) == 1
    attributes = records[0].attributes
    assert attributes is not None and attributes["veronica.chain.id"] == ctx.chain_id
    assert attributes["veronica.trip.reason"] == "steps"
    assert 3540 <= float(attributes["veronica.trip.retry_after_s"]) <= 3600  # type: ignore[arg-type]
    counted = 0
    data = metric_reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "veronica.trips":
                    for point in metric.data.data_points:
                        if point.attributes.get("veronica.pool") == name:
                            counted += int(point.value)
    assert counted == 1
