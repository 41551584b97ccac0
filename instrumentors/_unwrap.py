"""Finding and removing our own wrapper, and only ours, wherever it sits.

Several instrumentations may wrap the same method with ``wrapt``; each wrapper
holds the next one in ``__wrapped__``. ``opentelemetry.instrumentation.utils.unwrap``
removes whatever wrapper is outermost, which may be another instrumentation's.
Here ours is found anywhere in that chain and spliced out, so a wrapper
installed over ours keeps working, now straight over what ours wrapped.
"""

from __future__ import annotations

from typing import Any

import wrapt

__all__ = ["is_ours", "unwrap_ours"]

_MAX_DEPTH = 64  # a chain of wrappers is a handful deep; a cycle must not hang us


def _find(owner: Any, method: str, wrapper: object) -> tuple[Any, Any] | None:
    """``(outer, ours)``: our FunctionWrapper and the wrapper over it (None: outermost).

    The transport attempt hooks (``_attempts``) are plain functions, not
    FunctionWrappers: walked through the same way (they call their
    ``__wrapped__``), and found by their ``veronica_hook``.
    """
    outer: Any = None
    current = owner.__dict__.get(method)
    for _ in range(_MAX_DEPTH):
        if isinstance(current, wrapt.FunctionWrapper):
            if getattr(current, "_self_wrapper", None) is wrapper:
                return outer, current
        else:
            hook = getattr(current, "veronica_hook", None)
            if hook is None or not hasattr(current, "__wrapped__"):
                return None
            if hook is wrapper:
                return outer, current
        outer, current = current, current.__wrapped__
    return None


def is_ours(owner: Any, method: str, wrapper: object) -> bool:
    """Whether our ``wrapper`` is anywhere in ``owner.method``'s chain (never wrap twice)."""
    return _find(owner, method, wrapper) is not None


def unwrap_ours(owner: Any, method: str, wrapper: object) -> None:
    """Remove our ``wrapper`` from ``owner.method``, leaving any other wrapper in place."""
    found = _find(owner, method, wrapper)
    if found is None:
        return
    outer, ours = found
    if outer is None:
        setattr(owner, method, ours.__wrapped__)
    else:
        outer.__wrapped__ = ours.__wrapped__  # splice: theirs now wraps what ours did
