"""One admitted call (:class:`CallHandle`) and the helpers of the wrap path."""

from __future__ import annotations

import contextvars
import inspect
import threading
from typing import Protocol

from ._ledger import Level, Reservation
from ._policy import PolicyContext, PolicyDecision
from ._units import nano_to_usd

_new = object.__new__

__all__ = [
    "ACTIVE_CALL",
    "CallHandle",
    "close_awaitable",
    "is_coroutine_function",
    "joins_wrapped_call",
    "new_call",
    "PlainCall",
    "settled_amounts",
]


class _Settles(Protocol):
    """What a call settles through: its chain's settlement part (a protocol, so
    this module does not import it)."""

    @property
    def aledger(self) -> object | None: ...

    def settle(self, call: CallHandle, error: BaseException | None, sent: bool) -> None: ...

    async def asettle(self, call: CallHandle, error: BaseException | None, sent: bool) -> None: ...


class CallHandle:
    """One admitted call: its reservation and, after it ran, its usage.

    Instrumentors get one from :meth:`ExecutionContext.begin_call` and must
    call :meth:`finish` exactly once (extra calls do nothing). ``context`` is
    the chain's settlement part, which the call settles through (it keeps
    the chain's state, and so its ledger entry, alive while the call runs).
    """

    # Set (True) only on a wrapped LLM call that an instrumented call joined
    # (:func:`joins_wrapped_call`); never assigned in ``__new__``, so the
    # wrap path pays nothing for it: read it with ``getattr(call, "joined", False)``.
    joined: bool
    # Set by __new__ (each call's, by position): its settlement part, its
    # reservation, its policy's context and decision, usage so far (-1: none
    # reported), settled yet, "llm" or "tool", its model, whether it records
    # the per-call metric, and (path with agent levels, innermost agent) when
    # agent limits bound it.
    context: _Settles
    reservation: Reservation
    policy_context: PolicyContext | None
    decision: PolicyDecision
    cost_nano: int
    tokens: int
    _done: bool
    kind: str
    model: str | None
    metrics: bool
    agents: tuple[tuple[Level, ...], str] | None

    __slots__ = (
        "_done",
        "agents",
        "context",
        "cost_nano",
        "decision",
        "joined",
        "kind",
        "metrics",
        "model",
        "policy_context",
        "reservation",
        "tokens",
    )

    def __new__(
        cls,
        context: _Settles,
        reservation: Reservation,
        policy_context: PolicyContext | None,
        decision: PolicyDecision,
    ) -> CallHandle:
        # ``__new__``, not ``__init__``: the hot paths call it as a plain
        # function (:func:`new_call`), without a class call running an
        # initialiser (once per admitted call).
        call: CallHandle = _new(cls)
        call.context = context
        call.reservation = reservation
        call.policy_context = policy_context
        call.decision = decision
        call.cost_nano = -1
        call.tokens = -1
        call._done = False
        call.kind = "llm"  # a wrapped tool call says "tool" (joins_wrapped_call reads it)
        call.model = None
        # Per-call metrics only where telemetry is live (a recording chain span
        # or an instrumented client call): the bare wrap path stays lean.
        call.metrics = False
        call.agents = None
        return call

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
        # max(x, 0) + usage, without two calls into max (once per call)
        held = self.cost_nano
        self.cost_nano = held + cost_nano if held > 0 else cost_nano
        held = self.tokens
        self.tokens = held + tokens if held > 0 else tokens
        self._done = True
        self.context.settle(self, error, True)

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
        if context.aledger is None:
            context.settle(self, error, True)
        else:
            await context.asettle(self, error, True)

    async def afinish(self, error: BaseException | None = None, *, sent: bool = True) -> None:
        """:meth:`finish` for async code (same settlement; see ``abegin_call``)."""
        if self._done:
            return
        self._done = True
        context = self.context
        if context.aledger is None:  # in process: nothing to await
            context.settle(self, error, sent)
        else:
            await context.asettle(self, error, sent)

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
        self.context.settle(self, error, sent)


#: ``CallHandle(context, reservation, policy_context, decision)`` as a plain
#: function taking the class first (``PlainCall`` or ``CallHandle``).
new_call = CallHandle.__new__


class PlainCall(CallHandle):
    """A call the chain's plain lane admitted: an in-process root chain's own
    step, with no agent levels and no policy context (``_llm_admission``).

    It settles as any :class:`CallHandle`; only :meth:`commit` (an
    instrumented call's settlement) goes straight to the chain's one ledger
    level, which is what ``Settlement.settle`` does for such a call.
    """

    __slots__ = ()

    def commit(self, cost_nano: int, tokens: int, error: BaseException | None = None) -> None:
        if self._done:
            return
        held = self.cost_nano  # usage reported into it before (record_usage) adds
        cost = held + cost_nano if held > 0 else cost_nano
        held = self.tokens
        tokens = held + tokens if held > 0 else tokens
        self.cost_nano = cost
        self.tokens = tokens
        self._done = True
        context = self.context
        if cost < 0 or tokens < 0:  # never from an instrumentor: settle's general reading
            context.settle(self, error, True)
            return
        # Settlement.settle's sent branch for a call with no agents and no
        # policy context, on its chain's one level (settle's ``fast`` case).
        ledger, level, state = context._fast  # type: ignore[attr-defined]
        overrun = ledger.commit_one(level, state, self.reservation, cost, tokens)
        if overrun is not None or self.metrics:
            context._finished(self, error, cost, overrun)  # type: ignore[attr-defined]


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

_join_lock = threading.Lock()


def joins_wrapped_call(context: object) -> bool:
    """Whether the LLM call being admitted now is the wrapped LLM call around it (DESIGN G13).

    ``wrap_llm_call(fn)`` counts one step and, unless told otherwise, its
    hint; an instrumented LLM call that ``fn`` makes in the same chain is the
    call the wrap stands for. The first such call *joins* the wrap: it takes
    no step of its own (the wrap holds it), still reserves its own worst case
    before it is sent (G1) and commits its actual usage; the wrap then
    commits no cost or tokens of its own (its hint is released when it
    ends; usage reported with ``record_usage`` still counts) and no second
    call metric. Every later instrumented call in the same wrap takes a step
    of its own: a step is one request, so ``max_steps`` still bounds what is
    sent however many requests ``fn`` makes. A wrapped tool call, another
    chain's wrap, or a wrap that already ended (a task that outlived it)
    is joined by nothing. Only the first call to ask gets True, across
    threads and tasks.
    """
    call = ACTIVE_CALL.get()
    if call is None or call.context is not context or call.kind != "llm":
        return False
    with _join_lock:  # one joiner, even from threads that inherited the wrap
        if call._done or getattr(call, "joined", False):
            return False
        call.joined = True
        # No usage of its own so far: the joined call commits the LLM call's.
        call.cost_nano = max(call.cost_nano, 0)
        call.tokens = max(call.tokens, 0)
        call.metrics = False  # the joined call records the one call metric
    return True


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
