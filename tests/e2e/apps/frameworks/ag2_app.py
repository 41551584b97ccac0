"""AG2 agents on openai, unchanged (no veronica-otel import).

The default scenario: a runaway agent whose tool prints each run (``tool ran
<city>``). ``team``: a planner and a critic taking four turns each, each
turn printed (``critic ok``, ``critic stopped: <error> <its agent>``,
``planner ok``), so a policy file bounding one of them shows the other go on.
"""

from __future__ import annotations

import asyncio
import os

from _report import run
from ag2 import Agent
from ag2.config.openai import OpenAIConfig


def lookup(city: str) -> str:
    """Look a city up."""
    print("tool ran", city, flush=True)
    return f"{city}: sunny"


def _config() -> OpenAIConfig:
    return OpenAIConfig(
        model="gpt-4o-mini",
        base_url=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"],
    )


async def main() -> None:
    await Agent("Looper", "Use the tool.", config=_config(), tools=[lookup]).ask("go")


async def team() -> None:
    planner = Agent("planner", "You write plans.", config=_config())
    critic = Agent("critic", "You reject plans.", config=_config())
    for turn in range(4):
        try:
            await critic.ask(f"Critique plan {turn}")
            print("critic ok", flush=True)
        except Exception as exc:
            print("critic stopped:", type(exc).__name__, getattr(exc, "agent", None), flush=True)
        await planner.ask(f"Write plan {turn + 1}")
        print("planner ok", flush=True)


run({"": lambda: asyncio.run(main()), "team": lambda: asyncio.run(team())})
