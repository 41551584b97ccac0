"""What an instrumentor tells the kernel about a call, and what the kernel answers.

An LLM instrumentor describes each API call once (:class:`CallSpec`) and asks
``ExecutionContext.admit_call`` once; the answer (:class:`Admitted`) says what
to send: the output cap, the fallback model, and the prices the call settles at.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from ._call import CallHandle
    from ._pricing import UnitPrices

__all__ = ["Admitted", "CallSpec", "call_signature"]


class CallSpec(NamedTuple):
    """One LLM API call, described once by its instrumentor.

    Attributes:
        provider: ``gen_ai.provider.name`` (``"openai"``, ``"anthropic"``).
        operation: ``gen_ai.operation.name`` (``"chat"``, ``"embeddings"``).
        model: The model requested.
        input_bound: An upper bound on its input tokens.
        requested_cap: The output cap the request sets (None: none).
        clampable: Whether an output cap may be set or lowered in the request.
        choices: Completions generated (each up to the cap), at least 1.
        stream: Whether the reply streams.
        agent: The agent making the call (``gen_ai.agent.name``), if named.
        input_parts: The input as sent: signed (model and input) only when
            the chain limits repeated calls.
        cache_writes: Whether the provider may bill input at its cache-write
            price (the request marks blocks to cache, Anthropic's
            ``cache_control``); False: input is reserved at the dearest of the
            uncached and cache-read prices.
    """

    provider: str
    operation: str
    model: str
    input_bound: int
    requested_cap: int | None
    clampable: bool
    choices: int = 1
    stream: bool = False
    agent: str | None = None
    input_parts: object = None
    cache_writes: bool = True


class Admitted(NamedTuple):
    """The kernel's one answer to an admitted :class:`CallSpec`.

    Attributes:
        handle: The reservation to settle (``finish`` / ``commit``) once.
        cap: The output cap the call is sent with (None: as requested, uncapped).
        clamped: The cap the kernel set or lowered (None: the request's own).
        pool: The budget pool whose room set ``clamped`` (None: the chain,
            the model or a policy did).
        fallback: A cheaper model to send instead (None: the model requested).
        prices: What the call's usage is priced at (the fallback's when it
            has one); None for an unpriced model on a chain with no cost ceiling.
    """

    handle: CallHandle
    cap: int | None
    clamped: int | None
    pool: str | None
    fallback: str | None
    prices: UnitPrices | None


def call_signature(model: str, parts: object) -> str:
    """The repeat limit's key for a call: the model and its input, hashed."""
    raw = json.dumps([model, parts], sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:32]
