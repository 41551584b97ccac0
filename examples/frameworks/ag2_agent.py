"""AG2: a runaway agent with no model-call cap of its own, then ours.

``Agent.ask`` loops while the model asks for tools; ours counts model calls
and tool runs (``AG2Instrumentor``) of the chain, and runs each turn as
``agent(name)``. The uncontained run below is bounded by the example's own
``max_steps=20`` chain, which is what stops it.

Needs ``pip install veronica-otel[openai,ag2] ag2``. Runs against the
in-process runaway fake server: python examples/frameworks/ag2_agent.py
"""

from __future__ import annotations

import asyncio

from _compare import compare
from ag2 import Agent
from ag2.config.openai import OpenAIConfig

from veronica_otel import ExecutionConfig, ExecutionContext
from veronica_otel.instrumentors.ag2 import AG2Instrumentor
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer


def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


def main() -> None:
    OpenAIInstrumentor().instrument()
    AG2Instrumentor().instrument()
    with FakeLLMServer(output_tokens=5, runaway=True) as server:
        config = OpenAIConfig(model="gpt-4o-mini", base_url=server.openai_base_url, api_key="fake")

        def run() -> object:
            return asyncio.run(
                Agent("Looper", "Use the tool.", config=config, tools=[lookup]).ask("go")
            )

        def bounded() -> object:
            with ExecutionContext(ExecutionConfig(max_steps=20)):
                return run()

        compare("ag2", "none; bounded by a max_steps=20 chain", bounded, server, ours=run)


if __name__ == "__main__":
    main()
