"""A runaway dspy ReAct agent, unchanged (no veronica-otel import).

Then, in the same process (one dspy import, not two), a direct call of an LM
pinned to dspy's native ``lm15`` engine: RESULT's ``native`` says how it ended.
The LMs are made in the run, under its environment (dspy reads
``OPENAI_BASE_URL`` when it picks an engine).
"""

from __future__ import annotations

import os

import dspy
from _report import Result, ended, run


def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


def react_then_native() -> Result:
    # No OPENAI_BASE_URL in the environment (dspy would then pick LiteLLM itself):
    # the address is the LM's own, so dspy picks its native raw-socket client.
    url = os.environ["FAKE_LLM_URL"] + "/v1"
    dspy.configure(lm=dspy.LM("openai/gpt-4o-mini", api_base=url, api_key="k", cache=False))
    react = dspy.ReAct("question -> answer", tools=[lookup], max_iters=8)
    result = ended(lambda: react(question="go"))
    native = dspy.LM("openai/gpt-4o-mini", api_base=url, api_key="k", cache=False, engine="lm15")
    return Result({**result, "native": ended(lambda: native("hi"))})


run(react_then_native)
