"""The paper-style wrap API: ``wrap_llm_call`` and friends run a callable as one contained call.

The part of :class:`~veronica_otel.ExecutionContext` behind ``wrap_*``: it admits
through the chain's admission, runs ``fn`` and settles through its settlement.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from types import FunctionType
from typing import Any

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

__all__ = ["WrapCalls"]

_ALLOW = Decision.ALLOW
_HALT = Decision.HALT
# Bound once: ``ACTIVE_CALL.set`` on an imported name compiles to an attribute
# load that makes a bound method per call.
_set_active = ACTIVE_CALL.set
_reset_active = ACTIVE_CALL.reset

_SyncWrap = Callable[["WrapCalls", Callable[[], Any], "WrapOptions | None"], Decision]


def _sync_wrap(kind: str, doc: str) -> _SyncWrap:
    """``wrap_{kind}_call``: admit, run, settle (one body for both kinds; the kind
    is bound here rather than passed down, so a call runs one frame fewer)."""

    tool = kind == "tool"  # its handle says so: no LLM call inside joins it

    def wrap(
        self: WrapCalls, fn: Callable[[], Any], options: WrapOptions | None = None
    ) -> Decision:
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
                call = self._begin(kind, "", None, None, 0, 0)
            elif options.plain:
                call = self._begin(
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
        self._settle(call, None, True)
        return _ALLOW

    wrap.__name__ = wrap.__qualname__ = f"wrap_{kind}_call"
    wrap.__doc__ = doc
    return wrap


class WrapCalls:
    """``wrap_*`` / ``awrap_*``: admit, run, settle; a denial is ``Decision.HALT``."""

    __slots__ = ("_admission", "_begin", "_settle", "_state")

    def __init__(self, state: ChainState, admission: Admission, settlement: Settlement) -> None:
        self._state = state  # its partial result: the last wrapped call's
        self._admission = admission
        # Bound once: the wrap path's two kernel calls, one attribute read each.
        self._begin = admission.begin_priced_call
        self._settle = settlement.settle

    wrap_llm_call = _sync_wrap(
        "llm",
        """Run ``fn`` as one LLM call (see ``ExecutionContext.wrap_llm_call``).""",
    )
    wrap_tool_call = _sync_wrap(
        "tool", """Run ``fn`` as one tool call if the chain allows it (see wrap_llm_call)."""
    )

    async def awrap_llm_call(
        self, fn: Callable[[], Awaitable[Any]], options: WrapOptions | None = None
    ) -> Decision:
        """Coroutine version of :meth:`wrap_llm_call`; ``fn`` returns an awaitable."""
        return await self._awrap(fn, options, "llm")

    async def awrap_tool_call(
        self, fn: Callable[[], Awaitable[Any]], options: WrapOptions | None = None
    ) -> Decision:
        """Coroutine version of :meth:`wrap_tool_call`."""
        return await self._awrap(fn, options, "tool")

    async def _awrap(
        self, fn: Callable[[], Awaitable[Any]], options: WrapOptions | None, kind: str
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
