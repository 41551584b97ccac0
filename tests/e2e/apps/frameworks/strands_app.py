"""A runaway Strands agent on Bedrock (boto3, streamed), unchanged (no veronica-otel import)."""

from __future__ import annotations

from _report import run
from strands import Agent, tool
from strands.models import BedrockModel


@tool
def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


model = BedrockModel(model_id="us.anthropic.claude-sonnet-4-20250514-v1:0", region_name="us-east-1")
agent = Agent(name="Looper", model=model, tools=[lookup], callback_handler=None)
run(lambda: agent("go"))
