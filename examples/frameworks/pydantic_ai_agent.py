"""pydantic-ai: a runaway tool loop under its own request limit, then under ours.

Its own cap, ``UsageLimits(request_limit=...)``, counts the model requests of
one run; ours counts every model call and tool run of the chain, across runs and agents
(``PydanticAIInstrumentor`` also runs each request as ``agent(Agent.name)``,
so ``[agents."Looper"]`` in a policy file limits this agent alone).

Needs ``pip install veronica-otel[openai] 'pydantic-ai-slim[openai]'``. Runs
against the in-process runaway fake server: python examples/frameworks/pydantic_ai_agent.py
"""

from __future__ import annotations

import os

from _compare import compare
from pydantic_ai import Agent
from pydantic_ai.usage import UsageLimits

from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.instrumentors.pydantic_ai import PydanticAIInstrumentor
from veronica_otel.testing import FakeLLMServer


def main() -> None:
    OpenAIInstrumentor().instrument()
    PydanticAIInstrumentor().instrument()
    with FakeLLMServer(output_tokens=5, runaway=True) as server:
        os.environ.update(OPENAI_BASE_URL=server.openai_base_url, OPENAI_API_KEY="fake")
        agent = Agent("openai:gpt-4o-mini", name="Looper")

        @agent.tool_plain
        def lookup(city: str) -> str:
            """Look a city up."""
            return f"{city}: sunny"

        limits = UsageLimits(request_limit=10)
        compare(
            "pydantic-ai",
            "request_limit=10",
            lambda: agent.run_sync("go", usage_limits=limits),
            server,
        )


if __name__ == "__main__":
    main()
