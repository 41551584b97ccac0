"""Agent names and tool runs for LlamaIndex agents (``llama-index-core`` >= 0.14).

Usage::

    from veronica_otel.instrumentors.openai import OpenAIInstrumentor
    from veronica_otel.instrumentors.llama_index import LlamaIndexInstrumentor

    OpenAIInstrumentor().instrument()      # llama-index-llms-openai: the openai SDK
    LlamaIndexInstrumentor().instrument()  # ... under the agent's name, each tool run a step
    with ExecutionContext(ExecutionConfig(max_steps=20)):
        await agent.run("...")

Under ``opentelemetry-instrument`` the ``veronica`` distro installs it once
the application has imported LlamaIndex's agent workflows: nothing to write.

LlamaIndex sends model requests through each provider's SDK, whose adapter
admits them. Where it hooks: each model call of an agent is made (and its
stream read) in its ``take_step`` (``FunctionAgent``, ``ReActAgent``,
``CodeActAgent``; an agent class of your own is not named), which runs as
:func:`veronica_otel.agent` named after the agent's ``name`` (``"Agent"`` by
default), alone or in a multi-agent ``AgentWorkflow``. Every tool run of an
agent workflow goes through
``BaseWorkflowAgent._call_tool`` (``FunctionAgent``, ``ReActAgent``,
``CodeActAgent``) or, in a multi-agent ``AgentWorkflow``,
``AgentWorkflow._call_tool``; the run is one step of the chain, checked
before the tool runs, under the name of the agent that called it (in an
``AgentWorkflow``, the agent it handed off to), so ``[agents."name"]`` limits
and ``max_handoffs`` apply.

A denied tool run becomes an error tool output that the model would read
(LlamaIndex turns a tool's exception into one); the trip is sticky, so the
model request after it is denied and ``BudgetExceededError`` leaves
``agent.run`` as itself.
"""

from __future__ import annotations

from typing import Any

from ._framework import FrameworkInstrumentor, argument, as_agent_async, as_agent_tool_async
from ._hooks import Hook, SDKHooks

__all__ = ["LlamaIndexInstrumentor"]

_instruments = ("llama-index-core >= 0.14, < 0.15",)


async def _run(agent: object, args: tuple[Any, ...], kwargs: dict[str, Any], call: Any) -> Any:
    tool = argument(args, kwargs, 1, "tool")
    name = getattr(getattr(tool, "metadata", None), "name", None)
    arguments = argument(args, kwargs, 2, "tool_input")
    return await as_agent_tool_async(agent, "llama_index", name, arguments, call)


async def _step(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not LlamaIndexInstrumentor.active:
        return await wrapped(*args, **kwargs)
    return await as_agent_async(getattr(instance, "name", None), lambda: wrapped(*args, **kwargs))


async def _agent_tool(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    if not LlamaIndexInstrumentor.active:
        return await wrapped(*args, **kwargs)
    agent = getattr(instance, "name", None)
    return await _run(agent, args, kwargs, lambda: wrapped(*args, **kwargs))


async def _workflow_tool(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    if not LlamaIndexInstrumentor.active:
        return await wrapped(*args, **kwargs)
    store = getattr(argument(args, kwargs, 0, "ctx"), "store", None)
    agent = None if store is None else await store.get("current_agent_name", default=None)
    return await _run(agent, args, kwargs, lambda: wrapped(*args, **kwargs))


_AGENT = "base_agent.BaseWorkflowAgent"
_WORKFLOW = "multi_agent_workflow.AgentWorkflow"
_SIGNATURE = ("ctx", "tool", "tool_input")
_STEP = ("ctx", "llm_input", "tools", "memory")
# Each agent class makes its model calls in a take_step of its own.
_AGENTS = (
    "function_agent.FunctionAgent",
    "react_agent.ReActAgent",
    "codeact_agent.CodeActAgent",
)
_HOOKS = SDKHooks(
    _instruments[0],
    "llama_index.core.agent.workflow",
    (
        *(Hook(owner, "take_step", _step, _STEP, (), True) for owner in _AGENTS),
        Hook(_AGENT, "_call_tool", _agent_tool, _SIGNATURE, (), True),
        Hook(_WORKFLOW, "_call_tool", _workflow_tool, _SIGNATURE, (), True),
    ),
    (
        *((owner, ("take_step",)) for owner in _AGENTS),
        (_AGENT, ("_call_tool",)),
        (_WORKFLOW, ("_call_tool",)),
    ),
)


class LlamaIndexInstrumentor(FrameworkInstrumentor):
    """Runs each LlamaIndex agent step under the agent's name, each tool run as a step."""

    _hooks = _HOOKS
    _instruments = _instruments
