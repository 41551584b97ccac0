"""Errors of the shared (Redis / Valkey) ledger and breaker.

Exception tree::

    Exception
     ├── BudgetExceededError          (veronica_otel: every denial)
     │    └── LedgerUnavailableError  store unreachable: the call is denied (fail closed)
     │         └── LedgerLostError    the store lost a chain this process saw (on_loss="fail")
     └── LedgerCorruptedError         a key of ours holds something that is not ours

A store that cannot be reached denies calls: :class:`LedgerUnavailableError` is
a :class:`~veronica_otel.BudgetExceededError`, so ``wrap_llm_call`` returns
``Decision.HALT`` and instrumented clients raise it before sending. A value
that is not what the ledger wrote is never read as zero: it raises
:class:`LedgerCorruptedError`, naming the key and the field, and the call is
not sent either.
"""

from __future__ import annotations

from veronica_otel._errors import BudgetExceededError, TripEvent

__all__ = ["LedgerCorruptedError", "LedgerLostError", "LedgerUnavailableError"]


class LedgerUnavailableError(BudgetExceededError):
    """The shared store could not be reached, so the call is denied (fail closed).

    Its ``reason`` is ``"circuit_open"``: the set of trip reasons is closed and
    an unreachable store behaves like an open circuit in front of the chain
    (nothing is sent until it answers again). Unlike a limit, it is *not*
    sticky: the ledger raises it instead of returning a trip, so the chain is
    not marked as tripped and calls run again once the store is back.

    Attributes:
        store: Where the store was expected, password never included
            (``redis://127.0.0.1:6379/0``).
    """

    def __init__(self, trip: TripEvent, store: str = "") -> None:
        super().__init__(trip)
        self.store = store

    @classmethod
    def for_store(cls, store: str, chain_id: str, cause: BaseException) -> LedgerUnavailableError:
        """Build the error for ``chain_id`` when ``store`` failed with ``cause``."""
        message = (
            f"chain {chain_id}: ledger store {store} is unreachable "
            f"({type(cause).__name__}: {cause}); failing closed, the call was not sent "
            "(set VERONICA_FAIL_OPEN=true to fall back to a process-local ledger)"
        )
        return cls(TripEvent("circuit_open", 0.0, 0.0, chain_id, message), store)

    def __reduce__(self) -> tuple[type[LedgerUnavailableError], tuple[TripEvent, str]]:  # type: ignore[override]
        return (type(self), (self.trip, self.store))


class LedgerLostError(LedgerUnavailableError):
    """The store no longer has what this process saw of a chain: the call is denied.

    Raised only by a :class:`RedisLedger` made with ``on_loss="fail"`` (the
    default re-seeds the chain from this process's marks instead). The chain
    was flushed, expired, evicted, lost in a restart without persistence or
    rolled back to an older copy; admitting calls against it would hand its
    spent budget out again or lift its trip. Not sticky: once the chain is
    restored (or re-seeded by a settlement of a call that ran), calls run.

    Attributes:
        store: Where the store is, password never included.
        lost: What was lost, in words (``"committed 0.95 USD -> 0"``, ...).
    """

    def __init__(self, trip: TripEvent, store: str = "", lost: str = "") -> None:
        super().__init__(trip, store)
        self.lost = lost

    @classmethod
    def for_chain(cls, store: str, chain_id: str, lost: str) -> LedgerLostError:
        """Build the error for ``chain_id``, which ``store`` lost (``lost`` says what)."""
        message = (
            f"chain {chain_id}: ledger store {store} lost what this process saw of the "
            f"chain ({lost}); failing closed, the call was not sent (restore the store, "
            'or use on_loss="reseed" to re-seed the chain from this process\'s marks)'
        )
        return cls(TripEvent("circuit_open", 0.0, 0.0, chain_id, message), store, lost)

    def __reduce__(self) -> tuple[type[LedgerLostError], tuple[TripEvent, str, str]]:  # type: ignore[override]
        return (type(self), (self.trip, self.store, self.lost))


class LedgerCorruptedError(RuntimeError):
    """A key of the ledger holds a value the ledger did not write.

    Raised instead of reading it as zero (which would hand out budget that was
    already spent). Repair or delete the key.

    Attributes:
        key: The Redis key.
        field: The hash field, or ``"(type)"`` when the key has the wrong type.
        value: What was found (shortened).
    """

    def __init__(self, key: str, field: str, value: str) -> None:
        self.key = key
        self.field = field
        self.value = value
        super().__init__(
            f"ledger key {key!r} field {field!r} holds {value!r}, which is not a value "
            "the ledger wrote; refusing to read it as zero (repair or delete the key)"
        )

    def __reduce__(self) -> tuple[type[LedgerCorruptedError], tuple[str, str, str]]:
        return (type(self), (self.key, self.field, self.value))
