"""Unit prices (per image, character, second) and per-request bounds: how the
policy file writes them and how a PriceTable resolves them."""

from __future__ import annotations

from pathlib import Path

import pytest

from veronica_otel import PriceTable
from veronica_otel._unit_prices import per_request_prices, per_unit_prices, request_bound_cents
from veronica_otel.policy_file import PolicyFile, PolicyFileError


def _table(tmp_path: Path, text: str) -> PriceTable:
    policy = tmp_path / "policy.toml"
    policy.write_text(text)
    return PolicyFile(policy).price_table()


def _usd(table: PriceTable, provider: str, key: str, units: int) -> float:
    prices = table.lookup(provider, key)
    assert prices is not None, key
    return prices.max_cost_nano(0, units) / 1e9


def test_list_prices_by_model_size_and_quality() -> None:
    table = PriceTable()
    assert _usd(table, "openai", "dall-e-3#image 1024x1024 standard", 1) == pytest.approx(0.04)
    assert _usd(table, "openai", "dall-e-3#image 1792x1024 hd", 2) == pytest.approx(0.24)
    assert _usd(table, "openai", "dall-e-2#image 256x256 standard", 3) == pytest.approx(0.048)
    assert _usd(table, "openai", "tts-1#character", 1000) == pytest.approx(0.015)
    assert _usd(table, "openai", "sora-2-2025-10-06#second 1280x720", 8) == pytest.approx(0.8)


@pytest.mark.parametrize(
    "key",
    [
        "dall-e-3#image auto standard",  # a size with no list price
        "gpt-image-1#image 1024x1024 high",  # billed in tokens: the user prices it
        "batches#request",  # a job: the user bounds it
    ],
)
def test_what_has_no_list_price_is_unpriced_even_with_an_unknown_model_price(key: str) -> None:
    table = PriceTable(unknown_model_price_usd_per_mtok=5.0)
    assert table.lookup("openai", key) is None
    assert table.lookup("openai", "some-new-model") is not None  # tokens still fall back


def test_a_provider_wide_price_never_prices_units() -> None:
    table = PriceTable({"openai:*": per_unit_prices(0.0)})
    assert table.lookup("openai", "gpt-image-1#image 1024x1024 high") is None


def test_the_policy_file_prices_units_and_bounds_jobs(tmp_path: Path) -> None:
    table = _table(
        tmp_path,
        '[prices."openai:gpt-image-1"]\nper_image = 0.25\n'
        '[prices."openai:dall-e-3"]\nper_image = 0.05\n'  # the user's price wins the list's
        '[prices."openai:batches"]\nper_request = 12.345\n'
        '[prices."openai:my-tts"]\ninput = 0.6\noutput = 12.0\nper_character = 0.00002\n',
    )
    assert _usd(table, "openai", "gpt-image-1#image 1024x1536 high", 4) == pytest.approx(1.0)
    assert _usd(table, "openai", "dall-e-3#image 1792x1024 hd", 1) == pytest.approx(0.05)
    bound = table.lookup("openai", "batches#request")
    assert bound is not None and request_bound_cents(bound) == 1235  # rounded up to a cent
    assert _usd(table, "openai", "my-tts#character", 100) == pytest.approx(0.002)
    assert table.lookup("openai", "my-tts") is not None  # its token prices stay


def test_an_alias_prices_a_deployment_as_its_model(tmp_path: Path) -> None:
    table = _table(tmp_path, '[models]\n"my-dalle" = "dall-e-3"\n')
    assert _usd(table, "openai", "my-dalle#image 1024x1024 standard", 1) == pytest.approx(0.04)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("per_image = 2.0", "per_request"),  # dearer than a token price's range
        ("per_image = -1", "per_image"),
        ('per_second = "a lot"', "per_second"),
        ("per_minute = 0.1", "per_minute"),
    ],
)
def test_bad_unit_prices_are_named(tmp_path: Path, body: str, problem: str) -> None:
    with pytest.raises(PolicyFileError, match=problem):
        _table(tmp_path, f'[prices."openai:x"]\n{body}\n').lookup("openai", "x#image")


def test_a_request_bound_counts_cents() -> None:
    prices = per_request_prices(25.0)
    assert request_bound_cents(prices) == 2500
    assert prices.max_cost_nano(0, 2500) / 1e9 == pytest.approx(25.0)
