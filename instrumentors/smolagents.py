"""Agent names for smolagents (``smolagents`` >= 1.26).

Usage::

    from veronica_otel.instrumentors.openai import OpenAIInstrumentor
    from veronica_otel.instrumentors.smolagents import SmolagentsInstrumentor

    OpenAIInstrumentor().instrument()      # OpenAIServerModel: the openai SDK
    SmolagentsInstrumentor().instrument()  # ... each run under its agent's name
    with ExecutionContext(ExecutionConfig(max_steps=20)):
        agent.run("...")

Under ``opentelemetry-instrument`` the ``veronica`` distro installs it once
the application has imported smolagents: nothing to write.

Where it hooks: ``smolagents.agents.MultiStepAgent.run`` (every agent,
managed agents included, runs through it); the run runs as
:func:`veronica_otel.agent` named after the agent's ``name`` (an agent
without one is not scoped), so ``[agents."name"]`` limits apply. A streamed
run (``stream=True``) returns a generator: it runs under the name from its
first step to its last.

Every tool run (``smolagents.tools.Tool.__call__``: a ``ToolCallingAgent``'s
calls and a ``CodeAgent``'s code alike, ``final_answer`` included) is one
step of the chain, checked before the tool runs.

A denial leaves ``run`` as the ``__cause__`` of smolagents'
``AgentGenerationError``: a denied tool run becomes an error step the model
reads, and the sticky trip denies the model call after it.

A denial is never retried by smolagents' own retry loop
(``smolagents.utils.Retrying.__call__``, around every API model's call). It
retries any error whose text holds ``"429"`` or ``"rate limit"`` twice, the
first time after 2 to 4 minutes' sleep, the second after 4 to 16 more: the
text of a denial names its chain, whose random hex id holds ``"429"`` about
once in 140 chains, and such a denial held the run that long before it
ended, each retry denied again. So each retryer's predicate is made to refuse
a denial (one anywhere in the error's causes) on its first call.
"""

from __future__ import annotations

from typing import Any

from ._framework import (
    FrameworkInstrumentor,
    argument,
    as_agent,
    as_agent_iter,
    as_tool,
    caused_by_denial,
)
from ._hooks import Hook, SDKHooks

__all__ = ["SmolagentsInstrumentor"]

_instruments = ("smolagents >= 1.26, < 2",)


def _run(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not SmolagentsInstrumentor.active:
        return wrapped(*args, **kwargs)
    name = getattr(instance, "name", None)
    if argument(args, kwargs, 1, "stream"):  # a generator: named while it is consumed
        return as_agent_iter(name, wrapped(*args, **kwargs))
    return as_agent(name, lambda: wrapped(*args, **kwargs))


def _tool(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not SmolagentsInstrumentor.active:
        return wrapped(*args, **kwargs)
    name = getattr(instance, "name", None)
    return as_tool("smolagents", name, [args, kwargs], lambda: wrapped(*args, **kwargs))


class _UnlessDenied:
    """A retryer's predicate that never retries a denial: a denial is final."""

    __slots__ = ("predicate",)

    def __init__(self, predicate: Any) -> None:
        self.predicate = predicate

    def __call__(self, exc: BaseException) -> Any:
        return not caused_by_denial(exc) and self.predicate(exc)


def _retrying(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # Once per retryer (made before we were installed or after): its predicate wrapped.
    predicate = getattr(instance, "retry_predicate", None)
    if (
        SmolagentsInstrumentor.active
        and predicate is not None
        and type(predicate) is not _UnlessDenied
    ):
        instance.retry_predicate = _UnlessDenied(predicate)
    return wrapped(*args, **kwargs)


_HOOKS = SDKHooks(
    _instruments[0],
    "smolagents",
    (
        Hook("agents.MultiStepAgent", "run", _run, ("task", "stream")),
        Hook("tools.Tool", "__call__", _tool),
        Hook("utils.Retrying", "__call__", _retrying),
    ),
    (("agents.MultiStepAgent", ("run",)), ("tools.Tool", ("__call__",))),
)


class SmolagentsInstrumentor(FrameworkInstrumentor):
    """Runs each smolagents agent run under the agent's name, each tool run as a step."""

    _hooks = _HOOKS
    _instruments = _instruments
