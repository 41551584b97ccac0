"""A runaway OpenAI Agents SDK run, unchanged (no veronica-otel import).

``runaway``: one agent with one tool; the model always asks for the tool.
``handoffs``: Alpha and Beta, each able only to hand off to the other.
``streamed``: the runaway agent run with ``Runner.run_streamed``.
"""

from __future__ import annotations

import asyncio

from _report import run
from agents import Agent, Runner, function_tool, set_tracing_disabled

set_tracing_disabled(True)  # no trace export to api.openai.com from a test


@function_tool
def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


LOOPER = Agent(name="Looper", instructions="Use the tool.", tools=[lookup], model="gpt-4o-mini")


def runaway() -> None:
    Runner.run_sync(LOOPER, "go", max_turns=50)


async def _streamed() -> None:
    async for _ in Runner.run_streamed(LOOPER, "go", max_turns=50).stream_events():
        pass


def handoffs() -> None:
    alpha = Agent(name="Alpha", instructions="Hand off.", model="gpt-4o-mini")
    beta = Agent(name="Beta", instructions="Hand off.", model="gpt-4o-mini", handoffs=[alpha])
    alpha.handoffs = [beta]
    Runner.run_sync(alpha, "go", max_turns=50)


def streamed() -> None:
    asyncio.run(_streamed())


run({"runaway": runaway, "handoffs": handoffs, "streamed": streamed})
