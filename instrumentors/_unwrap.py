"""Removing our own wrapper, and only ours."""

from __future__ import annotations

from typing import Any

import wrapt

__all__ = ["unwrap_ours"]


def unwrap_ours(owner: Any, method: str, wrapper: object) -> None:
    """Remove our wrapper from ``owner.method`` if it is the outermost one.

    ``opentelemetry.instrumentation.utils.unwrap`` removes whatever wrapper is
    outermost, which may be another instrumentation's. A wrapper applied over
    ours stays in place here; ours must then pass through, inactive.
    """
    current = owner.__dict__.get(method)
    if isinstance(current, wrapt.FunctionWrapper) and current._self_wrapper is wrapper:
        setattr(owner, method, current.__wrapped__)
