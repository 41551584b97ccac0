"""A mixin for context managers whose ``async with`` form does the same work."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

__all__ = ["AsyncFromSync"]


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
