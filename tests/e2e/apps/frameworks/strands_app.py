"""A runaway Strands agent on Bedrock (boto3, streamed), unchanged (no veronica-otel import).

``stream``: the agent's events iterated with ``stream_async`` instead of a call.
``throttled``: the agent on a llama.cpp server (the fake one), called twice,
with Strands' retries of a model call written out (its ``... delaying before
next retry`` log lines) and their sleeps cut to none.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from _report import run
from strands import Agent, ModelRetryStrategy, tool
from strands.models import BedrockModel
from strands.models.llamacpp import LlamaCppModel


@tool
def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


model = BedrockModel(model_id="us.anthropic.claude-sonnet-4-20250514-v1:0", region_name="us-east-1")
agent = Agent(name="Looper", model=model, tools=[lookup], callback_handler=None)


async def stream() -> None:
    async for _ in agent.stream_async("go"):
        pass


def throttled() -> None:
    log = logging.getLogger("strands.event_loop._retry")
    log.setLevel(logging.DEBUG)
    log.addHandler(logging.StreamHandler(sys.stdout))
    llama = LlamaCppModel(base_url=os.environ["FAKE_LLM_URL"])
    retries = ModelRetryStrategy(initial_delay=0)  # a retry at once, not 4 s later
    looper = Agent(
        name="Looper", model=llama, tools=[lookup], callback_handler=None, retry_strategy=retries
    )
    looper("go")
    looper("again")


run({"": lambda: agent("go"), "stream": lambda: asyncio.run(stream()), "throttled": throttled})
