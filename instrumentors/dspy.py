"""dspy (>= 3.4): its native client's raw-socket transport, kept out of a chain.

Usage::

    from veronica_otel.instrumentors.dspy import DSPyInstrumentor
    from veronica_otel.instrumentors.litellm import LiteLLMInstrumentor

    LiteLLMInstrumentor().instrument()  # dspy's LiteLLM backend (its SDKs, its HTTP)
    DSPyInstrumentor().instrument()     # ... which every call in a chain takes
    with ExecutionContext(ExecutionConfig(max_steps=20)):
        react(question="...")

Under ``opentelemetry-instrument`` the ``veronica`` distro installs it once
the application has imported dspy: nothing to write.

dspy 3.4 sends a model call through one of two backends, chosen per call by
``dspy.clients.execution.select_backend``: a vendored client (``lm15``) that
speaks HTTP/1.1 over its own sockets, which no HTTP hook sees, or LiteLLM,
which our litellm, openai, ... adapters contain. dspy itself falls back to
LiteLLM whenever the native one does not fit a call (an environment gateway
such as ``OPENAI_BASE_URL``, client keys it lacks). Where it hooks: that
choice. Inside a chain, a call ``engine="auto"`` (the default) would send
natively goes through LiteLLM instead, with the same request; a call the
application pinned to ``engine="lm15"`` is refused
(:class:`~veronica_otel.instrumentors.InstrumentationError`, unless
``VERONICA_FAIL_OPEN=true``): we cannot contain it. Outside a chain nothing
changes.

A denial leaves the module call as the ``__cause__`` of dspy's LM
error (``LMUnexpectedError``, ``LMServerError``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from veronica_otel._config import parse_env_bool
from veronica_otel._propagation import default_context

from ._framework import FrameworkInstrumentor, argument
from ._hooks import Hook, InstrumentationError, SDKHooks

__all__ = ["DSPyInstrumentor"]

_instruments = ("dspy >= 3.4, < 4",)
_PINNED = (
    "veronica-otel cannot contain dspy's native lm15 transport (its own sockets): this LM "
    "is pinned to engine='lm15', so its calls in a chain are refused; use engine='auto' "
    "or 'litellm' (VERONICA_FAIL_OPEN=true lets them through uncontained)"
)


def _select(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    selection = wrapped(*args, **kwargs)
    if (
        not DSPyInstrumentor.active
        or not getattr(selection, "native", False)
        or default_context() is None
    ):
        return selection
    if getattr(argument(args, kwargs, 0, "lm"), "_engine_spec", "auto") == "lm15":
        if parse_env_bool("VERONICA_FAIL_OPEN"):
            return selection
        raise InstrumentationError(_PINNED)
    return dataclasses.replace(selection, native=False)  # LiteLLM: contained


_HOOKS = SDKHooks(
    _instruments[0],
    "dspy.clients.execution",
    (Hook("", "select_backend", _select, ("lm", "options")),),
    (("", ("select_backend",)),),
)


class DSPyInstrumentor(FrameworkInstrumentor):
    """Sends dspy's calls in a chain through its LiteLLM backend, which we contain."""

    _hooks = _HOOKS
    _instruments = _instruments
