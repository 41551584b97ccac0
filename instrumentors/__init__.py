"""Auto-instrumentors that contain LLM client libraries.

One module per patched library, each a ``BaseInstrumentor`` subclass named
after it: :class:`~veronica_otel.instrumentors.openai.OpenAIInstrumentor`,
:class:`~veronica_otel.instrumentors.anthropic.AnthropicInstrumentor`,
:class:`~veronica_otel.instrumentors.mcp.MCPInstrumentor` (MCP tool calls),
:class:`~veronica_otel.instrumentors.langchain.LangChainInstrumentor` and
:class:`~veronica_otel.instrumentors.ag2.AG2Instrumentor` (agent tool runs).
Client libraries are imported only inside their own module.

When an instrumented SDK does not fit (a version outside the tested range, a
hook removed or re-signed), ``instrument()`` raises :class:`InstrumentationError`
and calls through that SDK in a chain are refused (``instrumentors._hooks``).
"""

from ._hooks import InstrumentationError

__all__ = ["InstrumentationError"]
