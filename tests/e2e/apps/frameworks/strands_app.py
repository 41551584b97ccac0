"""A runaway Strands agent on Bedrock (boto3, streamed), unchanged (no veronica-otel import).

``stream``: the agent's events iterated with ``stream_async`` instead of a call.
"""

from __future__ import annotations

import asyncio

from _report import run
from strands import Agent, tool
from strands.models import BedrockModel


@tool
def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


model = BedrockModel(model_id="us.anthropic.claude-sonnet-4-20250514-v1:0", region_name="us-east-1")
agent = Agent(name="Looper", model=model, tools=[lookup], callback_handler=None)


async def stream() -> None:
    async for _ in agent.stream_async("go"):
        pass


run({"": lambda: agent("go"), "stream": lambda: asyncio.run(stream())})
