"""Unit prices: resolution from genai-prices, caching, integer pricing, bounds."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from genai_prices import Usage, calc_price
from genai_prices.data_snapshot import DataSnapshot
from hypothesis import given
from hypothesis import strategies as st

from veronica_otel import _pricing
from veronica_otel._pricing import (
    TOKENS_PER_MESSAGE,
    TOKENS_PER_REQUEST,
    UNKNOWN_MODEL_PRICE_ENV,
    PriceTable,
    UnitPrices,
    default_price_table,
    estimate_input_tokens,
    estimate_input_tokens_from_bytes,
)
from veronica_otel._units import MAX_COUNT, NANO_PER_USD

MODELS = [
    ("openai", "gpt-4o-mini"),
    ("openai", "gpt-4o"),
    ("openai", "gpt-5"),
    ("anthropic", "claude-sonnet-4-5"),
    ("anthropic", "claude-3-5-haiku-latest"),
    ("google", "gemini-2.5-pro"),
]
USAGES = [  # (input, output, cached_input, reasoning)
    (0, 0, 0, 0),
    (1, 1, 0, 0),
    (1_000, 500, 0, 0),
    (123_457, 9_876, 1_000, 300),
    (200_000, 77, 0, 0),
    (200_001, 77, 3, 0),
    (987_654, 54_321, 400_000, 50_000),
]


@pytest.fixture
def table() -> PriceTable:
    return PriceTable()


@pytest.fixture
def lookup_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    calls: list[str] = []
    original = DataSnapshot.find_provider_model

    def counting(self: DataSnapshot, model_ref: str, *args: Any) -> Any:
        calls.append(model_ref)
        return original(self, model_ref, *args)

    monkeypatch.setattr(DataSnapshot, "find_provider_model", counting)
    yield calls


@pytest.fixture
def fresh_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_pricing, "_default_table", None)
    monkeypatch.delenv(UNKNOWN_MODEL_PRICE_ENV, raising=False)


def _calc_nano(provider: str, model: str, usage: Usage, **kwargs: Any) -> Decimal:
    now = datetime.now(tz=UTC)
    result = calc_price(usage, model, provider_id=provider, genai_request_timestamp=now, **kwargs)
    return result.total_price * NANO_PER_USD


def test_known_models_resolve_to_integer_prices(table: PriceTable) -> None:
    mini = table.lookup("openai", "gpt-4o-mini")
    assert mini == UnitPrices(150_000_000, 600_000_000, 75_000_000, 600_000_000, 150_000_000)
    haiku = table.lookup("anthropic", "claude-3-5-haiku-latest")
    # One cache-write price for both TTLs: the dearer 1h one ($1.6 over $1).
    assert haiku == UnitPrices(800_000_000, 4_000_000_000, 80_000_000, 4_000_000_000, 1_600_000_000)
    assert table.lookup("openai", "gpt-4o-mini-2024-07-18") == mini  # dated snapshot
    assert table.lookup(None, "gpt-4o-mini") == mini  # provider guessed from the model
    assert table.lookup("OpenAI", "GPT-4o-mini") == mini
    assert table.lookup("azure.ai.openai", "gpt-4o-mini") == mini  # OTel provider name
    assert table.lookup("no-such-provider", "gpt-4o-mini") == mini  # model name alone


@pytest.mark.parametrize(("provider", "model"), MODELS)
@pytest.mark.parametrize("usage", USAGES)
def test_cost_matches_calc_price(
    table: PriceTable, provider: str, model: str, usage: tuple[int, int, int, int]
) -> None:
    i, o, c, r = usage
    prices = table.lookup(provider, model)
    assert prices is not None
    reported = Usage(
        input_tokens=i, output_tokens=o, cache_read_tokens=c, output_reasoning_tokens=r
    )
    expected = _calc_nano(provider, model, reported)
    assert 0 <= prices.cost_nano(i, o, c, r) - expected < 1


def test_cache_writes_match_calc_price_at_the_1h_price(table: PriceTable) -> None:
    prices = table.lookup("anthropic", "claude-sonnet-4-5")
    assert prices is not None
    for i, w, c in [(5_000, 1_000, 2_000), (250_000, 50, 1_000)]:
        usage = Usage(
            input_tokens=i,
            output_tokens=100,
            cache_read_tokens=c,
            cache_write_tokens=w,
            cache_write_1h_tokens=w,
        )
        expected = _calc_nano("anthropic", "claude-sonnet-4-5", usage)
        assert 0 <= prices.cost_nano(i, 100, c, cache_write_tokens=w) - expected < 1


def test_price_context_selects_a_variant(table: PriceTable) -> None:
    standard = table.lookup("openai", "gpt-4o")
    priority = table.lookup("openai", "gpt-4o", price_context={"service_tier": "priority"})
    assert standard is not None and priority is not None
    assert priority.input > standard.input
    usage = Usage(input_tokens=1_234, output_tokens=567)
    expected = _calc_nano("openai", "gpt-4o", usage, price_context={"service_tier": "priority"})
    assert 0 <= priority.cost_nano(1_234, 567) - expected < 1


def test_tiers_price_every_token_above_the_threshold(table: PriceTable) -> None:
    prices = table.lookup("anthropic", "claude-sonnet-4-5")
    assert prices is not None
    assert [threshold for threshold, _ in prices.tiers] == [200_000]
    tier = prices.tiers[0][1]
    assert (tier.input, tier.output) == (2 * prices.input, prices.output * 3 // 2)
    assert prices.cost_nano(200_000, 0) == 200_000 * prices.input // 1_000_000
    assert prices.cost_nano(200_001, 0) == 200_001 * tier.input // 1_000_000
    # The worst case uses the dearest tier the prompt can reach, and only that.
    # Dearest input-side price below the tier: the 1h cache write ($6/MTok).
    assert prices.max_cost_nano(1_000, 1_000) == 1_000 * (6 * NANO_PER_USD + prices.output) // 10**6
    assert prices.max_cost_nano(200_001, 1) > prices.cost_nano(200_001, 1) >= 0


def test_cache_returns_the_same_object_without_a_second_lookup(
    table: PriceTable, lookup_calls: list[str]
) -> None:
    first = table.lookup("openai", "gpt-4o")
    assert table.lookup("openai", "gpt-4o") is first
    assert table.lookup("anthropic", "no-such-model") is None
    assert table.lookup("anthropic", "no-such-model") is None
    assert lookup_calls == ["gpt-4o", "no-such-model"]


def test_cache_is_shared_by_threads(table: PriceTable, lookup_calls: list[str]) -> None:
    barrier = threading.Barrier(8)
    results: list[UnitPrices | None] = []

    def worker() -> None:
        barrier.wait()
        results.append(table.lookup("openai", "gpt-5"))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 8 and all(r is results[0] and r is not None for r in results)
    assert lookup_calls == ["gpt-5"]


def test_unknown_model_is_none_never_free(table: PriceTable) -> None:
    assert table.lookup("openai", "no-such-model-xyz") is None
    assert table.lookup(None, "no-such-model-xyz") is None
    assert table.lookup("openai", "") is None
    # Listed in genai-prices with no token price (subscription): unknown, not free.
    assert table.lookup("github-copilot", "gpt-4o") is None


def test_unknown_model_with_fallback_is_priced() -> None:
    table = PriceTable(unknown_model_price_usd_per_mtok=5)
    fallback = table.lookup("openai", "no-such-model-xyz")
    assert fallback == UnitPrices(
        5 * NANO_PER_USD, 5 * NANO_PER_USD, 5 * NANO_PER_USD, 5 * NANO_PER_USD
    )
    assert table.lookup("openai", "gpt-4o-mini") != fallback


def test_user_table_overrides_genai_prices() -> None:
    mine = UnitPrices.from_usd_per_mtok(1, 2)
    scoped = UnitPrices.from_usd_per_mtok(3, 4, cached_input=0.5, reasoning=8)
    table = PriceTable({"GPT-4o": mine, "anthropic:my-model": scoped})
    assert table.lookup("openai", "gpt-4o") is mine
    assert table.lookup("anthropic", "my-model") is scoped
    assert table.lookup("openai", "my-model") is None
    assert scoped == UnitPrices(
        3 * NANO_PER_USD, 4 * NANO_PER_USD, NANO_PER_USD // 2, 8 * NANO_PER_USD
    )


def test_bad_inputs_name_the_field() -> None:
    prices = UnitPrices.from_usd_per_mtok(1, 2)
    bad_counts: list[tuple[Any, type[Exception]]] = [
        (-1, ValueError),
        (10**16, ValueError),
        (True, ValueError),  # a bool is not a count (DESIGN: ValueError)
        ("5", TypeError),
        (1.5, ValueError),
    ]
    for bad, error in bad_counts:
        with pytest.raises(error, match="input_tokens"):
            prices.cost_nano(bad, 1)
        with pytest.raises(error, match="output_tokens"):
            prices.max_cost_nano(1, bad)
        with pytest.raises(error, match="cache_write_tokens"):
            prices.cost_nano(1, 1, cache_write_tokens=bad)
    with pytest.raises(ValueError, match="cached_input_tokens"):
        prices.cost_nano(1, 1, 2)
    with pytest.raises(ValueError, match="reasoning_tokens"):
        prices.cost_nano(1, 1, 0, 2)
    with pytest.raises(ValueError, match="budget_nano"):
        prices.max_output_tokens_for(-1, 0)
    for value in [math.nan, math.inf, -0.1]:
        with pytest.raises(ValueError, match="output"):
            UnitPrices.from_usd_per_mtok(1, value)
    with pytest.raises(TypeError, match="cached_input"):
        UnitPrices.from_usd_per_mtok(1, 1, cached_input="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reasoning"):
        UnitPrices(1, 1, 1, True)
    with pytest.raises(ValueError, match=r"tiers\[1\]"):
        UnitPrices(1, 1, 1, 1, tiers=((10, UnitPrices(2, 2, 2, 2)), (5, UnitPrices(3, 3, 3, 3))))
    with pytest.raises(TypeError, match="unknown_model_price_usd_per_mtok"):
        PriceTable(unknown_model_price_usd_per_mtok="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown_model_price_usd_per_mtok"):
        PriceTable(unknown_model_price_usd_per_mtok=math.nan)
    with pytest.raises(TypeError, match="model"):
        PriceTable().lookup("openai", None)  # type: ignore[arg-type]


@pytest.mark.usefixtures("fresh_default")
def test_default_table_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(UNKNOWN_MODEL_PRICE_ENV, "2.5")
    table = default_price_table()
    assert default_price_table() is table
    assert table.lookup(None, "no-such-model-xyz") == UnitPrices.from_usd_per_mtok(2.5, 2.5)


@pytest.mark.usefixtures("fresh_default")
def test_default_table_without_the_variable_has_no_fallback() -> None:
    assert default_price_table().lookup(None, "no-such-model-xyz") is None


@pytest.mark.usefixtures("fresh_default")
@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("abc", "'abc'"),
        ("1,5", "'1,5'"),
        ("nan", "nan"),
        ("inf", "inf"),
        ("-1", "-1"),
        ("1e12", "1e+12"),
    ],
)
def test_malformed_variable_names_itself(
    monkeypatch: pytest.MonkeyPatch, raw: str, shown: str
) -> None:
    monkeypatch.setenv(UNKNOWN_MODEL_PRICE_ENV, raw)
    with pytest.raises(ValueError, match=UNKNOWN_MODEL_PRICE_ENV) as info:
        default_price_table()
    assert repr(raw) in str(info.value)
    assert _pricing._default_table is None


_price = st.integers(min_value=0, max_value=10**11)
_count = st.integers(min_value=0, max_value=10**7)


@st.composite
def unit_prices(draw: st.DrawFn) -> UnitPrices:
    """Prices as tables have them: cache reads no dearer than input, tiers rising."""
    thresholds = sorted(draw(st.sets(st.integers(0, 10**6), max_size=3)))
    rows: list[tuple[int, int, int, int, int]] = []
    floor = (0, 0, 0, 0, 0)
    for _ in range(len(thresholds) + 1):
        i, o, r, w = (draw(_price) + f for f in (floor[0], floor[1], floor[3], floor[4]))
        c = min(i, draw(_price) + floor[2])
        rows.append(floor := (i, o, c, max(r, o), max(w, i)))
    tiers = tuple((t, UnitPrices(*row)) for t, row in zip(thresholds, rows[1:], strict=True))
    return UnitPrices(*rows[0], tiers=tiers)


@given(unit_prices(), st.tuples(_count, _count, _count, _count, _count))
def test_cost_is_monotone_and_bounded_by_the_worst_case(
    prices: UnitPrices, counts: tuple[int, int, int, int, int]
) -> None:
    i, o, c, r, w = counts
    c, r, w = min(c, i), min(r, o), min(w, i - min(c, i))
    cost = prices.cost_nano(i, o, c, r, cache_write_tokens=w)
    assert 0 <= cost <= prices.max_cost_nano(i, o)
    assert prices.cost_nano(i + 1, o, c, r, cache_write_tokens=w) >= cost
    assert prices.cost_nano(i, o + 1, c, r, cache_write_tokens=w) >= cost
    assert prices.max_cost_nano(i + 1, o) >= prices.max_cost_nano(i, o)
    assert prices.max_cost_nano(i, o + 1) >= prices.max_cost_nano(i, o)
    if c + w < i:  # a token read from cache never costs more; a write or reasoning never less
        assert prices.cost_nano(i, o, c + 1, r, cache_write_tokens=w) <= cost
        assert prices.cost_nano(i, o, c, r, cache_write_tokens=w + 1) >= cost
    if r < o:
        assert prices.cost_nano(i, o, c, r + 1, cache_write_tokens=w) >= cost


@given(unit_prices(), st.integers(0, 10**16), _count)
def test_max_output_tokens_never_buys_more_than_the_budget(
    prices: UnitPrices, budget: int, i: int
) -> None:
    n = prices.max_output_tokens_for(budget, i)
    if prices.max_cost_nano(i, 0) > budget:
        assert n == 0
        return
    assert prices.max_cost_nano(i, n) <= budget
    if n < MAX_COUNT:
        assert prices.max_cost_nano(i, n + 1) > budget


@pytest.mark.parametrize(
    "text", ["", "hello, world", "naïve café", "你好世界", "👍🏽🇯🇵 family 👨‍👩‍👧", "\udcff"]
)
def test_estimate_is_at_least_one_token_per_utf8_byte(text: str) -> None:
    n_bytes = len(text.encode("utf-8", "surrogatepass"))
    framing = TOKENS_PER_MESSAGE + TOKENS_PER_REQUEST
    assert estimate_input_tokens(text) == n_bytes + framing
    assert estimate_input_tokens(text) >= len(text)  # never fewer than code points
    assert estimate_input_tokens_from_bytes(n_bytes) == estimate_input_tokens(text)


def test_estimate_from_bytes_counts_each_message() -> None:
    assert estimate_input_tokens_from_bytes(100, 3) == 100 + 3 * 4 + 3
    with pytest.raises(ValueError, match="n_bytes"):
        estimate_input_tokens_from_bytes(-1)
    with pytest.raises(ValueError, match="n_messages"):
        estimate_input_tokens_from_bytes(1, 1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="text"):
        estimate_input_tokens(b"bytes")  # type: ignore[arg-type]


# cl100k_base counts published with tiktoken ports' tests (tiktoken is not installed here).
PUBLISHED_CL100K = [
    ("hello world", 2),
    (
        "\U0001f44b Hello, this is an example. \u4f60\u597d\uff0c\u8fd9\u662f\u4e00\u4e2a"
        "\u4f8b\u5b50\u3002\U0001f601",
        22,
    ),
    (
        "\u6211\u53ef\u4ee5\u541e\u4e0b\u73bb\u7483\u800c\u4e0d\u4f24\u8eab\u4f53\n"
        "The quick brown fox jumps over the lazy dog",
        26,
    ),
]


@pytest.mark.parametrize(("text", "tokens"), PUBLISHED_CL100K)
def test_estimate_bounds_published_token_counts(text: str, tokens: int) -> None:
    framing = TOKENS_PER_MESSAGE + TOKENS_PER_REQUEST
    assert tokens <= len(text.encode()) <= estimate_input_tokens(text) - framing


def test_time_of_day_prices_take_the_dearest_period(table: PriceTable) -> None:
    prices = table.lookup("deepseek", "deepseek-chat")
    assert prices is not None
    peak = datetime.now(tz=UTC).replace(hour=1, minute=0, second=0, microsecond=0)
    usage = Usage(input_tokens=10_000, output_tokens=2_000, cache_read_tokens=4_000)
    result = calc_price(
        usage, "deepseek-chat", provider_id="deepseek", genai_request_timestamp=peak
    )
    assert 0 <= prices.cost_nano(10_000, 2_000, 4_000) - result.total_price * NANO_PER_USD < 1
    off_peak = calc_price(
        usage,
        "deepseek-chat",
        provider_id="deepseek",
        genai_request_timestamp=peak.replace(hour=20),
    )
    assert off_peak.total_price < result.total_price


def test_one_sided_prices_are_never_free(table: PriceTable) -> None:
    embedding = table.lookup("openai", "text-embedding-3-small")
    assert embedding is not None and embedding.input > 0
    assert embedding.output == embedding.input  # no output price listed: priced like input


def test_cache_size_is_bounded(monkeypatch: pytest.MonkeyPatch, lookup_calls: list[str]) -> None:
    monkeypatch.setattr(_pricing, "_MAX_CACHED", 1)
    table = PriceTable()
    assert table.lookup("openai", "gpt-4o") is table.lookup("openai", "gpt-4o")
    assert table.lookup("openai", "gpt-4o-mini") == table.lookup("openai", "gpt-4o-mini")
    assert lookup_calls == ["gpt-4o", "gpt-4o-mini", "gpt-4o-mini"]


def test_a_provider_wildcard_prices_that_providers_unpriced_models() -> None:
    free = UnitPrices(0, 0, 0, 0)
    mine = UnitPrices.from_usd_per_mtok(1, 2)
    table = PriceTable({"Ollama:*": free, "ollama:llama3.2:70b": mine, "qwen3": mine})
    assert table.lookup("ollama", "llama3.2") is free
    assert table.lookup("OLLAMA", "gemma3:4b") is free
    # Ahead of genai-prices: a local deepseek-r1 is not priced as DeepSeek's API.
    assert PriceTable().lookup("ollama", "deepseek-r1:7b") is not None
    assert table.lookup("ollama", "deepseek-r1:7b") is free
    # A price for the model itself wins, scoped or not.
    assert table.lookup("ollama", "llama3.2:70b") is mine
    assert table.lookup("ollama", "qwen3") is mine
    # Another provider, or no provider at all, matches no wildcard.
    assert table.lookup("ollama.cloud", "gpt-oss:120b") is None
    assert table.lookup(None, "llama3.2") is None
    assert table.lookup("openai", "gpt-4o-mini") not in (None, free)


def test_a_provider_wildcard_yields_to_an_aliased_or_canonical_price() -> None:
    wild, named = UnitPrices.from_usd_per_mtok(9, 9), UnitPrices.from_usd_per_mtok(1, 2)
    table = PriceTable(
        {"aws.bedrock:*": wild, "claude-3-5-sonnet-20241022": named, "gpt-4o": named},
        aliases={"my-deploy": "gpt-4o"},
    )
    assert table.lookup("aws.bedrock", "anthropic.claude-3-5-sonnet-20241022-v2:0") is named
    assert table.lookup("aws.bedrock", "my-deploy") is named
    assert table.lookup("aws.bedrock", "amazon.titan-text-express-v1") is wild


def test_a_provider_wildcard_is_resolved_once_per_model(monkeypatch: pytest.MonkeyPatch) -> None:
    table = PriceTable({"ollama:*": UnitPrices(0, 0, 0, 0)})
    resolved: list[str] = []
    real = table._resolve

    def counting(provider: str | None, model: str, context: Any) -> UnitPrices | None:
        resolved.append(model)
        return real(provider, model, context)

    monkeypatch.setattr(table, "_resolve", counting)
    for _ in range(3):
        table.lookup("ollama", "llama3.2")
        table.lookup("ollama", "gemma3")
    assert resolved == ["llama3.2", "gemma3"]
