"""An AG2 agent that knows nothing about veronica-otel, calling a tool forever.

Run under ``opentelemetry-instrument`` against a fake server that always
answers with a tool call: only the chain's limits stop it.
"""

import asyncio
import os

import httpx2
from ag2 import Agent
from ag2.config.openai import OpenAIConfig


def count(n: int) -> str:
    """Count to n."""
    print("tool ran", n, flush=True)
    return f"counted to {n}"


async def main() -> None:
    async with httpx2.AsyncClient() as http:
        config = OpenAIConfig(
            model="gpt-4o-mini",
            base_url=os.environ["OPENAI_BASE_URL"],
            api_key=os.environ["OPENAI_API_KEY"],
            http_client=http,
        )
        await Agent("counter", "You count.", config=config, tools=[count]).ask("Count.")


asyncio.run(main())
