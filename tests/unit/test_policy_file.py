"""The declarative policy file: strict validation, enforcement, prices, reload.

Under zero code, the file is tested in ``tests/e2e/test_zero_code.py``.

Reloads are driven by an injected clock and by rewriting the file with a new
modification time (``os.utime``): no test sleeps.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests._clock import FakeClock
from veronica_otel import (
    BudgetExceededError,
    ExecutionConfig,
    ExecutionContext,
    PolicyContext,
    PolicyDecision,
    PolicyPipeline,
    UnitPrices,
    WrapOptions,
    _policy_rules,
    _propagation,
)
from veronica_otel._policy_schema import parse_policy
from veronica_otel._tools import ToolCall, set_tool_prices, tool_price_usd
from veronica_otel._units import nano_to_usd
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.policy_file import (
    FilePolicy,
    ModelRule,
    PolicyFile,
    PolicyFileError,
    PolicyFileListener,
    PolicySpec,
    ToolRule,
    install_default_chain,
)
from veronica_otel.testing import FakeLLMServer

GOOD_TOML = """\
unknown_model_price_usd_per_mtok = 5.0

[limits]
max_cost_usd = 2.0
max_steps = 100

[prices."openai:my-finetune"]
input = 3.0
output = 12.0
cached_input = 1.5

[models."gpt-4o"]
fallback = "gpt-4o-mini"
max_tokens = 1000
max_calls = 50

[tools."web_search"]
max_calls = 10
"""

GOOD_YAML = """\
unknown_model_price_usd_per_mtok: 5.0
limits:
  max_cost_usd: 2.0
  max_steps: 100
prices:
  "openai:my-finetune": {input: 3.0, output: 12.0, cached_input: 1.5}
models:
  gpt-4o:
    fallback: gpt-4o-mini
    max_tokens: 1000
    max_calls: 50
tools:
  web_search:
    max_calls: 10
"""

CHAT = "/v1/chat/completions"


class Recorder(PolicyFileListener):
    def __init__(self) -> None:
        self.reloads: list[PolicySpec] = []
        self.errors: list[PolicyFileError] = []

    def on_reload(self, policy_file: PolicyFile, spec: PolicySpec) -> None:
        self.reloads.append(spec)

    def on_error(self, policy_file: PolicyFile, error: PolicyFileError) -> None:
        self.errors.append(error)


class Deny:
    """A policy after the file's that denies everything."""

    policy_type = "deny"

    def check(self, context: PolicyContext) -> PolicyDecision:
        return PolicyDecision(False, self.policy_type, "no", trip_reason="steps")

    def reset(self) -> None:
        pass


_MTIME = [1_700_000_000 * 10**9]


def write(path: Path, text: str) -> Path:
    """Write ``text`` and give the file a new modification time, as an edit would."""
    path.write_text(text, encoding="utf-8")
    _MTIME[0] += 10**9
    os.utime(path, ns=(_MTIME[0], _MTIME[0]))
    return path


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1000.0)


@pytest.fixture
def policy_path(tmp_path: Path) -> Path:
    return write(tmp_path / "policy.toml", GOOD_TOML)


@pytest.fixture
def policy(policy_path: Path, clock: FakeClock) -> PolicyFile:
    return PolicyFile(policy_path, check_interval_s=1.0, clock=clock)


def rules(text: str, tmp_path: Path, clock: FakeClock | None = None) -> PolicyFile:
    return PolicyFile(write(tmp_path / "rules.toml", text), clock=clock or FakeClock(1000.0))


def chain(policy: PolicyFile, config: ExecutionConfig | None = None, **kw: Any) -> ExecutionContext:
    return ExecutionContext(config, PolicyPipeline([FilePolicy(policy), *kw.pop("then", ())]), **kw)


# -- parsing and validation ------------------------------------------------------------


def test_a_full_toml_policy_parses(policy: PolicyFile) -> None:
    spec = policy.current()
    assert policy.version == 1
    assert spec.limits == ExecutionConfig(max_cost_usd=2.0, max_steps=100)
    assert spec.unknown_model_price_usd_per_mtok == 5.0
    assert spec.prices == {"openai:my-finetune": UnitPrices.from_usd_per_mtok(3.0, 12.0, 1.5)}
    assert spec.models == {
        "gpt-4o": ModelRule("gpt-4o", 'models."gpt-4o"', "gpt-4o-mini", 1000, 50)
    }
    assert spec.tools == {"web_search": ToolRule("web_search", 'tools."web_search"', 10)}


@pytest.mark.parametrize("suffix", [".yaml", ".yml"])
def test_yaml_gives_the_same_policy_as_toml(
    suffix: str, tmp_path: Path, policy: PolicyFile
) -> None:
    yaml_policy = PolicyFile(write(tmp_path / f"policy{suffix}", GOOD_YAML))
    assert yaml_policy.current() == policy.current()


def test_an_empty_file_is_an_empty_policy(tmp_path: Path) -> None:
    assert PolicyFile(write(tmp_path / "p.toml", "")).current() == PolicySpec()
    assert PolicyFile(write(tmp_path / "p.yaml", "")).current() == PolicySpec()


def test_a_yaml_key_written_twice_is_rejected_not_overwritten(tmp_path: Path) -> None:
    text = "models:\n  gpt-4o:\n    max_calls: 1\n  gpt-4o:\n    max_tokens: 3\n"
    with pytest.raises(PolicyFileError, match=r"gpt-4o: is defined twice \(line 4\)"):
        PolicyFile(write(tmp_path / "p.yaml", text))


def test_yaml_without_pyyaml_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml now raises ImportError
    path = write(tmp_path / "p.yaml", GOOD_YAML)
    with pytest.raises(PolicyFileError, match="needs PyYAML") as info:
        PolicyFile(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ("surprise = 1", "surprise", "not a known key"),
        ("[limits]\nmax_step = 3", "limits.max_step", "not a known key"),
        ("[limits]\nmax_steps = -1", "limits.max_steps = -1", ">= 0"),
        ("[limits]\nmax_steps = 2.5", "limits.max_steps = 2.5", "whole number"),
        ("[limits]\nmax_steps = true", "limits.max_steps = True", "whole number"),
        ("[limits]\nmax_steps = 10000000000000000", "limits.max_steps", "absurdly large"),
        ("[limits]\nmax_cost_usd = nan", "limits.max_cost_usd = nan", "finite"),
        ("[limits]\nmax_cost_usd = inf", "limits.max_cost_usd = inf", "finite"),
        ("[limits]\nmax_cost_usd = -2", "limits.max_cost_usd = -2", ">= 0"),
        ("[limits]\nmax_cost_usd = '2'", "limits.max_cost_usd = '2'", "number of USD"),
        ("[limits]\nmax_cost_usd = false", "limits.max_cost_usd = False", "number of USD"),
        ("[limits]\nmax_repeats = 0", "limits.max_repeats = 0", ">= 1"),
        ("limits = 3", "limits = 3", "must be a table"),
        ("unknown_model_price_usd_per_mtok = -1", "unknown_model_price_usd_per_mtok", ">= 0"),
        ('[prices."m"]\ninput = 1.0', 'prices."m".output', "is required"),
        ('[prices."m"]\ninput = -1\noutput = 1', 'prices."m".input = -1', ">= 0"),
        ('[prices."m"]\ninput = 1\noutput = inf', 'prices."m".output = inf', "finite"),
        ('[prices."m"]\ninput = 1\noutput = 1\ncached = 1', 'prices."m".cached', "known key"),
        ('[prices."M"]\ninput = 1\noutput = 1\n[prices."m"]\ninput = 2\noutput = 2', "", "same"),
        ('[models."gpt-4o"]\nmax_tokens = 0', 'models."gpt-4o".max_tokens = 0', ">= 1"),
        ('[models."gpt-4o"]\nmax_tokens = -5', 'models."gpt-4o".max_tokens = -5', ">= 0"),
        ('[models."gpt-4o"]\nmax_calls = 1.0', 'models."gpt-4o".max_calls = 1.0', "whole"),
        ('[models."gpt-4o"]\nmax_calls = -1', 'models."gpt-4o".max_calls = -1', ">= 0"),
        ('[models."gpt-4o"]\nfallback = 3', 'models."gpt-4o".fallback = 3', "string"),
        ('[models."gpt-4o"]\nfallback = ""', "models.\"gpt-4o\".fallback = ''", "non-empty"),
        ('[models."gpt-4o"]\nfallback = "GPT-4o"', 'models."gpt-4o".fallback', "itself"),
        ('[models."gpt-4o"]\nfalback = "x"', 'models."gpt-4o".falback', "not a known key"),
        ('[models."gpt-4o"]', 'models."gpt-4o"', "has no rules"),
        ('[models]\n"gpt-4o" = 5', 'models."gpt-4o" = 5', "must be a table"),
        ('[models." gpt-4o"]\nmax_calls = 1', 'models." gpt-4o"', "surrounding spaces"),
        (
            '[models.a]\nfallback = "b"\n[models.b]\nfallback = "c"',
            "models.\"a\".fallback = 'b'",
            "falls back again",
        ),
        ('[tools."web_search"]\nmax_calls = -1', 'tools."web_search".max_calls = -1', ">= 0"),
        ('[tools."web_search"]\ncost = 0.1', 'tools."web_search".cost', "known key"),
        ('[tools."web_search"]', 'tools."web_search"', "has no rules"),
        ('[tools."web_search"]\ncost_usd = nan', 'tools."web_search".cost_usd = nan', "finite"),
        ('[tools."web_search"]\ncost_usd = inf', 'tools."web_search".cost_usd = inf', "finite"),
        ('[tools."web_search"]\ncost_usd = -0.5', 'tools."web_search".cost_usd = -0.5', ">= 0"),
        ('[tools."s"]\ncost_usd = "0.1"', "tools.\"s\".cost_usd = '0.1'", "number of USD"),
        ('[tools."s"]\ncost_usd = true', 'tools."s".cost_usd = True', "number of USD"),
        ('[tools.""]\ncost_usd = 0.1', 'tools.""', "non-empty name"),
        ("[limits\nmax_steps = 1", "", "not valid TOML"),
    ],
)
def test_every_bad_rule_is_rejected_naming_the_file_and_key(
    text: str, key: str, problem: str, tmp_path: Path
) -> None:
    path = write(tmp_path / "bad.toml", text)
    with pytest.raises(PolicyFileError) as info:
        PolicyFile(path)
    message = str(info.value)
    assert message.startswith(f"policy file {path}: ")
    assert key in message
    assert problem in message
    assert isinstance(info.value, ValueError)


def test_a_missing_file_or_an_unknown_extension_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyFileError, match="cannot be read"):
        PolicyFile(tmp_path / "absent.toml")
    with pytest.raises(PolicyFileError, match="unknown extension"):
        PolicyFile(write(tmp_path / "policy.json", "{}"))


_ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**17), max_value=10**17),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(value=_ANY_VALUE, slot=st.sampled_from(["max_calls", "max_tokens"]))
def test_a_count_is_kept_exactly_or_rejected_naming_it(value: object, slot: str) -> None:
    try:
        spec = parse_policy({"models": {"m": {slot: value}}}, "p.toml")
    except PolicyFileError as exc:
        assert f'models."m".{slot}' in str(exc)
        return
    assert type(value) is int and value >= (1 if slot == "max_tokens" else 0)
    assert getattr(spec.models["m"], slot) == value


@settings(max_examples=300)
@given(value=_ANY_VALUE)
def test_a_price_is_kept_exactly_or_rejected_naming_it(value: object) -> None:
    try:
        spec = parse_policy({"prices": {"m": {"input": value, "output": 1}}}, "p.toml")
    except PolicyFileError as exc:
        assert 'prices."m".input' in str(exc)
        return
    assert isinstance(value, (int, float)) and not isinstance(value, bool)
    assert spec.prices["m"] == UnitPrices.from_usd_per_mtok(value, 1)


# -- per-model and per-tool rules ------------------------------------------------------


def test_fallback_and_clamp_come_out_of_begin_call(policy: PolicyFile) -> None:
    ctx = chain(policy)
    handle = ctx.begin_call("llm", WrapOptions(model="gpt-4o", provider="openai"))
    handle.finish()
    assert handle.decision.allowed
    assert handle.decision.fallback_model == "gpt-4o-mini"
    assert handle.decision.max_tokens == 1000
    assert 'models."gpt-4o".fallback = "gpt-4o-mini"' in handle.decision.reason
    other = ctx.begin_call("llm", WrapOptions(model="gpt-4o-mini", provider="openai"))
    other.finish()
    assert other.decision.fallback_model is None and other.decision.max_tokens is None


def test_provider_rules_the_plain_rule_and_the_fallbacks_rules_all_apply(
    tmp_path: Path,
) -> None:
    policy = rules(
        '[models."openai:GPT-4o"]\nmax_tokens = 900\n'
        '[models."gpt-4o"]\nfallback = "small"\nmax_calls = 5\n'
        "[models.small]\nmax_tokens = 300\nmax_calls = 1\n",
        tmp_path,
    )
    ctx = chain(policy)
    handle = ctx.begin_call("llm", WrapOptions(model="gpt-4o", provider="openai"))
    assert (handle.decision.fallback_model, handle.decision.max_tokens) == ("small", 300)
    handle.finish()
    # small's own max_calls = 1 counts the degraded call: the next one is denied.
    with pytest.raises(BudgetExceededError, match=r'models\."small"\.max_calls = 1'):
        ctx.begin_call("llm", WrapOptions(model="gpt-4o", provider="anthropic"))


def test_calls_without_a_matching_rule_pass_untouched(policy: PolicyFile) -> None:
    rule = FilePolicy(policy)
    assert rule.check(PolicyContext(kind="llm")).allowed
    assert rule.check(PolicyContext(kind="tool", operation_name="Web_Search")).allowed
    decision = rule.check(PolicyContext(kind="llm", model="claude-sonnet-4-5"))
    assert decision.allowed and not decision.degraded


@pytest.fixture
def instrumentor() -> Iterator[OpenAIInstrumentor]:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    yield instrumentor
    instrumentor.uninstrument()


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=6, reasoning_tokens=1, cached_tokens=2) as fake:
        yield fake


@pytest.fixture
def client(server: FakeLLMServer, instrumentor: OpenAIInstrumentor) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.openai_base_url, api_key="test", max_retries=0) as oai:
        yield oai


def ask(client: openai.OpenAI, model: str, **kwargs: Any) -> Any:
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello."}], **kwargs
    )


def test_the_server_receives_the_fallback_model_and_the_clamped_cap(
    tmp_path: Path, client: openai.OpenAI, server: FakeLLMServer
) -> None:
    policy = rules('[models."gpt-4o"]\nfallback = "gpt-4o-mini"\nmax_tokens = 4\n', tmp_path)
    with chain(policy, ExecutionConfig(max_cost_usd=1.0)):
        ask(client, "gpt-4o")
        ask(client, "gpt-4o", max_tokens=100)
        ask(client, "gpt-4o", max_completion_tokens=2)
    bodies = [r.body for r in server.requests]
    assert [b["model"] for b in bodies] == ["gpt-4o-mini"] * 3
    assert bodies[0]["max_completion_tokens"] == 4
    assert bodies[1]["max_tokens"] == 4
    assert bodies[2]["max_completion_tokens"] == 2  # a smaller cap of the caller's stays


def test_a_model_only_the_file_prices_runs_under_a_ceiling_at_the_files_price(
    policy: PolicyFile, client: openai.OpenAI, server: FakeLLMServer
) -> None:
    config = ExecutionConfig(max_cost_usd=1.0)
    with ExecutionContext(config), pytest.raises(BudgetExceededError, match="no known price"):
        ask(client, "my-finetune")  # genai-prices does not know it
    assert server.count(CHAT) == 0
    with ExecutionContext(config, price_table=policy.price_table({})) as ctx:
        completion = ask(client, "my-finetune")
    usage = completion.usage
    details = usage.prompt_tokens_details
    cached = details.cached_tokens if details and details.cached_tokens else 0
    reasoning = usage.completion_tokens_details.reasoning_tokens or 0
    expected = UnitPrices.from_usd_per_mtok(3.0, 12.0, 1.5).cost_nano(
        usage.prompt_tokens, usage.completion_tokens, cached, reasoning
    )
    assert cached > 0 and expected > 0
    assert ctx.snapshot().cost_usd == nano_to_usd(expected)
    assert server.count(CHAT) == 1


def test_the_files_unknown_model_price_yields_to_the_environment(policy: PolicyFile) -> None:
    from_file = policy.price_table({}).lookup(None, "acme-private-llm")
    from_env = policy.price_table({"VERONICA_UNKNOWN_MODEL_PRICE": "7"}).lookup(None, "acme")
    assert from_file == UnitPrices.from_usd_per_mtok(5.0, 5.0)
    assert from_env == UnitPrices.from_usd_per_mtok(7.0, 7.0)
    with pytest.raises(ValueError, match="VERONICA_UNKNOWN_MODEL_PRICE='-1'"):
        policy.price_table({"VERONICA_UNKNOWN_MODEL_PRICE": "-1"})


def _hammer(ctx: ExecutionContext, kind: str, options: WrapOptions, attempts: int) -> list[bool]:
    start = threading.Barrier(8)
    outcomes: list[bool] = []
    lock = threading.Lock()

    def worker() -> None:
        start.wait()
        for _ in range(attempts):
            try:
                ctx.begin_call(kind, options).finish()
                ok = True
            except BudgetExceededError as exc:
                assert exc.reason == "steps"
                ok = False
            with lock:
                outcomes.append(ok)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


@pytest.mark.parametrize(
    ("kind", "options"),
    [
        ("llm", WrapOptions(model="gpt-4o", provider="openai")),
        ("tool", WrapOptions(operation_name="web_search")),
    ],
    ids=["model", "tool"],
)
def test_max_calls_is_exact_under_eight_threads(
    kind: str, options: WrapOptions, tmp_path: Path
) -> None:
    policy = rules(
        '[models."gpt-4o"]\nmax_calls = 37\n[tools.web_search]\nmax_calls = 37\n', tmp_path
    )
    file_policy = FilePolicy(policy)
    ctx = ExecutionContext(pipeline=PolicyPipeline([file_policy]))
    outcomes = _hammer(ctx, kind, options, attempts=25)
    assert len(outcomes) == 200
    assert outcomes.count(True) == 37
    name = "gpt-4o" if kind == "llm" else "web_search"
    assert file_policy.count(ctx.chain_id, "model" if kind == "llm" else "tool", name) == 37
    assert ctx.snapshot().steps == 37


def test_a_denial_names_the_rule_and_counts_per_chain(policy: PolicyFile) -> None:
    file_policy = FilePolicy(policy)
    pipeline = PolicyPipeline([file_policy])
    first, second = ExecutionContext(pipeline=pipeline), ExecutionContext(pipeline=pipeline)
    search = WrapOptions(operation_name="web_search")
    for _ in range(10):
        first.begin_call("tool", search).finish()
    with pytest.raises(BudgetExceededError) as info:
        first.begin_call("tool", search)
    assert info.value.reason == "steps"
    assert (info.value.limit, info.value.observed) == (10, 11)
    assert 'tools."web_search".max_calls = 10 reached' in str(info.value)
    second.begin_call("tool", search).finish()  # another chain has its own count
    first.begin_call("tool", WrapOptions(operation_name="fetch")).finish()  # no rule


def test_a_call_denied_later_gives_its_count_back(tmp_path: Path) -> None:
    policy = rules("[tools.web_search]\nmax_calls = 2\n", tmp_path)
    file_policy = FilePolicy(policy)
    search = WrapOptions(operation_name="web_search")
    denied_after = ExecutionContext(pipeline=PolicyPipeline([file_policy, Deny()]))
    with pytest.raises(BudgetExceededError):
        denied_after.begin_call("tool", search)
    assert file_policy.count(denied_after.chain_id, "tool", "web_search") == 0
    ledger_denies = ExecutionContext(
        ExecutionConfig(max_steps=1), PolicyPipeline([file_policy]), chain_id="ledger-denies"
    )
    ledger_denies.begin_call("tool", search).finish()
    with pytest.raises(BudgetExceededError, match="steps"):
        ledger_denies.begin_call("tool", search)  # the ledger's max_steps, not the file's
    assert file_policy.count("ledger-denies", "tool", "web_search") == 1
    handle = ExecutionContext(pipeline=PolicyPipeline([file_policy]), chain_id="unsent")
    handle.begin_call("tool", search).finish(RuntimeError("never sent"), sent=False)
    assert file_policy.count("unsent", "tool", "web_search") == 0


def test_a_sub_agent_counts_in_its_parent(tmp_path: Path) -> None:
    policy = rules("[tools.web_search]\nmax_calls = 3\n", tmp_path)
    parent = chain(policy, chain_id="parent")
    search = WrapOptions(operation_name="web_search")
    parent.begin_call("tool", search).finish()
    child = parent.spawn_child()
    child.begin_call("tool", search).finish()
    child.begin_call("tool", search).finish()
    with pytest.raises(BudgetExceededError, match="reached in chain parent"):
        child.spawn_child().begin_call("tool", search)
    with pytest.raises(BudgetExceededError):
        parent.begin_call("tool", search)


def test_counts_are_kept_for_a_bounded_number_of_chains(
    policy: PolicyFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_policy_rules, "MAX_CHAINS", 5)
    file_policy = FilePolicy(policy)
    for i in range(20):
        context = PolicyContext(chain_id=f"c{i}", kind="tool", operation_name="web_search")
        assert file_policy.check(context).allowed
        file_policy.on_success(context)
    assert [file_policy.count(f"c{i}", "tool", "web_search") for i in (14, 15, 19)] == [0, 1, 1]
    file_policy.reset()
    assert file_policy.count("c19", "tool", "web_search") == 0


@pytest.fixture
def tool_prices() -> Iterator[None]:
    """The process-wide tool price table, cleared after the test."""
    set_tool_prices(None)
    yield
    set_tool_prices(None)


@pytest.mark.usefixtures("tool_prices")
def test_a_tool_priced_in_the_file_is_charged_per_call(tmp_path: Path) -> None:
    policy = rules('[tools.search]\ncost_usd = 0.4\n[tools."fetch"]\nmax_calls = 3\n', tmp_path)
    assert policy.current().tools["search"] == ToolRule("search", 'tools."search"', cost_usd=0.4)
    assert (tool_price_usd("search"), tool_price_usd("fetch")) == (0.4, 0.0)
    ran = 0
    with chain(policy, ExecutionConfig(max_cost_usd=1.0)) as ctx:
        for query in ("a", "b"):
            with ToolCall("search", {"q": query}):
                ran += 1
        with pytest.raises(BudgetExceededError) as denial, ToolCall("search", {"q": "c"}):
            ran += 1
    assert ran == 2
    assert denial.value.reason == "cost"
    assert ctx.snapshot().cost_usd == pytest.approx(0.8)


@pytest.mark.usefixtures("tool_prices")
def test_tool_prices_follow_reloads_and_a_file_without_any_leaves_them_alone(
    tmp_path: Path, clock: FakeClock
) -> None:
    set_tool_prices({"set_in_code": 1.0})
    unpriced = PolicyFile(write(tmp_path / "plain.toml", GOOD_TOML), clock=clock)
    assert tool_price_usd("set_in_code") == 1.0  # the file prices no tool: not its table
    path = write(tmp_path / "priced.toml", "[tools.search]\ncost_usd = 0.4\n")
    priced = PolicyFile(path, check_interval_s=0, clock=clock)
    assert (tool_price_usd("search"), tool_price_usd("set_in_code")) == (0.4, 0.0)
    write(path, "[tools.search]\ncost_usd = 0.1\nmax_calls = 5\n")
    assert priced.refresh()
    assert tool_price_usd("search") == 0.1
    write(path, "[tools.search]\ncost_usd = -1\n")  # rejected: the last good prices stay
    assert not priced.refresh()
    assert tool_price_usd("search") == 0.1
    write(path, "[tools.search]\nmax_calls = 5\n")  # the prices removed: cleared
    assert priced.refresh()
    assert tool_price_usd("search") == 0.0
    assert unpriced.version == 1


# -- reload ----------------------------------------------------------------------------


def test_a_changed_file_applies_without_a_restart(
    policy: PolicyFile, policy_path: Path, clock: FakeClock
) -> None:
    file_policy = FilePolicy(policy)
    prices = policy.price_table({})
    gpt4o = PolicyContext(kind="llm", model="gpt-4o")
    assert file_policy.check(gpt4o).max_tokens == 1000
    write(
        policy_path,
        GOOD_TOML.replace("max_tokens = 1000", "max_tokens = 10").replace("12.0", "24.0"),
    )
    assert file_policy.check(gpt4o).max_tokens == 1000  # not looked at before the interval
    clock.advance(1.0)
    assert file_policy.check(gpt4o).max_tokens == 10
    assert policy.version == 2
    assert prices.lookup("openai", "my-finetune") == UnitPrices.from_usd_per_mtok(3.0, 24.0, 1.5)


def test_a_touched_but_unchanged_file_keeps_its_version(
    policy: PolicyFile, policy_path: Path, clock: FakeClock
) -> None:
    recorder = Recorder()
    policy.add_listener(recorder)
    write(policy_path, GOOD_TOML)
    clock.advance(5.0)
    assert policy.current() == parse_policy(tomllib.loads(GOOD_TOML), "x")
    assert policy.version == 1 and recorder.reloads == [] and recorder.errors == []


def test_a_broken_file_keeps_the_last_good_policy_and_logs_once(
    policy: PolicyFile,
    policy_path: Path,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = Recorder()
    policy.add_listener(recorder)
    good = policy.current()
    write(policy_path, GOOD_TOML.replace("max_calls = 50", "max_calls = -50"))
    caplog.set_level(logging.ERROR, logger="veronica_otel.policy_file")
    for _ in range(3):
        clock.advance(1.0)
        assert policy.current() is good
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert str(policy_path) in record.getMessage()
    assert 'models."gpt-4o".max_calls = -50' in record.getMessage()
    assert "keeping the last good policy (version 1)" in record.getMessage()
    assert len(recorder.errors) == 1
    write(policy_path, GOOD_TOML.replace("max_calls = 50", "max_calls = 5"))
    clock.advance(1.0)
    assert policy.current().models["gpt-4o"].max_calls == 5
    assert policy.version == 2 and len(recorder.reloads) == 1


def test_a_deleted_file_keeps_the_last_good_policy_and_says_so_once(
    policy: PolicyFile,
    policy_path: Path,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    good = policy.current()
    policy_path.unlink()
    caplog.set_level(logging.ERROR, logger="veronica_otel.policy_file")
    for _ in range(3):
        clock.advance(1.0)
        assert policy.current() is good
    (record,) = caplog.records
    assert "cannot be read" in record.getMessage()
    write(policy_path, GOOD_TOML.replace("max_steps = 100", "max_steps = 7"))
    assert policy.refresh() is True
    assert policy.current().limits.max_steps == 7


def test_a_rejected_version_is_reported_on_stderr_by_the_default_chain(
    policy: PolicyFile, policy_path: Path, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        install_default_chain(policy, {})
        write(policy_path, "[limits]\nmax_steps = 'many'\n")
        clock.advance(1.0)
        policy.current()
    finally:
        _propagation.set_default_context(None)
    err = capsys.readouterr().err
    assert f"policy file {policy_path}: limits.max_steps = 'many'" in err
    assert "keeping the last good policy" in err


# -- configuration precedence and the default chain ------------------------------------


def test_environment_variables_take_precedence_over_the_files_limits(policy: PolicyFile) -> None:
    assert policy.default_config({}) == ExecutionConfig(max_cost_usd=2.0, max_steps=100)
    config = policy.default_config({"VERONICA_MAX_STEPS": "7", "VERONICA_TIMEOUT_MS": "50"})
    assert config == ExecutionConfig(max_cost_usd=2.0, max_steps=7, timeout_ms=50)
    with pytest.raises(ValueError, match="VERONICA_MAX_STEPS='x'"):
        policy.default_config({"VERONICA_MAX_STEPS": "x"})


def test_from_env_reads_veronica_policy_file(policy_path: Path) -> None:
    assert PolicyFile.from_env({}) is None
    loaded = PolicyFile.from_env({"VERONICA_POLICY_FILE": str(policy_path)})
    assert loaded is not None and loaded.path == policy_path


def test_the_default_chain_takes_new_limits_and_keeps_what_it_spent(
    policy: PolicyFile, policy_path: Path, clock: FakeClock
) -> None:
    try:
        first = install_default_chain(policy, {})
        assert _propagation.default_context() is first
        assert first.config.max_steps == 100
        for _ in range(3):
            first.begin_call("tool", WrapOptions(operation_name="read")).finish()
        write(policy_path, GOOD_TOML.replace("max_steps = 100", "max_steps = 4"))
        clock.advance(1.0)
        first.begin_call("tool", WrapOptions(operation_name="read")).finish()  # notices it
        second = _propagation.default_context()
        assert second is not None and second is not first
        assert second.chain_id == first.chain_id
        assert second.config.max_steps == 4
        assert second.snapshot().steps == 4
        with pytest.raises(BudgetExceededError, match="steps"):
            second.begin_call("tool", WrapOptions(operation_name="read"))
    finally:
        _propagation.set_default_context(None)


def test_exported_names() -> None:
    import veronica_otel.policy_file as module

    assert set(module.__all__) == {
        "POLICY_FILE_ENV",
        "FilePolicy",
        "ModelRule",
        "PolicyFile",
        "PolicyFileError",
        "PolicyFileListener",
        "PolicySpec",
        "PoolRule",
        "ToolRule",
        "install_default_chain",
    }


def test_a_files_provider_wildcard_prices_that_providers_models(tmp_path: Path) -> None:
    text = (
        '[prices."ollama:*"]\ninput = 0\noutput = 0\n\n'
        '[prices."ollama:big"]\ninput = 1\noutput = 2\n'
    )
    table = rules(text, tmp_path).price_table({})
    assert table.lookup("ollama", "llama3.2") == UnitPrices(0, 0, 0, 0)
    assert table.lookup("ollama", "big") == UnitPrices.from_usd_per_mtok(1, 2)
    assert table.lookup("ollama.cloud", "gpt-oss:120b") is None
