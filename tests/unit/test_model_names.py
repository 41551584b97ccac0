"""Model names as deployments spell them price as their model (Bedrock, Vertex, aliases)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from veronica_otel import (
    BudgetExceededError,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    _pricing,
)
from veronica_otel._policy_schema import parse_policy
from veronica_otel._pricing import (
    MODEL_ALIASES_ENV,
    UNKNOWN_MODEL_PRICE_ENV,
    PriceTable,
    UnitPrices,
    canonical_model_name,
    default_price_table,
    parse_model_aliases,
)
from veronica_otel.policy_file import PolicyFile, PolicyFileError

SONNET_35 = "claude-3-5-sonnet-20241022"
SONNET_45 = "claude-sonnet-4-5"

# (id as a deployment sends it, the model it is)
DEPLOYMENT_IDS = [
    ("anthropic.claude-3-5-sonnet-20241022-v2:0", SONNET_35),  # Bedrock
    ("us.anthropic.claude-3-5-sonnet-20241022-v2:0", SONNET_35),  # cross-region profiles
    ("eu.anthropic.claude-3-5-sonnet-20241022-v2:0", SONNET_35),
    ("apac.anthropic.claude-3-5-sonnet-20241022-v2:0", SONNET_35),
    ("US.Anthropic.Claude-3-5-Sonnet-20241022-V2:0", SONNET_35),  # case does not matter
    (
        "arn:aws:bedrock:us-east-1:123456789012:inference-profile/"
        "us.anthropic.claude-3-5-sonnet-20241022-v2:0",
        SONNET_35,
    ),
    ("claude-3-5-sonnet-v2@20241022", SONNET_35),  # Vertex
    ("anthropic.claude-sonnet-4-5", SONNET_45),
    ("anthropic.claude-sonnet-4-5-20250929-v1:0", "claude-sonnet-4-5-20250929"),
    ("global.anthropic.claude-sonnet-4-5-20250929-v1:0", "claude-sonnet-4-5-20250929"),
    ("claude-sonnet-4-5@20250929", "claude-sonnet-4-5-20250929"),
    ("claude-3-5-haiku@20241022", "claude-3-5-haiku-20241022"),
]


@pytest.fixture(autouse=True)
def fresh_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_pricing, "_default_table", None)
    monkeypatch.delenv(UNKNOWN_MODEL_PRICE_ENV, raising=False)
    monkeypatch.delenv(MODEL_ALIASES_ENV, raising=False)


def _same(a: UnitPrices | None, b: UnitPrices | None) -> None:
    assert a is not None and b is not None
    assert a == b
    assert (a.max_output, a.context_window) == (b.max_output, b.context_window)


@pytest.mark.parametrize(("deployed", "model"), DEPLOYMENT_IDS)
@pytest.mark.parametrize("provider", ["anthropic", None])
def test_each_deployment_id_prices_as_its_model(
    deployed: str, model: str, provider: str | None
) -> None:
    table = PriceTable()
    _same(table.lookup(provider, deployed), table.lookup(provider, model))
    assert canonical_model_name(deployed) == model


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("anthropic.claude-v2:1", "claude-v2"),  # the suffix is the whole version: kept
        ("meta.llama3-1-70b-instruct-v1:0", "llama3-1-70b-instruct"),
        ("claude-3-5-haiku@latest", "claude-3-5-haiku"),
        ("gpt-4o", "gpt-4o"),
        ("my-gpt4o-deploy", "my-gpt4o-deploy"),
    ],
)
def test_canonical_names_leave_other_names_alone(name: str, canonical: str) -> None:
    assert canonical_model_name(name) == canonical


def test_bedrocks_own_prices_are_kept_when_the_provider_says_bedrock() -> None:
    # genai-prices prices Bedrock ids under its Bedrock provider: its match is used
    # as is (Bedrock's list price; input and output equal Anthropic's).
    bedrock = PriceTable().lookup("aws.bedrock", "anthropic.claude-3-5-sonnet-20241022-v2:0")
    direct = PriceTable().lookup("anthropic", SONNET_35)
    assert bedrock is not None and direct is not None
    assert (bedrock.input, bedrock.output) == (direct.input, direct.output)


def test_a_deployment_id_resolves_once_then_is_a_cache_hit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = PriceTable()
    calls: list[str] = []
    original = _pricing._from_genai_prices

    def counting(provider: str | None, model: str, context: object) -> UnitPrices | None:
        calls.append(model)
        return original(provider, model, context)  # type: ignore[arg-type]

    monkeypatch.setattr(_pricing, "_from_genai_prices", counting)
    first = table.lookup("anthropic", "us.anthropic.claude-3-5-sonnet-20241022-v2:0")
    assert calls == ["us.anthropic.claude-3-5-sonnet-20241022-v2:0", SONNET_35]
    for _ in range(3):
        assert table.lookup("anthropic", "us.anthropic.claude-3-5-sonnet-20241022-v2:0") is first
    assert len(calls) == 2


def test_an_unknown_name_is_still_denied_and_told_how_to_map_it() -> None:
    options = WrapOptions(model="my-gpt4o-deploy", provider="openai", max_tokens=10)
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        with pytest.raises(BudgetExceededError) as caught:
            ctx.begin_call("llm", options)
        assert ctx.snapshot().steps == 0
    message = str(caught.value)
    assert "no known price for model 'my-gpt4o-deploy'" in message
    assert MODEL_ALIASES_ENV in message
    assert '[models] "name" = "gpt-4o"' in message
    assert UNKNOWN_MODEL_PRICE_ENV in message


def test_aliases_price_a_name_as_its_model() -> None:
    table = PriceTable(aliases={"My-GPT4o-Deploy": "gpt-4o", "claude-prod": SONNET_45})
    _same(table.lookup("openai", "my-gpt4o-deploy"), table.lookup("openai", "gpt-4o"))
    _same(table.lookup("anthropic", "CLAUDE-PROD"), table.lookup("anthropic", SONNET_45))
    assert table.lookup("openai", "other-deploy") is None


def test_an_alias_to_a_deployment_id_is_canonicalised_too() -> None:
    table = PriceTable(aliases={"prod": "us.anthropic.claude-3-5-sonnet-20241022-v2:0"})
    _same(table.lookup("anthropic", "prod"), table.lookup("anthropic", SONNET_35))


def test_the_users_own_price_for_a_name_beats_its_alias() -> None:
    own = UnitPrices.from_usd_per_mtok(1.0, 2.0)
    table = PriceTable({"my-deploy": own}, aliases={"my-deploy": "gpt-4o"})
    assert table.lookup("openai", "my-deploy") == own


def test_the_environment_aliases_reach_the_default_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(MODEL_ALIASES_ENV, " my-gpt4o-deploy = gpt-4o , other=claude-sonnet-4-5,")
    table = default_price_table()
    _same(table.lookup("openai", "my-gpt4o-deploy"), PriceTable().lookup("openai", "gpt-4o"))
    _same(table.lookup("anthropic", "other"), PriceTable().lookup("anthropic", SONNET_45))
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        options = WrapOptions(model="my-gpt4o-deploy", provider="openai", max_tokens=10)
        ctx.begin_call("llm", options).finish(sent=False)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("my-deploy", "'my-deploy' is not name=model"),
        ("=gpt-4o", "'=gpt-4o' is not name=model"),
        ("a=", "'a=' is not name=model"),
        ("a=b=c", "'a=b=c' is not name=model"),
        ("a=gpt-4o,A=gpt-4o-mini", "'A' is mapped twice"),
        ("gpt-4o=GPT-4o", "'gpt-4o' is mapped to itself"),
        ("a=b,b=gpt-4o", "'a' maps to 'b', itself an alias"),
    ],
)
def test_a_malformed_alias_variable_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, raw: str, problem: str
) -> None:
    with pytest.raises(ValueError, match=f"^{MODEL_ALIASES_ENV}: ") as caught:
        parse_model_aliases(raw)
    assert problem in str(caught.value)
    monkeypatch.setenv(MODEL_ALIASES_ENV, raw)
    with pytest.raises(ValueError, match=MODEL_ALIASES_ENV):
        default_price_table()
    with pytest.raises(ValueError, match=MODEL_ALIASES_ENV):
        PolicyFile(_write(tmp_path, "")).price_table({MODEL_ALIASES_ENV: raw})


def _write(folder: Path, text: str) -> Path:
    path = folder / "policy.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_policy_file_models_table_maps_names(tmp_path: Path) -> None:
    text = (
        '[models]\n"my-gpt4o-deploy" = "gpt-4o"\n'
        '[models."gpt-4o"]\nmax_tokens = 100\n'  # rules and aliases share the table
    )
    policy = PolicyFile(_write(tmp_path, text))
    assert policy.current().aliases == {"my-gpt4o-deploy": "gpt-4o"}
    assert set(policy.current().models) == {"gpt-4o"}
    table = policy.price_table({})
    _same(table.lookup("openai", "MY-GPT4O-DEPLOY"), PriceTable().lookup("openai", "gpt-4o"))


def test_the_variable_wins_a_name_the_file_also_maps(tmp_path: Path) -> None:
    policy = PolicyFile(_write(tmp_path, '[models]\n"prod" = "gpt-4o"\n'))
    table = policy.price_table({MODEL_ALIASES_ENV: "prod=gpt-4o-mini,extra=gpt-4o"})
    _same(table.lookup("openai", "prod"), PriceTable().lookup("openai", "gpt-4o-mini"))
    _same(table.lookup("openai", "extra"), PriceTable().lookup("openai", "gpt-4o"))


@pytest.mark.parametrize(
    ("text", "where", "problem"),
    [
        ('[models]\n"a" = ""', "models.\"a\" = ''", "non-empty"),
        ('[models]\n"a" = "A"', "models.\"a\" = 'A'", "alias of itself"),
        ('[models]\n"a" = "b"\n"b" = "gpt-4o"', "models.\"a\" = 'b'", "alias of another alias"),
        ('[models]\n"a" = "gpt-4o"\n"A" = "gpt-4o"', 'models."A"', "names the same model"),
        ('[models]\n"a" = 5', 'models."a" = 5', "must be a table of rules, or a model name"),
    ],
)
def test_a_malformed_alias_in_the_file_is_named(text: str, where: str, problem: str) -> None:
    with pytest.raises(PolicyFileError) as caught:
        parse_policy(tomllib.loads(text), "p.toml")
    assert f"policy file p.toml: {where}" in str(caught.value)
    assert problem in str(caught.value)
