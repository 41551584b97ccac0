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
such as ``OPENAI_BASE_URL``, client keys it lacks). Where it hooks:

- that choice, ``dspy.clients.execution.select_backend``: inside a chain, a
  call ``engine="auto"`` (the default) would send natively goes through
  LiteLLM instead, with the same request;
- lm15's own socket transports, ``StdlibTransport.stream``,
  ``StdlibAsyncTransport.stream`` and ``FetchTransport.stream`` (in
  ``dspy._vendor.lm15.transports``), which every native send opens, whoever
  makes it (an LM pinned to ``engine="lm15"``, lm15 providers used directly):
  in a chain that limits anything, the send is refused before it connects
  (:class:`~veronica_otel.instrumentors.InstrumentationError`, unless
  ``VERONICA_FAIL_OPEN=true``): we cannot contain it. An lm15 transport of
  the application's own over ``httpx`` or ``requests`` is contained by the
  HTTP vendor guard instead.

Every run of a dspy tool (``dspy.adapters.types.tool.Tool.__call__`` and
``acall``: ReAct's tools, ``finish`` included) is one step of the chain,
checked before the tool runs. Outside a chain nothing changes.

A denial leaves the module call as the ``__cause__`` of dspy's LM
error (``LMUnexpectedError``, ``LMServerError``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from veronica_otel._propagation import default_context

from ._framework import FrameworkInstrumentor, argument, as_tool, as_tool_async
from ._hooks import Hook, InstrumentationError, SDKHooks

__all__ = ["DSPyInstrumentor"]

_instruments = ("dspy >= 3.4, < 4",)
_NATIVE = (
    "veronica-otel cannot contain dspy's native lm15 transport (its own sockets): its "
    "sends in a chain are refused; use an LM with engine='auto' or 'litellm' "
    "(VERONICA_FAIL_OPEN=true lets them through uncontained)"
)
_TRANSPORTS = "_vendor.lm15.transports."


def _select(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    selection = wrapped(*args, **kwargs)
    if (
        not DSPyInstrumentor.active
        or not getattr(selection, "native", False)
        or default_context() is None
        or getattr(argument(args, kwargs, 0, "lm"), "_engine_spec", "auto") == "lm15"
    ):
        return selection  # a pinned lm15 LM is refused at its transport, in a chain
    return dataclasses.replace(selection, native=False)  # LiteLLM: contained


def _native(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if DSPyInstrumentor.active and _HOOKS.refused(_NATIVE):
        raise InstrumentationError(_NATIVE)
    return wrapped(*args, **kwargs)


def _tool(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not DSPyInstrumentor.active:
        return wrapped(*args, **kwargs)
    name = getattr(instance, "name", None)
    return as_tool("dspy", name, kwargs, lambda: wrapped(*args, **kwargs))


async def _atool(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not DSPyInstrumentor.active:
        return await wrapped(*args, **kwargs)
    name = getattr(instance, "name", None)
    return await as_tool_async("dspy", name, kwargs, lambda: wrapped(*args, **kwargs))


_TOOL = "adapters.types.tool.Tool"
_HOOKS = SDKHooks(
    _instruments[0],
    "dspy",
    (
        Hook("clients.execution", "select_backend", _select, ("lm", "options")),
        Hook(f"{_TRANSPORTS}_sync.StdlibTransport", "stream", _native, ("request",)),
        Hook(f"{_TRANSPORTS}_async.StdlibAsyncTransport", "stream", _native, ("request",)),
        Hook(f"{_TRANSPORTS}_fetch.FetchTransport", "stream", _native, ("request",)),
        Hook(_TOOL, "__call__", _tool),
        Hook(_TOOL, "acall", _atool, (), (), True),
    ),
    (
        ("clients.execution", ("select_backend",)),
        (f"{_TRANSPORTS}_sync.StdlibTransport", ("stream",)),
        (f"{_TRANSPORTS}_async.StdlibAsyncTransport", ("stream",)),
        (f"{_TRANSPORTS}_fetch.FetchTransport", ("stream",)),
        (_TOOL, ("__call__", "acall")),
    ),
)


class DSPyInstrumentor(FrameworkInstrumentor):
    """Sends dspy's calls in a chain through its LiteLLM backend, which we contain,
    and refuses what its native transport would send in a chain."""

    _hooks = _HOOKS
    _instruments = _instruments
