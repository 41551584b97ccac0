"""Sizing an uncapped call: the most output the room left on its path buys.

A leaf the ledger and the kernel both use, so the arithmetic lives once: the
in-process ledger feeds it every level's and pool's room under its one lock
(:meth:`~veronica_otel._ledger.LocalLedger.reserve` with ``clamp``); a shared store's
chain feeds it the counters it read just before reserving.

Integers only (nano-USD per million tokens), as in ``UnitPrices``: the cost of
``n`` output tokens after ``bound`` input tokens is
``ceil((bound * input_price + n * output_price) / 1e6)``, the same as
``UnitPrices.max_cost_nano``, and what a room of ``r`` nano-USD buys is the
largest ``n`` whose cost fits (``UnitPrices.max_output_tokens_for``).
"""

from __future__ import annotations

from ._units import MAX_COUNT

__all__ = ["OutputClamp"]

_PER_MTOK = 1_000_000


class OutputClamp:
    """One uncapped call's sizing: fed the room of each level, then sized once.

    Args:
        bound: The call's input-token bound.
        input_price: Its worst input-side price (nano-USD per million tokens).
        output_price: Its worst output-side price.
        priced: Whether the model has prices (else only token rooms bound it).
        choices: How many completions the call asks for (each up to the cap).
        limit: The most output the model can return for this input (over
            all choices together: it only errs low).

    After :meth:`size`: ``cap`` is the output cap to send (None: nothing
    limits the call, send it uncapped) and ``pool`` the budget pool that set
    it (None: a chain level or the model's own limit did).
    """

    __slots__ = (
        "affordable",
        "bound",
        "cap",
        "choices",
        "input_price",
        "limit",
        "output_price",
        "pool",
        "priced",
    )

    def __init__(
        self,
        bound: int,
        input_price: int,
        output_price: int,
        priced: bool,
        choices: int,
        limit: int,
    ) -> None:
        self.bound = bound
        self.input_price = input_price
        self.output_price = output_price
        self.priced = priced
        self.choices = choices if choices > 1 else 1
        self.limit = limit
        self.affordable: int | None = None  # output tokens, over all choices
        self.pool: str | None = None
        self.cap: int | None = None

    def room(self, cost_left: int | None, tokens_left: int | None, pool: str | None = None) -> None:
        """Narrow the call to what ``cost_left`` and ``tokens_left`` (unreserved,
        None: no ceiling) buy after its input; ``pool`` names a pool's room,
        which is credited with the clamp only when it is strictly the tightest."""
        buys: int | None = None
        if cost_left is not None and self.priced:
            room = cost_left * _PER_MTOK - self.bound * self.input_price
            if room < 0:
                buys = 0
            elif self.output_price == 0:
                buys = MAX_COUNT
            else:
                buys = min(room // self.output_price, MAX_COUNT)
        if tokens_left is not None:
            left = tokens_left - self.bound
            left = left if left > 0 else 0
            buys = left if buys is None or left < buys else buys
        if buys is not None and (self.affordable is None or buys < self.affordable):
            self.affordable = buys
            self.pool = pool

    def reset(self) -> None:
        """Forget the room seen: the call is sized afresh (it waited for room)."""
        self.affordable = None
        self.pool = None
        self.cap = None

    def size(self) -> tuple[int, int]:
        """The reservation (cost_nano, tokens) for the room seen; sets ``cap``."""
        affordable = self.affordable
        if affordable is None:  # no ceiling anywhere: sent uncapped, the input reserved
            self.cap = None
            self.pool = None
            output = 0
        else:
            if affordable >= self.limit:
                affordable = self.limit  # the model's own limit, not a budget, bounds it
                self.pool = None
            self.cap = cap = affordable // self.choices or 1
            output = cap * self.choices
        cost = -(-(self.bound * self.input_price + output * self.output_price) // _PER_MTOK)
        return cost, self.bound + output
