"""Containment for LangChain (``langchain-core`` 1.x): tool calls and run chains.

Usage::

    from veronica_otel.instrumentors.langchain import LangChainInstrumentor, contain
    from veronica_otel.instrumentors.openai import OpenAIInstrumentor

    OpenAIInstrumentor().instrument()      # the agent's model calls
    LangChainInstrumentor().instrument()   # the agent's tool calls
    agent = contain(create_agent(model, tools), ExecutionConfig(max_steps=20))
    agent.invoke({"messages": [...]})      # one run, one chain of 20 steps

Model calls made through ``langchain-openai`` (or ``langchain-anthropic``) go
through the ``openai`` (``anthropic``) SDK and are contained by that SDK's
instrumentor; this module adds what only LangChain knows about.

Configuration: limits come from the active :class:`ExecutionContext`, else the
process default chain (zero-code: ``VERONICA_*`` variables); with neither,
tools run untouched. Tool prices: :func:`veronica_otel.set_tool_prices`.

Where it hooks:

- ``langchain_core.tools.BaseTool.run`` / ``arun``: every tool call, whoever
  makes it (``invoke`` / ``ainvoke``, LangGraph's ``ToolNode``, agents,
  legacy executors). Each is one step of the chain in an ``execute_tool
  {name}`` span (:class:`~veronica_otel.ToolCall`): checked before the tool
  runs, so a denied tool never runs; the same tool with the same arguments
  counts towards ``max_repeats`` (reason ``"loop"``). Arguments injected by
  the framework (state, runtime, callbacks) are left out of the comparison.
- ``langgraph.prebuilt.tool_node._handle_tool_error``, when LangGraph is
  installed: a ``ToolNode`` built with ``handle_tool_errors=True`` (or any
  handler that accepts ``Exception``) would turn a :class:`BudgetExceededError`
  into a ``ToolMessage`` for the model to read, and the agent would carry on.
  A denial is not a tool error: it is raised out of the agent instead. (The
  default of ``create_agent`` already re-raises it.)
- LangGraph's nodes, once ``langgraph.pregel._runner`` is imported: each
  node runs under its name (:mod:`veronica_otel.instrumentors.langgraph`).

Chains per run, where the user asks for it: :func:`contain` wraps any
``Runnable`` (an agent, a graph, a chain) so that each of its runs is a chain
of its own, or a child of the active chain when there is one.

Under ``suppress_instrumentation()`` tool calls record no span but are still
contained, as with the client instrumentors.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Collection, Iterator
from typing import Any, Generic, TypeVar

import wrapt
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.utils.pydantic import TypeBaseModel
from wrapt import wrap_function_wrapper

from veronica_otel._attributes import GEN_AI_TOOL_CALL_ID
from veronica_otel._config import ExecutionConfig
from veronica_otel._context import ExecutionContext
from veronica_otel._errors import BudgetExceededError
from veronica_otel._policy import PolicyPipeline
from veronica_otel._propagation import current_context, default_context
from veronica_otel._tools import ToolCall

from ._framework import running_tool
from ._hooks import GuardedInstrumentor, Hook, InstrumentationError, SDKHooks, function_problem
from ._unwrap import is_ours, unwrap_ours

__all__ = ["ContainedRunnable", "LangChainInstrumentor", "contain"]

_logger = logging.getLogger(__name__)
_instruments = ("langchain-core >= 1.0, < 2",)
_TOOLS_MODULE = "langchain_core.tools.base"
_TOOL_NODE_MODULE = "langgraph.prebuilt.tool_node"
_RUNNER_MODULE = "langgraph.pregel._runner"

Input = TypeVar("Input")
Output = TypeVar("Output")


# -- tool calls ----------------------------------------------------------------------


def _tool_call(ctx: ExecutionContext, tool: Any, args: Any, kwargs: dict[str, Any]) -> ToolCall:
    name = str(getattr(tool, "name", "") or type(tool).__name__)
    arguments = _arguments(tool, args, kwargs) if ctx.tracks_repeats else None
    call_id = kwargs.get("tool_call_id")
    attributes = {GEN_AI_TOOL_CALL_ID: call_id} if isinstance(call_id, str) else None
    return ToolCall(name, arguments, attributes=attributes, context=ctx)


def _arguments(tool: Any, args: Any, kwargs: dict[str, Any]) -> object:
    """The call's own arguments: what the model asked for, without injected values."""
    tool_input = args[0] if args else kwargs.get("tool_input")
    if isinstance(tool_input, dict):
        try:
            return tool._filter_injected_args(tool_input)
        except Exception:  # a tool of an older or unusual shape: compare all of it
            _logger.debug("could not filter injected tool arguments", exc_info=True)
    return tool_input


def _run(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    ctx = default_context()
    if ctx is None:
        return wrapped(*args, **kwargs)
    if _tool_node_pending:
        _patch_tool_node()
    with _tool_call(ctx, instance, args, kwargs), running_tool(ctx):
        return wrapped(*args, **kwargs)


async def _arun(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    ctx = default_context()
    if ctx is None:
        return await wrapped(*args, **kwargs)
    if _tool_node_pending:
        _patch_tool_node()
    async with _tool_call(ctx, instance, args, kwargs):
        with running_tool(ctx):  # an MCP-backed tool (langchain-mcp-adapters) counts once
            return await wrapped(*args, **kwargs)


def _handle_tool_error(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    error = args[0] if args else kwargs.get("e")
    if isinstance(error, BudgetExceededError):
        raise error  # a denial stops the agent; it is not a message for the model
    return wrapped(*args, **kwargs)


# LangGraph's ToolNode is patched once its module is fully imported: now, or
# at the first contained tool call (which a ToolNode makes only once it is).
# Never by importing LangGraph ourselves, nor while it is half imported (the
# zero-code hook may instrument in the middle of LangGraph's own import).
_tool_node_pending = False
_name_nodes = False  # instrumented: LangGraph's nodes, once imported, name agents
_graph_ours = False  # LangGraphInstrumentor was instrumented by us: uninstrumented with us


def _patch_tool_node() -> None:
    global _tool_node_pending
    module = sys.modules.get(_TOOL_NODE_MODULE)
    if module is None or getattr(module.__spec__, "_initializing", False):
        return
    _tool_node_pending = False
    # Optional: without it a denied tool is still never run, but a ToolNode that
    # handles every error may hand the denial to the model as a message.
    found = getattr(module, "_handle_tool_error", None)
    problem = "is missing" if found is None else function_problem(found, ("e",), method=False)
    if problem is not None:
        _logger.warning(
            "langgraph's ToolNode _handle_tool_error %s: a ToolNode that handles "
            "every error may turn a budget denial into a message for the model",
            problem,
        )
        return
    if not is_ours(module, "_handle_tool_error", _handle_tool_error):
        wrap_function_wrapper(module, "_handle_tool_error", _handle_tool_error)


def _name_graph_nodes(module: object) -> None:
    """LangGraph was imported: its nodes name agents (an error is logged and refused)."""
    global _graph_ours
    from .langgraph import LangGraphInstrumentor

    graph = LangGraphInstrumentor()
    if _name_nodes and not graph.is_instrumented_by_opentelemetry:
        with contextlib.suppress(InstrumentationError):  # it logged it and refuses in a chain
            graph.instrument()
            _graph_ours = True


_HOOKS = SDKHooks(
    _instruments[0],
    _TOOLS_MODULE,
    (
        Hook("BaseTool", "run", _run, ("tool_input",), ("tool_call_id",)),
        Hook("BaseTool", "arun", _arun, ("tool_input",), ("tool_call_id",), True),
    ),
    (("BaseTool", ("run",)), ("BaseTool", ("arun",))),
)


class LangChainInstrumentor(GuardedInstrumentor):
    """Contains every LangChain tool call in the active chain (see the module docs).

    ``instrument()`` raises :class:`~veronica_otel.instrumentors.InstrumentationError`
    when ``langchain-core`` is outside the tested range or ``BaseTool.run`` /
    ``arun`` changed shape; tool calls in a chain are then refused (fail closed).
    """

    _hooks = _HOOKS

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        global _tool_node_pending, _name_nodes
        super()._instrument(**kwargs)
        _tool_node_pending = True
        _patch_tool_node()
        _name_nodes = True  # read by the hook, which runs now when LangGraph is imported
        wrapt.register_post_import_hook(_name_graph_nodes, _RUNNER_MODULE)

    def _uninstrument(self, **kwargs: Any) -> None:
        global _tool_node_pending, _name_nodes, _graph_ours
        super()._uninstrument(**kwargs)
        _tool_node_pending = _name_nodes = False
        if _graph_ours:
            from .langgraph import LangGraphInstrumentor

            _graph_ours = False
            LangGraphInstrumentor().uninstrument()
        tool_node = sys.modules.get(_TOOL_NODE_MODULE)
        if tool_node is not None:
            unwrap_ours(tool_node, "_handle_tool_error", _handle_tool_error)


# -- one run, one chain --------------------------------------------------------------


class ContainedRunnable(Runnable[Input, Output], Generic[Input, Output]):
    """A runnable whose every run (invoke, stream, each input of a batch) is a chain.

    Built by :func:`contain`. A run opens a new :class:`ExecutionContext` with
    ``config`` and ``pipeline``, or, when a chain is already active, a child of
    it (``spawn_child``: its spending counts in the parent, its budget is
    carved out of the parent's). Everything else is the wrapped runnable's.
    """

    def __init__(
        self,
        bound: Runnable[Input, Output],
        config: ExecutionConfig | None = None,
        pipeline: PolicyPipeline | None = None,
        *,
        name: str | None = None,
    ) -> None:
        if not isinstance(bound, Runnable):
            raise TypeError(f"contain() takes a langchain Runnable, got {type(bound).__name__}")
        if config is not None and not isinstance(config, ExecutionConfig):
            raise TypeError(f"config must be an ExecutionConfig, got {type(config).__name__}")
        if pipeline is not None and not isinstance(pipeline, PolicyPipeline):
            raise TypeError(f"pipeline must be a PolicyPipeline, got {type(pipeline).__name__}")
        self.bound = bound
        self.config = config
        self.pipeline = pipeline
        self.name = name or bound.get_name()

    def chain(self) -> ExecutionContext:
        """The chain for one run: a child of the active chain, else a new one."""
        parent = current_context()
        if parent is not None:
            return parent.spawn_child(self.config, self.pipeline, name=self.get_name())
        return ExecutionContext(self.config, self.pipeline, name=self.get_name())

    @property
    def InputType(self) -> type[Input]:
        return self.bound.InputType

    @property
    def OutputType(self) -> type[Output]:
        return self.bound.OutputType

    def get_input_schema(self, config: RunnableConfig | None = None) -> TypeBaseModel:
        return self.bound.get_input_schema(config)

    def get_output_schema(self, config: RunnableConfig | None = None) -> TypeBaseModel:
        return self.bound.get_output_schema(config)

    def invoke(self, input: Input, config: RunnableConfig | None = None, **kwargs: Any) -> Output:
        with self.chain():
            return self.bound.invoke(input, config, **kwargs)

    async def ainvoke(
        self, input: Input, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Output:
        async with self.chain():
            return await self.bound.ainvoke(input, config, **kwargs)

    # While a stream is paused at a chunk, its chain stays current in the
    # caller's context (as a span does in a traced generator).
    def stream(
        self, input: Input, config: RunnableConfig | None = None, **kwargs: Any | None
    ) -> Iterator[Output]:
        with self.chain():
            yield from self.bound.stream(input, config, **kwargs)

    async def astream(
        self, input: Input, config: RunnableConfig | None = None, **kwargs: Any | None
    ) -> AsyncIterator[Output]:
        async with self.chain():
            async for chunk in self.bound.astream(input, config, **kwargs):
                yield chunk

    # batch / abatch / transform: Runnable's defaults call invoke / ainvoke /
    # stream once per input, so each input of a batch is a run of its own.


def contain(
    runnable: Runnable[Input, Output],
    config: ExecutionConfig | None = None,
    pipeline: PolicyPipeline | None = None,
    *,
    name: str | None = None,
) -> ContainedRunnable[Input, Output]:
    """Make each run of ``runnable`` a chain of its own (one LangChain run = one chain).

    Every ``invoke``, ``ainvoke``, ``stream``, ``astream`` and each input of
    ``batch`` / ``abatch`` runs in a fresh :class:`ExecutionContext` with
    ``config`` and ``pipeline``; when a chain is already active, the run is a
    child of it instead (a sub-agent: its spending counts in the parent). The
    model and tool calls of the run are contained by the instrumentors.

    Args:
        runnable: An agent, graph or chain (any ``langchain_core`` Runnable).
        config: The limits of each run (``None``: unlimited, but counted).
        pipeline: The policies of each run.
        name: The run's name in spans (the runnable's name by default).

    Raises:
        TypeError: ``runnable``, ``config`` or ``pipeline`` is of the wrong type.
    """
    return ContainedRunnable(runnable, config, pipeline, name=name)
