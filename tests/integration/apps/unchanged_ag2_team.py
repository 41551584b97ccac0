"""Two AG2 agents that know nothing about veronica-otel: a planner and a critic.

Run under ``opentelemetry-instrument`` with a policy file whose
``[agents."critic"]`` bounds the critic: only the file stops it, and the
planner goes on. Each failed turn is printed with the error's ``agent``.
"""

import asyncio
import os

import httpx2
from ag2 import Agent
from ag2.config.openai import OpenAIConfig


async def main() -> None:
    async with httpx2.AsyncClient() as http:
        config = OpenAIConfig(
            model="gpt-4o-mini",
            base_url=os.environ["OPENAI_BASE_URL"],
            api_key=os.environ["OPENAI_API_KEY"],
            http_client=http,
        )
        planner = Agent("planner", "You write plans.", config=config)
        critic = Agent("critic", "You reject plans.", config=config)
        for turn in range(4):
            try:
                await critic.ask(f"Critique plan {turn}")
                print("critic ok", flush=True)
            except Exception as exc:
                print(
                    "critic stopped:", type(exc).__name__, getattr(exc, "agent", None), flush=True
                )
            await planner.ask(f"Write plan {turn + 1}")
            print("planner ok", flush=True)


asyncio.run(main())
