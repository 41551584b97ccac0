"""LlamaIndex: a runaway FunctionAgent (streamed) under ``max_iterations``, then ours.

Its own cap, ``max_iterations``, counts workflow steps of one run; ours
counts every model call and tool run of the chain. ``llama-index-llms-openai`` pins
``openai<3`` and streams by default; both are contained.

Needs ``pip install veronica-otel[openai] llama-index-core llama-index-llms-openai``.
Runs against the in-process runaway fake server: python examples/frameworks/llama_index_agent.py
"""

from __future__ import annotations

import asyncio

from _compare import compare
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.llms.openai import OpenAI

from veronica_otel.instrumentors.llama_index import LlamaIndexInstrumentor
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer


def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


def main() -> None:
    OpenAIInstrumentor().instrument()
    LlamaIndexInstrumentor().instrument()  # each tool run a step, under the agent's name
    with FakeLLMServer(output_tokens=5, runaway=True) as server:
        llm = OpenAI(model="gpt-4o-mini", api_base=server.openai_base_url, api_key="fake")

        async def run() -> object:
            agent = FunctionAgent(name="Looper", tools=[lookup], llm=llm)
            return await agent.run("go", max_iterations=10)

        compare("llama-index", "max_iterations=10", lambda: asyncio.run(run()), server)


if __name__ == "__main__":
    main()
