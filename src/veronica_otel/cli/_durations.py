"""Durations on the command line: ``90``, ``90s``, ``15m``, ``2h``, ``1d``."""

from __future__ import annotations

import math

__all__ = ["parse_duration"]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_MAX_S = 30 * 86400.0


def parse_duration(text: str) -> float:
    """Seconds in ``text``; raises ValueError naming the text when it is not one."""
    raw = text.strip().lower()
    for unit in sorted(_UNITS, key=len, reverse=True):
        if raw.endswith(unit):
            number, scale = raw[: -len(unit)], _UNITS[unit]
            break
    else:
        number, scale = raw, 1.0
    try:
        seconds = float(number) * scale
    except ValueError:
        raise ValueError(f"{text!r} is not a duration (try 90, 90s, 15m, 2h)") from None
    if not math.isfinite(seconds) or seconds <= 0 or seconds > _MAX_S:
        raise ValueError(f"{text!r} must be a duration above 0 and at most 30 days")
    return seconds
