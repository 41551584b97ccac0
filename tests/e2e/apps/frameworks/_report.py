"""How a framework's run ended, as one ``RESULT {json}`` line for the test to read.

``how`` says where our ``BudgetExceededError`` was: ``"itself"`` (it reached
the caller unchanged), ``"cause"`` (the ``__cause__`` / ``__context__`` of
the framework's own error), ``"group"`` (inside an ``ExceptionGroup``), or
``None`` (the run ended some other way).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def _ours(exc: BaseException) -> bool:
    return type(exc).__name__ == "BudgetExceededError" and type(exc).__module__.startswith(
        "veronica_otel"
    )


def _find(exc: BaseException, seen: set[int]) -> tuple[str, BaseException] | None:
    if id(exc) in seen:
        return None
    seen.add(id(exc))
    if _ours(exc):
        return "itself", exc
    for inner in getattr(exc, "exceptions", ()) or ():  # an ExceptionGroup
        found = _find(inner, seen)
        if found is not None:
            return "group", found[1]
    for link in (exc.__cause__, exc.__context__):
        if link is not None:
            found = _find(link, seen)
            if found is not None:
                return ("group" if found[0] == "group" else "cause"), found[1]
    return None


def outcome(exc: BaseException | None) -> dict[str, Any]:
    if exc is None:
        return {"raised": None, "how": None}
    found = _find(exc, set())
    result: dict[str, Any] = {"raised": type(exc).__name__, "how": None, "message": str(exc)[:300]}
    if found is not None:
        how, ours = found
        result.update(
            how=how, reason=getattr(ours, "reason", None), agent=getattr(ours, "agent", None)
        )
    return result


def ended(main: Callable[[], object]) -> dict[str, Any]:
    """How ``main()`` ended (see :func:`outcome`)."""
    try:
        main()
    except BaseException as exc:  # the test reads how it ended
        return outcome(exc)
    return outcome(None)


def report(result: dict[str, Any]) -> None:
    print("RESULT " + json.dumps(result), flush=True)


def run(main: Callable[[], object]) -> None:
    report(ended(main))
