"""A runaway smolagents ToolCallingAgent on an OpenAI-compatible server, unchanged.

``stream``: the run's steps iterated (``run(stream=True)``).
"""

from __future__ import annotations

import os

from _report import run
from smolagents import OpenAIServerModel, ToolCallingAgent, tool


@tool
def lookup(city: str) -> str:
    """Look a city up.

    Args:
        city: The city.
    """
    return f"{city}: sunny"


model = OpenAIServerModel(model_id="gpt-4o-mini", api_base=os.environ["OPENAI_BASE_URL"])
agent = ToolCallingAgent(tools=[lookup], model=model, max_steps=50, name="Looper")


def stream() -> None:
    for _ in agent.run("go", stream=True):
        pass


run({"": lambda: agent.run("go"), "stream": stream})
