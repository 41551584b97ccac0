"""What the store commands (``override``, ``pools``) share: how a store problem is said."""

from __future__ import annotations

import logging

from veronica_otel._errors import BudgetExceededError

# What the store raises when it cannot be reached (LedgerUnavailableError, a
# BudgetExceededError with a ``store``): caught by its base, so this module
# imports without the redis extra, whose absence the commands report.
StoreDown = BudgetExceededError

__all__ = ["StoreDown", "quiet_store_log", "store_down"]


def quiet_store_log() -> None:
    """The command says what went wrong with the store itself, in its own words:
    the ledger's log lines are written for apps (calls denied, the call not sent)."""
    logging.getLogger("veronica_otel.distributed").setLevel(logging.ERROR)


def store_down(error: BudgetExceededError) -> str:
    """``the ledger store URL cannot be reached (cause)``: the store, not a call."""
    cause = error.__cause__ or error.__context__
    why = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
    store = getattr(error, "store", "") or "(unknown)"
    return f"the ledger store {store} cannot be reached{why}"
