"""Prices of endpoints billed per unit (an image, a character, a second) or
bounded per request (a batch or tuning job), held in a :class:`~._pricing.PriceTable`.

A unit-priced call is described to the kernel as a "model" named
``"<model>#<unit>[ <variant>...]"`` (``"dall-e-3#image 1024x1792 hd"``), its
units as its output tokens: the price's ``output`` is USD per unit (times one
million, as token prices are per million). The ``#`` keeps these names apart
from every model name: they are never matched against ``genai-prices``, a
provider-wide price or the unknown-model price, only against the user's
prices (``[prices."openai:dall-e-3"] per_image = 0.04`` in the policy file is
the key ``"openai:dall-e-3#image"``) and :data:`BUILTIN` (prices the providers
publish), the most specific variant first, the user's before the built-in.

A request bound (``per_request``: what one call may spend at most, for jobs
that bill after the call returns) counts cents: its price is one cent a unit
and its ``max_output`` the cents of the bound.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from ._pricing import UnitPrices
from ._units import NANO_PER_USD, check_usd

__all__ = [
    "BUILTIN",
    "CENT",
    "UNITS",
    "per_request_prices",
    "per_unit_prices",
    "request_bound_cents",
    "unit_prices",
]

# Policy-file key -> unit name in a price key.
UNITS: Mapping[str, str] = {
    "per_image": "image",
    "per_character": "character",
    "per_second": "second",
    "per_request": "request",
}
_MAX_PER_UNIT_USD = 1.0  # a token price's range: at most 10**15 nano-USD per million


def per_unit_prices(usd: float, name: str = "per_unit") -> UnitPrices:
    """Prices that charge ``usd`` for each unit (counted as an output token)."""
    usd = check_usd(name, usd)
    if usd > _MAX_PER_UNIT_USD:
        raise ValueError(
            f"{name} must be at most {_MAX_PER_UNIT_USD} USD a unit, got {usd!r} "
            "(bound a dearer call with per_request)"
        )
    nano = round(usd * NANO_PER_USD * 1_000_000)
    return UnitPrices(0, nano, 0, nano, max_output=1_000_000)


CENT = per_unit_prices(0.01)


def per_request_prices(usd: float, name: str = "per_request") -> UnitPrices:
    """Prices that bound one call at ``usd``: cents, as many as the bound."""
    cents = -(-round(check_usd(name, usd) * 1_000_000) // 10_000)  # rounded up
    return UnitPrices(0, CENT.output, 0, CENT.output, max_output=max(1, cents))


def request_bound_cents(prices: UnitPrices) -> int:
    """The cents a ``per_request`` price bounds one call at."""
    return prices.max_output or 1


# Published list prices (platform.openai.com/docs/pricing), USD per unit.
# Token-billed media models (gpt-image-1, gpt-4o-mini-tts) are not here: a
# per-unit price of theirs is the user's (their units vary with the prompt).
_OPENAI: dict[str, float] = {
    "dall-e-2#image 256x256": 0.016,
    "dall-e-2#image 512x512": 0.018,
    "dall-e-2#image 1024x1024": 0.020,
    "dall-e-3#image 1024x1024 standard": 0.040,
    "dall-e-3#image 1024x1792 standard": 0.080,
    "dall-e-3#image 1792x1024 standard": 0.080,
    "dall-e-3#image 1024x1024 hd": 0.080,
    "dall-e-3#image 1024x1792 hd": 0.120,
    "dall-e-3#image 1792x1024 hd": 0.120,
    "tts-1#character": 15.0 / 1_000_000,
    "tts-1-hd#character": 30.0 / 1_000_000,
    "sora-2#second 720x1280": 0.10,
    "sora-2#second 1280x720": 0.10,
    "sora-2-pro#second 720x1280": 0.30,
    "sora-2-pro#second 1280x720": 0.30,
    "sora-2-pro#second 1024x1792": 0.50,
    "sora-2-pro#second 1792x1024": 0.50,
}
BUILTIN: Mapping[str, UnitPrices] = {
    **{f"openai:{key}": per_unit_prices(usd) for key, usd in _OPENAI.items()},
}
_SNAPSHOT = re.compile(r"-\d{4}-\d{2}-\d{2}$")  # sora-2-2025-10-06 prices as sora-2


def unit_prices(
    provider: str | None,
    name: str,
    user: Callable[[str | None, str], UnitPrices | None],
    aliases: Mapping[str, str],
) -> UnitPrices | None:
    """The price of unit name ``name`` (lower-cased, with its ``#``), or None.

    The user's prices (``user(provider, key)``) first, then :data:`BUILTIN`,
    each from the most specific variant to the bare unit.
    """
    base, _, rest = name.partition("#")
    if not rest:
        return None
    if rest == "cents":
        return CENT  # a cost the instrumentor computed itself, in cents
    base = aliases.get(base, base)
    words = rest.split(" ")
    keys = [f"{base}#{' '.join(words[:n])}" for n in range(len(words), 0, -1)]
    for key in keys:
        prices = user(provider, key)
        if prices is not None:
            return prices
    snapshot = _SNAPSHOT.sub("", base)
    for key in keys + [f"{snapshot}#{k.partition('#')[2]}" for k in keys if snapshot != base]:
        prices = BUILTIN.get(f"{provider}:{key}")
        if prices is not None:
            return prices
    return None
