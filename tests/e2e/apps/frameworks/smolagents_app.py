"""A runaway smolagents ToolCallingAgent on an OpenAI-compatible server, unchanged.

``stream``: the run's steps iterated (``run(stream=True)``).
``retries``: the default run with smolagents' retries of a model call
written out (its ``Retrying ...`` log lines) and their sleeps cut to none.
"""

from __future__ import annotations

import logging
import os
import sys

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


def retries() -> None:
    log = logging.getLogger("smolagents.models")
    log.setLevel(logging.INFO)
    log.addHandler(logging.StreamHandler(sys.stdout))
    model.retryer.wait_seconds = 0  # a retry shows at once, not minutes later
    agent.run("go")


run({"": lambda: agent.run("go"), "stream": stream, "retries": retries})
