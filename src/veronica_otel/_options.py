"""Small value types of the context API: WrapOptions, Decision, ChainSnapshot."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ._errors import TripEvent
from ._units import check_count, check_usd, usd_to_nano

__all__ = ["ChainSnapshot", "Decision", "WrapOptions"]


class Decision(enum.StrEnum):
    """What ``wrap_llm_call`` / ``wrap_tool_call`` did."""

    ALLOW = "ALLOW"
    """The call ran."""
    HALT = "HALT"
    """The call was not run (or the chain tripped inside it)."""


@dataclass(frozen=True, slots=True)
class WrapOptions:
    """Per-call options.

    Attributes:
        operation_name: A name for the call (shown in spans and trips).
        cost_estimate_hint: USD reserved before the call and committed after
            it unless the call reports its usage with ``ctx.record_usage``.
        model: The model called; with ``max_tokens`` it prices a worst-case
            reservation, and it prices usage reported without a cost.
        provider: The provider id for price lookup (``"openai"``).
        input_tokens: Input tokens of the call (exact, or an upper bound).
        max_tokens: Output-token cap of the call.
        signature: Identity of the call for the repeat limit; calls with the
            same signature count towards ``max_repeats``.
        retry: This call is a retry of an earlier one (counts a retry too).
    """

    operation_name: str = ""
    cost_estimate_hint: float = 0.0
    model: str | None = None
    provider: str | None = None
    input_tokens: int | None = None
    max_tokens: int | None = None
    signature: str | None = None
    retry: bool = False
    hint_nano: int = field(init=False, repr=False, compare=False)
    reserved_tokens: int = field(init=False, repr=False, compare=False)
    plain: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        hint = check_usd("cost_estimate_hint", self.cost_estimate_hint)
        input_tokens = 0
        output_tokens = 0
        if self.input_tokens is not None:
            input_tokens = check_count("input_tokens", self.input_tokens)
        if self.max_tokens is not None:
            output_tokens = check_count("max_tokens", self.max_tokens)
        if not isinstance(self.retry, bool):
            raise TypeError(f"retry must be a bool, got {self.retry!r}")
        for name in ("operation_name",):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{name} must be a str, got {getattr(self, name)!r}")
        object.__setattr__(self, "hint_nano", usd_to_nano(hint))
        object.__setattr__(self, "reserved_tokens", input_tokens + output_tokens)
        # No model to price, no signature to count, not a retry: the fast path.
        plain = self.model is None and self.signature is None and not self.retry
        object.__setattr__(self, "plain", plain)


@dataclass(frozen=True, slots=True)
class ChainSnapshot:
    """A consistent, frozen view of a chain.

    Attributes:
        chain_id: The chain.
        cost_usd: Committed cost.
        steps: Calls dispatched.
        retries: Retries drawn.
        tokens: Committed tokens.
        elapsed_ms: Wall-clock time since the context was created.
        aborted: Whether the chain (or an ancestor) has tripped.
        trip: The sticky trip, if any.
        reserved_usd: Cost held by calls in flight.
        depth: Sub-agent / service hop depth (root is 0).
    """

    chain_id: str
    cost_usd: float
    steps: int
    retries: int
    tokens: int
    elapsed_ms: float
    aborted: bool
    trip: TripEvent | None
    reserved_usd: float = 0.0
    depth: int = 0
