"""Context-manager plumbing: the ``async with`` mixin and per-thread entries."""

from __future__ import annotations

import contextvars
from types import TracebackType
from typing import Any, Self

__all__ = ["AsyncFromSync", "Entries"]


class AsyncFromSync:
    """``async with x`` runs ``x.__enter__`` / ``x.__exit__``: entering and
    leaving never block, so one implementation serves both forms."""

    __slots__ = ()

    def __enter__(self) -> Self:
        raise NotImplementedError

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Any:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)


# The entries made in this thread or task (each has its own contextvars
# context): a stack of (owner, token, payload), so an exit finds its own.
_Entry = tuple[object, object, Any]
_ENTERED: contextvars.ContextVar[tuple[_Entry, ...]] = contextvars.ContextVar(
    "veronica_otel_entered", default=()
)


class Entries:
    """The open entries of one context manager that threads may enter at once.

    Each entry keeps the token its thread or task got from
    ``opentelemetry.context.attach``; :meth:`pop` returns the one made in the
    calling thread or task, so each exit detaches its own token (a shared
    stack would hand one thread another's token: "Failed to detach context",
    and both threads stay inside).
    """

    __slots__ = ("_open",)

    def __init__(self) -> None:
        self._open: list[_Entry] = []

    def push(self, owner: object, token: object, payload: Any) -> None:
        entry = (owner, token, payload)
        _ENTERED.set((*_ENTERED.get(), entry))
        self._open.append(entry)  # atomic: no lock needed

    def pop(self, owner: object) -> tuple[object | None, Any, bool]:
        """Remove this thread's or task's latest entry of ``owner``.

        Returns ``(token, payload, last)``: ``token`` is None when ``owner``
        was not entered here (exited in another thread or task: that entry's
        token cannot be detached from here, so the latest open entry is
        closed without it, and its token is detached when its own thread
        exits, with ``payload`` None then); ``last`` says whether no entry is
        left open.
        """
        stack = _ENTERED.get()
        mine: _Entry | None = None
        if stack and stack[-1][0] is owner:  # the common case: the latest entry here
            mine = stack[-1]
            _ENTERED.set(stack[:-1])
        else:
            for i in range(len(stack) - 2, -1, -1):
                if stack[i][0] is owner:
                    mine = stack[i]
                    _ENTERED.set(stack[:i] + stack[i + 1 :])
                    break
        entries = self._open
        if mine is not None:
            try:
                entries.remove(mine)  # atomic; entries differ in their token
            except ValueError:  # closed from another thread: only the token is left
                return mine[1], None, not entries
            return mine[1], mine[2], not entries
        try:
            return None, entries.pop()[2], not entries
        except IndexError:
            return None, None, True
