"""A framework's stream iterated inside a context of its own.

A streamed run (Strands ``stream_async``, smolagents ``run(stream=True)``) or
a streamed tool run must act for its agent, or hold its tool call, from its
first item to its last; the application's code between two items must not.
Entering the scope in the consumer's context would leak it there, and a
consumer that abandons the stream would leave it attached for good. So every
step (entering the scope, each item, leaving it) runs in one private copy of
the context the stream was made in: :meth:`contextvars.Context.run` for a
generator, a task made with ``context=`` for an async one.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Generic, TypeVar

__all__ = ["ScopedIterator", "ScopedStream"]

T = TypeVar("T")
R = TypeVar("R")
_NEW, _OPEN, _DONE = 0, 1, 2


class ScopedIterator(Generic[T]):
    """``iterator``'s items, each produced inside ``scope`` (entered at the first)."""

    def __init__(self, scope: AbstractContextManager[Any], iterator: Iterator[T]) -> None:
        self.context = contextvars.copy_context()
        self._scope = scope
        self._iterator = iterator
        self._state = _NEW

    def __iter__(self) -> ScopedIterator[T]:
        return self

    def __next__(self) -> T:
        if self._state == _DONE:
            raise StopIteration
        if self._state == _NEW:
            try:
                self.context.run(self._scope.__enter__)
            except BaseException:
                self._state = _DONE
                raise
            self._state = _OPEN
        try:
            return self.context.run(next, self._iterator)
        except BaseException as exc:
            self._leave(None if isinstance(exc, StopIteration) else exc)
            raise

    def close(self) -> None:
        """Close the framework's generator (its ``finally`` runs) and leave the scope."""
        if self._state == _DONE:
            return
        try:
            close = getattr(self._iterator, "close", None)
            if close is not None:
                self.context.run(close)
        finally:
            self._leave(None)

    def _leave(self, exc: BaseException | None) -> None:
        opened, self._state = self._state == _OPEN, _DONE
        if opened:
            tb = None if exc is None else exc.__traceback__
            self.context.run(self._scope.__exit__, None if exc is None else type(exc), exc, tb)


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


class ScopedStream(Generic[T]):
    """``stream``'s items, each produced inside ``scope`` (entered at the first)."""

    def __init__(self, scope: AbstractAsyncContextManager[Any], stream: AsyncIterator[T]) -> None:
        self.context = contextvars.copy_context()
        self._scope = scope
        self._stream = stream
        self._state = _NEW

    def __aiter__(self) -> ScopedStream[T]:
        return self

    async def __anext__(self) -> T:
        if self._state == _DONE:
            raise StopAsyncIteration
        if self._state == _NEW:
            try:
                await self._step(self._scope.__aenter__())
            except BaseException:  # denied: the framework's generator never starts
                self._state = _DONE
                raise
            self._state = _OPEN
        try:
            return await self._step(self._stream.__anext__())
        except BaseException as exc:
            await self._leave(None if isinstance(exc, StopAsyncIteration) else exc)
            raise

    async def aclose(self) -> None:
        """Close the framework's generator (its ``finally`` runs) and leave the scope."""
        if self._state == _DONE:
            return
        try:
            close = getattr(self._stream, "aclose", None)
            if close is not None:
                await self._step(close())
        finally:
            await self._leave(None)

    async def _leave(self, exc: BaseException | None) -> None:
        opened, self._state = self._state == _OPEN, _DONE
        if opened:
            tb = None if exc is None else exc.__traceback__
            await self._step(self._scope.__aexit__(None if exc is None else type(exc), exc, tb))

    async def _step(self, awaitable: Awaitable[R]) -> R:
        # A task runs in the context it is given; cancelling the consumer cancels it.
        return await asyncio.get_running_loop().create_task(
            _awaited(awaitable), context=self.context
        )
