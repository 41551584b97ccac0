"""A runaway AG2 agent on openai, unchanged (no veronica-otel import)."""

from __future__ import annotations

import asyncio
import os

from _report import run
from ag2 import Agent
from ag2.config.openai import OpenAIConfig


def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


async def main() -> None:
    config = OpenAIConfig(
        model="gpt-4o-mini",
        base_url=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"],
    )
    await Agent("Looper", "Use the tool.", config=config, tools=[lookup]).ask("go")


run(lambda: asyncio.run(main()))
