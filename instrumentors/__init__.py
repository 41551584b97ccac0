"""Auto-instrumentors that contain LLM client libraries.

One module per patched library, each a ``BaseInstrumentor`` subclass named
after it: :class:`~veronica_otel.instrumentors.openai.OpenAIInstrumentor`,
:class:`~veronica_otel.instrumentors.anthropic.AnthropicInstrumentor`,
:class:`~veronica_otel.instrumentors.mcp.MCPInstrumentor` (MCP tool calls),
:class:`~veronica_otel.instrumentors.langchain.LangChainInstrumentor` and
:class:`~veronica_otel.instrumentors.ag2.AG2Instrumentor` (agent tool runs).
Client libraries are imported only inside their own module.
"""

__all__: list[str] = []
