"""A runaway pydantic-ai agent, unchanged (no veronica-otel import)."""

from __future__ import annotations

from _report import run
from pydantic_ai import Agent

agent = Agent("openai:gpt-4o-mini", name="Looper", instructions="Use the tool.")


@agent.tool_plain
def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


run(lambda: agent.run_sync("go"))
