"""One admitted call (:class:`CallHandle`) and the helpers of the wrap path."""

from __future__ import annotations

import contextvars
import inspect
from typing import Protocol

from ._ledger import Level, Reservation
from ._policy import PolicyContext, PolicyDecision
from ._units import nano_to_usd

__all__ = [
    "ACTIVE_CALL",
    "CallHandle",
    "close_awaitable",
    "is_coroutine_function",
    "settled_amounts",
]


class _Settles(Protocol):
    """What a call settles through: its chain (a protocol, so this module does not import it)."""

    @property
    def _aledger(self) -> object | None: ...

    def _finish(self, call: CallHandle, error: BaseException | None, sent: bool) -> None: ...

    async def _afinish(self, call: CallHandle, error: BaseException | None, sent: bool) -> None: ...


class CallHandle:
    """One admitted call: its reservation and, after it ran, its usage.

    Instrumentors get one from :meth:`ExecutionContext.begin_call` and must
    call :meth:`finish` exactly once (extra calls do nothing).
    """

    __slots__ = (
        "_done",
        "agents",
        "context",
        "cost_nano",
        "decision",
        "kind",
        "metrics",
        "model",
        "policy_context",
        "reservation",
        "tokens",
    )

    def __init__(
        self,
        context: _Settles,
        reservation: Reservation,
        policy_context: PolicyContext | None,
        decision: PolicyDecision,
    ) -> None:
        self.context = context
        self.reservation = reservation
        self.policy_context = policy_context
        self.decision = decision
        self.cost_nano = -1
        self.tokens = -1
        self._done = False
        self.kind = "llm"
        self.model: str | None = None
        # Per-call metrics only where telemetry is live (a recording chain span
        # or an instrumented client call): the bare wrap path stays lean.
        self.metrics = False
        # (path with agent levels, innermost agent) when agent limits bound it.
        self.agents: tuple[tuple[Level, ...], str] | None = None

    @property
    def reserved_usd(self) -> float:
        return nano_to_usd(self.reservation.cost_nano)

    def add_usage(self, cost_nano: int, tokens: int) -> None:
        """Add actual usage (integer units) reported during the call."""
        self.cost_nano = max(self.cost_nano, 0) + cost_nano
        self.tokens = max(self.tokens, 0) + tokens

    def commit(self, cost_nano: int, tokens: int, error: BaseException | None = None) -> None:
        """:meth:`add_usage` then :meth:`finish` in one step (an instrumented call's settlement)."""
        if self._done:
            return
        self.cost_nano = max(self.cost_nano, 0) + cost_nano
        self.tokens = max(self.tokens, 0) + tokens
        self._done = True
        self.context._finish(self, error, True)

    async def acommit(
        self, cost_nano: int, tokens: int, error: BaseException | None = None
    ) -> None:
        """:meth:`commit` for async code: a shared store is not waited on in the loop."""
        if self._done:
            return
        self.cost_nano = max(self.cost_nano, 0) + cost_nano
        self.tokens = max(self.tokens, 0) + tokens
        self._done = True
        context = self.context
        if context._aledger is None:
            context._finish(self, error, True)
        else:
            await context._afinish(self, error, True)

    async def afinish(self, error: BaseException | None = None, *, sent: bool = True) -> None:
        """:meth:`finish` for async code (same settlement; see ``abegin_call``)."""
        if self._done:
            return
        self._done = True
        context = self.context
        if context._aledger is None:  # in process: nothing to await
            context._finish(self, error, sent)
        else:
            await context._afinish(self, error, sent)

    def finish(self, error: BaseException | None = None, *, sent: bool = True) -> None:
        """Settle the call (DESIGN G10).

        ``sent=False``: nothing reached the provider; the reservation is
        released (cost and step given back). ``sent=True``: usage reported
        with :meth:`add_usage` is committed as reported; with none, the
        reservation (the call's worst case) is committed, whether or not
        ``error`` is set: a call that may have reached the provider and then
        raised, was cancelled or was interrupted is never free. An error reply
        the provider does not bill is settled with ``commit(0, 0, error)``.
        """
        if self._done:
            return
        self._done = True
        self.context._finish(self, error, sent)


def settled_amounts(call: CallHandle) -> tuple[int, int]:
    """What a sent call commits: its reported usage, else its reservation."""
    if call.cost_nano >= 0 or call.tokens >= 0:
        return max(call.cost_nano, 0), max(call.tokens, 0)
    # Sent and no usage reported: whether it raised, was cancelled or
    # returned, it may have been billed, so it costs its worst case (G10).
    reservation = call.reservation
    return reservation.cost_nano, reservation.tokens


# The call running in this thread or task: ``record_usage`` reports into it.
ACTIVE_CALL: contextvars.ContextVar[CallHandle | None] = contextvars.ContextVar(
    "veronica_otel_active_call", default=None
)

_CO_ASYNC = inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE


def is_coroutine_function(fn: object) -> bool:
    code = getattr(fn, "__code__", None)
    if code is not None and not hasattr(fn, "_is_coroutine_marker"):
        # Plain functions and lambdas: one flag test instead of inspect's walk.
        return bool(code.co_flags & _CO_ASYNC)
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    )


def close_awaitable(value: object) -> None:
    close = getattr(value, "close", None)
    if callable(close):
        close()
