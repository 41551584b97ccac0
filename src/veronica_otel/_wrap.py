"""The paper-style wrap API: ``wrap_llm_call`` and friends run a callable as one contained call.

Methods of :class:`~veronica_otel.ExecutionContext` (assigned in its class
body, so a wrapped call runs no frame of the front's): each admits through the
chain's admission part, runs ``fn`` and settles through its settlement part.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from types import FunctionType
from typing import Any, Protocol

from ._admission import Admission
from ._call import (
    ACTIVE_CALL,
    CallHandle,
    close_awaitable,
    is_coroutine_function,
)
from ._chain_state import ChainState
from ._errors import BudgetExceededError
from ._options import Decision, WrapOptions
from ._settlement import Settlement

__all__ = ["awrap_llm_call", "awrap_tool_call", "wrap_llm_call", "wrap_tool_call"]

_ALLOW = Decision.ALLOW
_HALT = Decision.HALT
# Bound once: ``ACTIVE_CALL.set`` on an imported name compiles to an attribute
# load that makes a bound method per call.
_set_active = ACTIVE_CALL.set
_reset_active = ACTIVE_CALL.reset


class _Front(Protocol):
    """The parts of a chain the wrap API uses (so this module does not import the context)."""

    _state: ChainState
    _admission: Admission
    _settlement: Settlement


_SyncWrap = Callable[[Any, Callable[[], Any], "WrapOptions | None"], Decision]


def _sync_wrap(kind: str, doc: str) -> _SyncWrap:
    """``wrap_{kind}_call``: admit, run, settle (one body for both kinds; the kind
    is bound here rather than passed down, so a call runs one frame fewer)."""

    tool = kind == "tool"  # its handle says so: no LLM call inside joins it

    def wrap(self: _Front, fn: Callable[[], Any], options: WrapOptions | None = None) -> Decision:
        # Methods, partials, callable objects are checked before admission. A
        # plain function is not checked per call: an ``async def`` one returns
        # a coroutine, refused below with its reservation released (and a
        # denied call checks it first, so the TypeError is never hidden).
        if type(fn) is not FunctionType:
            _check_sync(fn, kind)
        try:  # the one admission path every door takes (no lane of its own)
            # The kernel entry as begin_call enters it, without its frame when
            # the options need no pricing (no model, signature or retry).
            if options is None:
                call = self._admission.begin_priced_call(kind, "", None, None, 0, 0)
            elif options.plain:
                call = self._admission.begin_priced_call(
                    kind,
                    options.operation_name,
                    None,
                    None,
                    options.hint_nano,
                    options.reserved_tokens,
                )
            else:
                call = self._admission.begin_call(kind, options)
        except BudgetExceededError:
            _check_sync(fn, kind)
            return _HALT
        if tool:
            call.kind = "tool"
        if call.decision.rate_limit_ms:
            _wait(call)
        active = _set_active(call)
        try:
            result = fn()
        except BudgetExceededError as exc:
            call.finish(exc)
            return _HALT
        except BaseException as exc:
            call.finish(exc)
            raise
        finally:
            _reset_active(active)
        if result is not None and inspect.isawaitable(result):
            call.finish(TypeError("awaitable"), sent=False)
            close_awaitable(result)
            _check_sync(fn, kind)  # an async def: said as such
            raise TypeError(f"wrap_{kind}_call got an awaitable from {fn!r}; use awrap_{kind}_call")
        self._state.partial = result
        call._done = True  # settled here, one frame less on the hot path
        self._settlement.settle(call, None, True)
        return _ALLOW

    wrap.__name__ = wrap.__qualname__ = f"wrap_{kind}_call"
    wrap.__doc__ = doc
    return wrap


wrap_llm_call = _sync_wrap(
    "llm",
    """Run ``fn`` as one LLM call if the chain allows it.

    Returns ``Decision.ALLOW`` after running it, ``Decision.HALT`` without
    running it. Errors raised by ``fn`` propagate unchanged (a
    ``BudgetExceededError`` from a call inside ``fn`` returns ``HALT``).

    ``fn`` is committed at what it reported with ``record_usage``, else at
    its reservation (``cost_estimate_hint`` or the priced worst case),
    whether it returned or raised: once it ran, the provider may have
    billed it (DESIGN G10). That holds for any exception, for
    ``KeyboardInterrupt`` and for a ``BudgetExceededError`` raised by an
    inner call, since ``fn`` may have sent a request before the denial.
    Only a call that never started (denied, or interrupted during a
    rate-limit wait) is released.

    An instrumented LLM call that ``fn`` makes in this chain is the call
    the wrap stands for (DESIGN G13): the first one counts no step of its
    own, reserves its own worst case before it is sent and commits its
    actual usage, and the wrap then commits no cost of its own (its hint
    is released). Each further one takes its own step.
    """,
)
wrap_tool_call = _sync_wrap(
    "tool", """Run ``fn`` as one tool call if the chain allows it (see wrap_llm_call)."""
)


async def awrap_llm_call(
    self: _Front, fn: Callable[[], Awaitable[Any]], options: WrapOptions | None = None
) -> Decision:
    """Coroutine version of :meth:`wrap_llm_call`; ``fn`` returns an awaitable."""
    return await _awrap(self, fn, options, "llm")


async def awrap_tool_call(
    self: _Front, fn: Callable[[], Awaitable[Any]], options: WrapOptions | None = None
) -> Decision:
    """Coroutine version of :meth:`wrap_tool_call`."""
    return await _awrap(self, fn, options, "tool")


async def _awrap(
    self: _Front, fn: Callable[[], Awaitable[Any]], options: WrapOptions | None, kind: str
) -> Decision:
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {fn!r}")
    try:
        call = await self._admission.abegin_call(kind, options)
    except BudgetExceededError:
        return Decision.HALT
    call.kind = kind
    if call.decision.rate_limit_ms:
        import asyncio  # only rate-limited async calls need it; it is slow to import

        try:
            await asyncio.sleep(call.decision.rate_limit_ms / 1000)
        except BaseException:  # cancelled while waiting: nothing was sent
            await call.afinish(sent=False)
            raise
    active = ACTIVE_CALL.set(call)
    try:
        result = await fn()
    except BudgetExceededError as exc:
        await call.afinish(exc)
        return Decision.HALT
    except BaseException as exc:
        await call.afinish(exc)
        raise
    finally:
        ACTIVE_CALL.reset(active)
    self._state.partial = result
    await call.afinish()
    return Decision.ALLOW


def _check_sync(fn: object, kind: str) -> None:
    """TypeError for what a sync wrapper cannot run (before anything is reserved)."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {fn!r}")
    if is_coroutine_function(fn):
        raise TypeError(f"wrap_{kind}_call got a coroutine function {fn!r}; use awrap_{kind}_call")


def _wait(call: CallHandle) -> None:
    """A rate-limit degradation's wait before a sync call is sent."""
    try:
        time.sleep(call.decision.rate_limit_ms / 1000)
    except BaseException:  # KeyboardInterrupt while waiting: nothing was sent
        call.finish(sent=False)
        raise
