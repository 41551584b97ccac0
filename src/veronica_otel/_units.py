"""Integer money and validated numbers.

The ledger never holds a float sum: money is counted in integer nano-USD
(1 USD = 10**9 units), so ``0.1 + 0.1 + 0.1`` is exactly ``0.3``.
"""

from __future__ import annotations

import math

__all__ = [
    "NANO_PER_USD",
    "MAX_USD",
    "MAX_COUNT",
    "usd_to_nano",
    "nano_to_usd",
    "check_usd",
    "check_count",
]

NANO_PER_USD = 1_000_000_000
# Anything above these is a typo or an attack, not a budget.
MAX_USD = 1_000_000_000.0
MAX_COUNT = 10**15


def check_usd(name: str, value: object) -> float:
    """Return ``value`` as a float USD amount, or raise naming ``name``.

    Rejects bools, strings, NaN, infinities, negatives and absurd amounts.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number of USD, not a bool ({value!r})")
    if not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of USD, got {type(value).__name__} {value!r}")
    amount = float(value)
    if math.isnan(amount) or math.isinf(amount):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if amount < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    if amount > MAX_USD:
        raise ValueError(f"{name} is absurdly large ({value!r} > {MAX_USD:.0f} USD)")
    return amount


def check_count(name: str, value: object) -> int:
    """Return ``value`` as a non-negative int, or raise naming ``name``."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a whole number, not a bool ({value!r})")
    if isinstance(value, float):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    if not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    if value > MAX_COUNT:
        raise ValueError(f"{name} is absurdly large ({value!r} > {MAX_COUNT})")
    return value


def usd_to_nano(amount: float) -> int:
    """Convert a validated USD amount to integer nano-USD (nearest unit)."""
    return round(amount * NANO_PER_USD)


def nano_to_usd(nano: int) -> float:
    """Convert integer nano-USD back to a float USD figure for display."""
    return nano / NANO_PER_USD
