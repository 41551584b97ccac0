"""A runaway LlamaIndex FunctionAgent on llama-index-llms-openai, unchanged."""

from __future__ import annotations

import asyncio

from _report import run
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.llms.openai import OpenAI


def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


async def main() -> object:
    agent = FunctionAgent(name="Looper", tools=[lookup], llm=OpenAI(model="gpt-4o-mini"))
    return await agent.run("go", max_iterations=50)


run(lambda: asyncio.run(main()))
