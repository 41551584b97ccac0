"""A configured bound for an adapter's call that no price covers.

An adapter reads an endpoint billed in units no token price covers as a
request with ``priced=False`` (Gemini images, videos, batches, tuning). The
policy file can bound what one such call may spend,
``[prices."gcp.gemini:batchGenerateContent"] per_request = 20.0`` (the key is
the provider and the call's ``gen_ai.operation.name``): the call is then
admitted at that bound, reserved and committed whole (:class:`BoundedCall`:
what its reply reports is not its bill). Without a bound it is refused under
a cost ceiling, the error naming the key (:func:`how_to_bound`).
"""

from __future__ import annotations

from typing import Any

from veronica_otel._attributes import BOUND_USD
from veronica_otel._context import ExecutionContext
from veronica_otel._pricing import PriceTable, default_price_table
from veronica_otel._unit_prices import request_bound_cents

from ._common import ContainedCall

__all__ = ["BOUND_USD", "BoundedCall", "bounded", "how_to_bound", "price_table"]


class BoundedCall(ContainedCall):
    """A call admitted at a configured bound: it costs its reservation."""

    def set_usage(
        self,
        input_tokens: object,
        output_tokens: object,
        cached: object = 0,
        reasoning: object = 0,
        cache_write: object = 0,
    ) -> bool:
        return False  # a job's reply reports what it submitted, not what it will bill


def price_table(ctx: ExecutionContext) -> PriceTable:
    """The prices ``ctx`` reserves with."""
    table = ctx._state.prices
    return table if table is not None else default_price_table()


def bounded(ctx: ExecutionContext, provider: str, request: Any) -> Any:
    """``request`` (an ``_adapter.Request`` with ``priced=False``) admitted at its
    configured bound, or as it is when none is configured."""
    key = f"{request.operation}#request"
    prices = price_table(ctx).lookup(provider, key)
    if prices is None:
        return request
    cents = request_bound_cents(prices)
    return request._replace(
        model=key,
        input_parts=[request.operation, request.model],
        n_messages=1,
        cap=cents,
        clampable=False,
        choices=1,
        stream=False,
        extra_input_tokens=0,
        attributes={**(request.attributes or {}), BOUND_USD: cents / 100},
        priced=True,
    )


def how_to_bound(provider: str, operation: str) -> str:
    """The refusal's advice for an unbounded call of ``operation``."""
    return (
        "cannot be priced before it is sent: bound what one call may spend in the policy "
        f'file ([prices."{provider}:{operation}"] per_request = <USD>), or run it in a '
        "chain without max_cost_usd (it counts a step)"
    )
