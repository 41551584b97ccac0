"""A runaway dspy ReAct agent, unchanged (no veronica-otel import)."""

from __future__ import annotations

import os

import dspy
from _report import run


def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


# No OPENAI_BASE_URL in the environment (dspy would then pick LiteLLM itself):
# the address is the LM's own, so dspy picks its native raw-socket client.
url = os.environ["FAKE_LLM_URL"] + "/v1"
dspy.configure(lm=dspy.LM("openai/gpt-4o-mini", api_base=url, api_key="k", cache=False))
react = dspy.ReAct("question -> answer", tools=[lookup], max_iters=8)
run(lambda: react(question="go"))
