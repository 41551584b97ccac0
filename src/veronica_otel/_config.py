"""Chain limits: :class:`ExecutionConfig` and its ``VERONICA_*`` environment form."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

from ._units import MAX_COUNT, check_count, check_usd

__all__ = [
    "DEFAULT_RESERVATION_WAIT_S",
    "ENV_LIMITS",
    "MAX_RESERVATION_WAIT_S",
    "ExecutionConfig",
    "check_wait_s",
    "parse_env_bool",
]

# field name -> environment variable
ENV_LIMITS: Mapping[str, str] = {
    "max_cost_usd": "VERONICA_MAX_COST_USD",
    "max_steps": "VERONICA_MAX_STEPS",
    "max_retries_total": "VERONICA_MAX_RETRIES_TOTAL",
    "timeout_ms": "VERONICA_TIMEOUT_MS",
    "max_tokens": "VERONICA_MAX_TOKENS",
    "max_repeats": "VERONICA_MAX_REPEATS",
    "max_depth": "VERONICA_MAX_DEPTH",
    "max_handoffs": "VERONICA_MAX_HANDOFFS",
    "reservation_wait_s": "VERONICA_RESERVATION_WAIT_S",
}

DEFAULT_RESERVATION_WAIT_S = 10.0
"""How long a call refused only by other calls' in-flight reservations waits
for them to settle when ``reservation_wait_s`` is unset."""
MAX_RESERVATION_WAIT_S = 3600.0
"""The longest wait accepted: more is a unit mistake (milliseconds for seconds)."""
_SECONDS = ("reservation_wait_s",)  # fields in seconds, not counts


@dataclass(frozen=True, slots=True)
class ExecutionConfig:
    """Hard limits for one chain. ``None`` means unlimited.

    Invalid values (NaN, infinities, negatives, bools or strings passed as
    numbers, absurd magnitudes) cannot be constructed: they raise
    ``ValueError`` or ``TypeError`` naming the field (guarantee G6).

    Attributes:
        max_cost_usd: Ceiling on the chain's committed cost in USD.
        max_steps: Ceiling on LLM and tool calls dispatched.
        max_retries_total: Ceiling on retries across every layer of the chain.
        timeout_ms: Wall-clock budget from the context's creation.
        max_tokens: Ceiling on tokens (input + output) across the chain.
        max_repeats: How many times one call signature may be dispatched.
        max_depth: Deepest sub-agent or service hop (the root is depth 0).
        max_handoffs: How many times control may pass between the same two
            agents (see :func:`veronica_otel.agent`); the next handoff trips
            with reason ``loop``.
        reservation_wait_s: How long a call refused only because other
            calls' in-flight reservations hold the budget (its own worst
            case fits beside the committed spend) waits for them to settle
            before it is refused, never past the chain's deadline. ``None``:
            :data:`DEFAULT_RESERVATION_WAIT_S`; ``0``: refuse at once. Not a
            limit: a call refused on committed spend never waits.
    """

    max_cost_usd: float | None = None
    max_steps: int | None = None
    max_retries_total: int | None = None
    timeout_ms: int | None = None
    max_tokens: int | None = None
    max_repeats: int | None = None
    max_depth: int | None = None
    max_handoffs: int | None = None
    reservation_wait_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_cost_usd is not None:
            object.__setattr__(self, "max_cost_usd", check_usd("max_cost_usd", self.max_cost_usd))
        if self.reservation_wait_s is not None:
            wait = check_wait_s("reservation_wait_s", self.reservation_wait_s)
            object.__setattr__(self, "reservation_wait_s", wait)
        for f in fields(self):
            if f.name == "max_cost_usd" or f.name in _SECONDS:
                continue
            value = getattr(self, f.name)
            if value is not None:
                check_count(f.name, value)
        if self.max_repeats is not None and self.max_repeats < 1:
            raise ValueError(f"max_repeats must be >= 1, got {self.max_repeats!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ExecutionConfig:
        """Build limits from the ``VERONICA_*`` variables.

        Unset or empty variables mean unlimited. A malformed value raises
        ``ValueError`` naming the variable and the value; it is never
        replaced by a default.
        """
        env = os.environ if environ is None else environ
        values: dict[str, float | int | None] = {}
        for name, var in ENV_LIMITS.items():
            raw = env.get(var, "").strip()
            if not raw:
                continue
            try:
                values[name] = (
                    _parse_usd(raw)
                    if name == "max_cost_usd" or name in _SECONDS
                    else _parse_int(raw)
                )
                # Constructing a one-field config validates range and sign.
                ExecutionConfig(**{name: values[name]})  # type: ignore[arg-type]
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{var}={_shown(raw)} is not a valid {name}: {exc}") from None
        return cls(**values)  # type: ignore[arg-type]


def check_wait_s(name: str, value: object) -> float:
    """``value`` as a wait in seconds: a finite number in ``[0, MAX_RESERVATION_WAIT_S]``.

    Raises:
        TypeError: Not a number (a string is not one).
        ValueError: A bool, NaN, infinite, negative or absurd; ``name`` and the value
            are named.
    """
    if isinstance(value, bool):  # a number to Python, a mistake here (DESIGN: ValueError)
        raise ValueError(f"{name} must be a number of seconds, not a bool: got {value!r}")
    if not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    if seconds < 0:
        raise ValueError(f"{name} must be >= 0 seconds, got {value!r}")
    if seconds > MAX_RESERVATION_WAIT_S:
        raise ValueError(
            f"{name} must be <= {MAX_RESERVATION_WAIT_S:g} seconds, got {value!r} "
            "(a wait is in seconds, not milliseconds)"
        )
    return seconds


def _shown(raw: str) -> str:
    """``repr(raw)``, shortened: the message names the variable, not a megabyte of it."""
    text = repr(raw)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _parse_usd(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("must be a number of USD") from None
    if math.isnan(value) or math.isinf(value):
        raise ValueError("must be finite")
    return value


def _parse_int(raw: str) -> int:
    text = raw.replace("_", "")
    digits = text.lstrip("+-")
    # ASCII only (int() reads other scripts' digits), and short enough for int().
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError("must be a whole number")
    if len(digits) > len(str(MAX_COUNT)):
        raise ValueError(f"must be <= {MAX_COUNT}")
    value = int(text)
    if value > MAX_COUNT:
        raise ValueError(f"must be <= {MAX_COUNT}")
    return value


def parse_env_bool(var: str, environ: Mapping[str, str] | None = None) -> bool:
    """Read a boolean variable strictly: true/false, 1/0, yes/no, on/off."""
    env = os.environ if environ is None else environ
    raw = env.get(var, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{var}={_shown(env.get(var, ''))} is not a boolean (use true or false)")
