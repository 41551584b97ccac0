"""Settling a call whose usage is split by modality (text, audio, image) at each one's rate.

Models that speak (realtime, Live) are reserved at their dearest rate, the
worst case (:mod:`veronica_otel._pricing`); their usage then says how many
tokens of each side were text, audio or image. :func:`modality_prices` turns
``genai-prices``' per-modality rates and that split into one price per side
(the average of its tokens' rates, rounded up), so the usage commits what
the provider bills.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal

from veronica_otel._pricing import UnitPrices, _bundled_snapshot, _nano, default_price_table

from ._common import ContainedCall

__all__ = ["modality_prices"]

_MODALITIES = ("text", "audio", "image")
# A side's counts by modality, and the total the usage reports for that side.
Side = tuple[Mapping[str, object], object]


@functools.lru_cache(maxsize=64)
def _rates(provider: str | None, model: str) -> dict[str, int] | None:
    """Nano-USD per million tokens of each side and modality ``genai-prices`` lists."""
    try:
        _, info = _bundled_snapshot().find_provider_model(model, None, provider, None)
        price = info.get_prices(datetime.now(tz=UTC), None)
    except Exception:  # unknown, or a price we cannot read: settled at the dearest rate
        return None
    rates = {}
    for name in ("input", "cache_read", "output"):
        for modality in _MODALITIES:
            key = f"{name}_mtok" if modality == "text" else f"{name}_{modality}_mtok"
            if name == "cache_read" and modality != "text":
                key = f"cache_{modality}_read_mtok"
            value = getattr(price, key, None)
            if isinstance(value, Decimal):
                rates[f"{name}.{modality}"] = _nano(value)
    return rates


def _average(rates: dict[str, int], name: str, counts: dict[str, int]) -> int | bool | None:
    """The side's average rate; None: no tokens; False: a modality without a rate."""
    n = sum(counts.values())
    if n == 0:
        return None
    cost = 0
    for modality, count in counts.items():
        rate = rates.get(f"{name}.{modality}")
        if rate is None:
            if count:
                return False
            continue
        cost += count * rate
    return -(-cost // n)


def _checked(side: Side) -> dict[str, int] | None:
    counts, total = side
    if not all(type(n) is int and n >= 0 for n in counts.values()):
        return None
    checked = {m: n for m, n in counts.items() if type(n) is int}
    return checked if sum(checked.values()) == (total or 0) else None


def modality_prices(
    call: ContainedCall, provider: str | None, inputs: Side, cached: Side, outputs: Side
) -> UnitPrices | None:
    """``call``'s prices for the split usage; None (keep the dearest rate) for
    prices the user set, a split that does not add up, or a modality unpriced.

    ``inputs`` counts every input token (cached ones too), ``cached`` the
    cache reads among them, ``outputs`` the output; modalities are
    ``text``, ``audio``, ``image`` (any other has no rate: None).
    """
    prices = call.prices
    genai_provider = provider if provider == "openai" else None  # others: by model name
    rates = _rates(genai_provider, call.model)
    if prices is None or not rates or prices != default_price_table().lookup(provider, call.model):
        return None
    whole, reads, out = _checked(inputs), _checked(cached), _checked(outputs)
    if whole is None or reads is None or out is None:
        return None
    if any(reads.get(m, 0) > n for m, n in whole.items()) or set(reads) - set(whole):
        return None
    uncached = {m: n - reads.get(m, 0) for m, n in whole.items()}
    sides = (("input", uncached), ("cache_read", reads), ("output", out))
    averages = [_average(rates, name, counts) for name, counts in sides]
    if any(average is False for average in averages):
        return None
    inp, cache, output = averages
    return UnitPrices(
        prices.input if inp is None else int(inp),
        prices.output if output is None else int(output),
        prices.cached_input if cache is None else int(cache),
        prices.output if output is None else int(output),
        prices.input if inp is None else int(inp),
        max_output=prices.max_output,
        context_window=prices.context_window,
    )
