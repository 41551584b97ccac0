"""A runaway dspy ReAct agent, unchanged (no veronica-otel import)."""

from __future__ import annotations

import os

import dspy
from _report import run


def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


dspy.configure(
    lm=dspy.LM("openai/gpt-4o-mini", api_base=os.environ["OPENAI_BASE_URL"], cache=False)
)
react = dspy.ReAct("question -> answer", tools=[lookup], max_iters=8)
run(lambda: react(question="go"))
