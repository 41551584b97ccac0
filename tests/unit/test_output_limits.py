"""Model output limits: the table, its name matching, and the bound a clamp uses."""

from __future__ import annotations

import pytest

from veronica_otel import UnitPrices
from veronica_otel._pricing import (
    DEFAULT_MAX_OUTPUT_TOKENS,
    MAX_OUTPUT_TOKENS,
    default_price_table,
    max_output_tokens,
)


@pytest.mark.parametrize(
    ("model", "limit"),
    [
        ("gpt-4o-mini", 16_384),
        ("GPT-4o-mini-2024-07-18", 16_384),
        ("gpt-4o-2024-08-06", 16_384),
        ("gpt-4o-2024-05-13", 4_096),  # the first snapshot's own, smaller limit
        ("gpt-4-0613", 8_192),
        ("gpt-4.1-mini-2025-04-14", 32_768),
        ("claude-3-5-haiku-latest", 8_192),
        ("claude-opus-4-20250514", 32_000),
        ("claude-opus-4-5-20251101", 64_000),  # the longer name wins over claude-opus-4
        ("claude-3-5-sonnet-20241022", 8_192),
    ],
)
def test_known_models_and_their_snapshots(model: str, limit: int) -> None:
    assert max_output_tokens(model) == limit


@pytest.mark.parametrize("model", ["gpt-4o-minix", "gpt-4.5-preview", "gpt-3.5-turbo-instruct", ""])
def test_other_names_are_unknown(model: str) -> None:
    assert max_output_tokens(model) is None


def test_every_limit_is_a_positive_int() -> None:
    assert all(type(v) is int and v > 0 for v in MAX_OUTPUT_TOKENS.values())


def test_the_output_limit_is_bounded_by_the_context_window_left() -> None:
    prices = default_price_table().lookup("openai", "gpt-4")
    assert prices is not None
    assert (prices.max_output, prices.context_window) == (8_192, 8_192)
    assert prices.output_limit(100) == 8_092
    assert prices.output_limit(9_000) == 0  # the input bound alone fills the window


def test_models_genai_prices_knows_carry_their_window() -> None:
    prices = default_price_table().lookup("openai", "gpt-4o-mini")
    assert prices is not None
    assert (prices.max_output, prices.context_window) == (16_384, 128_000)
    assert prices.output_limit(1_000) == 16_384


def test_prices_with_no_known_limit_use_the_default() -> None:
    mine = UnitPrices.from_usd_per_mtok(1, 2)
    assert mine.output_limit(10) == DEFAULT_MAX_OUTPUT_TOKENS
    own = UnitPrices(1, 2, 1, 2, max_output=500, context_window=1_000)
    assert own.output_limit(10) == 500
    assert own.output_limit(900) == 100
    assert own == UnitPrices(1, 2, 1, 2)  # limits describe the model, not its price
