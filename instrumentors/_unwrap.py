"""Removing our own wrapper, and only ours."""

from __future__ import annotations

from typing import Any

import wrapt

__all__ = ["is_ours", "unwrap_ours"]


def is_ours(owner: Any, method: str, wrapper: object) -> bool:
    """Whether ``owner.method`` is, outermost, our ``wrapper`` (so not to wrap it twice)."""
    current = owner.__dict__.get(method)
    return isinstance(current, wrapt.FunctionWrapper) and current._self_wrapper is wrapper


def unwrap_ours(owner: Any, method: str, wrapper: object) -> None:
    """Remove our wrapper from ``owner.method`` if it is the outermost one.

    ``opentelemetry.instrumentation.utils.unwrap`` removes whatever wrapper is
    outermost, which may be another instrumentation's. A wrapper applied over
    ours stays in place here; ours must then pass through, inactive.
    """
    if is_ours(owner, method, wrapper):
        setattr(owner, method, owner.__dict__[method].__wrapped__)
