"""An embedded fake LLM server for tests, the demo and the benchmarks.

It serves the OpenAI (chat completions, responses, embeddings, legacy
completions) and Anthropic (messages, count tokens) HTTP APIs on localhost,
with bodies and event streams the real ``openai`` and ``anthropic`` SDKs
parse, deterministic token usage, exact request counts and injectable
failures. Standard library only; it imports no LLM client library.

Usage::

    from veronica_otel.testing import FakeLLMServer

    with FakeLLMServer(output_tokens=10) as server:
        client = openai.OpenAI(base_url=server.openai_base_url, api_key="test")
        ...
        server.fail_next(2, status=500, retry_after_ms=1)

From a shell: ``python -m veronica_otel.testing --port 8787``.
"""

from ._server import FakeLLMServer, RecordedRequest

__all__ = ["FakeLLMServer", "RecordedRequest"]
