"""Per-agent limits in the kernel: arguments, the policy file's [agents], ledger levels.

In-process (LocalLedger) and through ``wrap_llm_call`` / ``begin_call``; the
real SDKs and a real Valkey are in tests/integration/test_agent_limits*.py.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from tests._clock import FakeClock
from veronica_otel import (
    BudgetExceededError,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    agent,
)
from veronica_otel._agent_limits import agent_level_id
from veronica_otel._ledger import LocalLedger
from veronica_otel._policy_schema import PolicyFileError, parse_policy
from veronica_otel._units import usd_to_nano
from veronica_otel.policy_file import PolicyFile
from veronica_otel.startup.policy_file import _DefaultChain


def _noop() -> None:
    return None


# -- bad arguments --------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "   ", "x" * 257, None, 3])
def test_a_bad_agent_name_is_a_value_error(name: object) -> None:
    with pytest.raises(ValueError, match="agent name"):
        agent(name, config=ExecutionConfig(max_steps=1))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"), [("timeout_ms", 1000), ("max_depth", 2), ("max_handoffs", 3)]
)
def test_a_limit_that_does_not_add_up_is_refused_by_name(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=rf"config\.{field} does not apply to an agent"):
        agent("researcher", config=ExecutionConfig(**{field: value}))  # type: ignore[arg-type]


def test_config_must_be_an_execution_config() -> None:
    with pytest.raises(TypeError, match="config must be an ExecutionConfig"):
        agent("researcher", config={"max_steps": 3})  # type: ignore[arg-type]


def test_bad_limit_values_are_refused_by_execution_config() -> None:
    with pytest.raises(ValueError, match="max_steps"):
        agent("r", config=ExecutionConfig(max_steps=-1))
    with pytest.raises(ValueError, match="max_cost_usd"):
        agent("r", config=ExecutionConfig(max_cost_usd=float("nan")))


@pytest.mark.parametrize(
    ("table", "match"),
    [
        (
            {"researcher": {"timeout_ms": 5}},
            r'agents\."researcher"\.timeout_ms: is not a known key',
        ),
        ({"researcher": {"max_steps": -1}}, r'agents\."researcher"\.max_steps = -1'),
        ({"researcher": {"max_steps": True}}, "must be a whole number"),
        ({"researcher": {"max_cost_usd": "1"}}, "must be a number of USD"),
        ({"researcher": {"max_repeats": 0}}, r'agents\."researcher"\.max_repeats = 0'),
        ({"researcher": {}}, r'agents\."researcher": has no rules'),
        ({" padded": {"max_steps": 1}}, "without surrounding spaces"),
        ({"x" * 257: {"max_steps": 1}}, "longer than 256"),
        ({"researcher": 3}, "must be a table"),
    ],
)
def test_policy_file_agents_are_validated(table: object, match: str) -> None:
    with pytest.raises(PolicyFileError, match=match):
        parse_policy({"agents": table}, "p.toml")


def test_policy_file_agents_parse() -> None:
    spec = parse_policy(
        {
            "agents": {
                "researcher": {"max_cost_usd": 0.2, "max_steps": 10},
                "a.b c": {"max_tokens": 5},
            }
        }
    )
    assert spec.agents["researcher"] == ExecutionConfig(max_cost_usd=0.2, max_steps=10)
    assert spec.agents["a.b c"] == ExecutionConfig(max_tokens=5)


# -- the limits, in-process -----------------------------------------------------


def test_each_limit_kind_binds_the_agent_only() -> None:
    cases = [
        (ExecutionConfig(max_tokens=100), WrapOptions(max_tokens=40, input_tokens=0), "tokens", 2),
        (ExecutionConfig(max_cost_usd=0.1), WrapOptions(cost_estimate_hint=0.03), "cost", 3),
        (ExecutionConfig(max_repeats=2), WrapOptions(signature="same call"), "loop", 2),
    ]
    for config, options, reason, allowed in cases:
        ran = 0

        def call() -> None:
            nonlocal ran
            ran += 1

        with ExecutionContext(ExecutionConfig(max_steps=100)) as ctx:
            with agent("a", config=config):
                for _ in range(allowed):
                    assert ctx.wrap_llm_call(call, options) is Decision.ALLOW
                with pytest.raises(BudgetExceededError) as err:
                    ctx.begin_call("llm", options).finish()
            assert (err.value.reason, err.value.agent) == (reason, "a"), config
            assert ctx.wrap_llm_call(call, options) is Decision.ALLOW  # outside the agent
            assert ctx.trip is None
        assert ran == allowed + 1


def test_retries_of_an_agent_are_bounded() -> None:
    with ExecutionContext(ExecutionConfig(max_retries_total=10)) as ctx:
        with agent("flaky", config=ExecutionConfig(max_retries_total=2)):
            ctx.consume_retry()
            ctx.consume_retry()
            with pytest.raises(BudgetExceededError) as err:
                ctx.consume_retry()
        assert (err.value.reason, err.value.agent) == ("retries", "flaky")
        ctx.consume_retry()  # the chain has retries left for others
        assert ctx.snapshot().retries == 3


def test_usage_over_the_reservation_trips_only_the_agent() -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=5.0)) as ctx:
        with agent("spender", config=ExecutionConfig(max_cost_usd=0.1)):
            # Reserved nothing, reported $0.50: the agent is past its ceiling.
            ctx.wrap_llm_call(lambda: ctx.record_usage(cost_usd=0.5))
            assert ctx.wrap_llm_call(_noop) is Decision.HALT
        assert ctx.trip is None
        assert ctx.wrap_llm_call(_noop) is Decision.ALLOW
        assert ctx.snapshot().cost_usd == pytest.approx(0.5)


def test_the_same_name_nested_is_counted_once_under_the_tighter_limit() -> None:
    ledger = LocalLedger()
    with ExecutionContext(ExecutionConfig(max_steps=100), ledger=ledger) as ctx:
        with (
            agent("r", config=ExecutionConfig(max_steps=5)),
            agent("r", config=ExecutionConfig(max_steps=3)),
        ):
            results = [ctx.wrap_llm_call(_noop) for _ in range(4)]
        level = ledger.snapshot(agent_level_id(ctx.chain_id, "r"))
    assert results.count(Decision.ALLOW) == 3
    assert level.steps == 3  # one level, one count per call


def test_a_denied_call_reserves_nothing_anywhere() -> None:
    ledger = LocalLedger()
    hint = WrapOptions(cost_estimate_hint=0.04)
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0), ledger=ledger) as ctx:
        with agent("a", config=ExecutionConfig(max_cost_usd=0.1)):
            ctx.wrap_llm_call(_noop, hint)
            ctx.wrap_llm_call(_noop, hint)
            assert ctx.wrap_llm_call(_noop, hint) is Decision.HALT  # 0.12 > 0.10
        chain = ledger.snapshot(ctx.chain_id)
        agent_state = ledger.snapshot(agent_level_id(ctx.chain_id, "a"))
    assert (chain.steps, chain.cost_nano, chain.reserved_nano) == (2, usd_to_nano(0.08), 0)
    assert (agent_state.steps, agent_state.reserved_nano) == (2, 0)


def test_agent_levels_go_with_their_chain() -> None:
    ledger = LocalLedger()
    ctx = ExecutionContext(ledger=ledger)
    with ctx, agent("a", config=ExecutionConfig(max_steps=3)):
        ctx.wrap_llm_call(_noop)
        with ctx.spawn_child() as child:
            child.wrap_llm_call(_noop)
    level = agent_level_id(ctx.chain_id, "a")
    assert ledger.snapshot(level).steps == 2
    del ctx, child
    gc.collect()
    assert len(ledger) == 0  # chain, child and agent level all dropped


def test_agent_level_ids_are_distinct_and_storable() -> None:
    names = ["a", "a b", "a%20b", "a/b", "{x}", "agent/x", "ü"]
    ids = {agent_level_id("root.1", n) for n in names}
    assert len(ids) == len(names)
    for level in ids:
        assert level.startswith("root.1:agent/")
        assert not any(c in level for c in "{} \t\r\n")


def test_agent_scope_without_limits_costs_no_ledger_level() -> None:
    ledger = LocalLedger()
    with ExecutionContext(ledger=ledger) as ctx, agent("plain"):
        ctx.wrap_llm_call(_noop)
        assert len(ledger) == 1  # the chain alone


def test_a_default_chain_rebuilt_by_a_reload_keeps_its_agents_counts(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "policy.toml"
    path.write_text('[limits]\nmax_steps = 50\n\n[agents."researcher"]\nmax_steps = 3\n')
    policy = PolicyFile(path, clock=clock)
    keeper = _DefaultChain(policy, {}, LocalLedger())
    policy.add_listener(keeper)  # as install_default_chain does, without the process default
    first = keeper.context
    with first, agent("researcher"):
        assert first.wrap_llm_call(_noop) is Decision.ALLOW
        assert first.wrap_llm_call(_noop) is Decision.ALLOW
    path.write_text('[limits]\nmax_steps = 600\n\n[agents."researcher"]\nmax_steps = 3\n')
    clock.advance(5.0)
    assert policy.refresh()
    second = keeper.context
    assert second is not first and second.chain_id == first.chain_id
    del first
    gc.collect()
    with second, agent("researcher"):
        assert second.wrap_llm_call(_noop) is Decision.ALLOW  # the researcher's 3rd
        assert second.wrap_llm_call(_noop) is Decision.HALT
    assert second.trip is None
