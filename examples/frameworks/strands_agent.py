"""Strands Agents on Bedrock: a runaway agent with no cap of its own, then ours.

Strands' event loop has no model-call cap of its own (it loops while the
model asks for tools); ours counts every Bedrock call of the chain, made
through boto3 (``converse_stream``), and every tool run. Strands wraps the denial: ours is the
``__cause__`` of its ``EventLoopException``. The uncontained run below is
stopped by a hook after 10 model calls.

Needs ``pip install veronica-otel[bedrock] strands-agents``. Runs against the
in-process runaway fake server: python examples/frameworks/strands_agent.py
"""

from __future__ import annotations

import os

from _compare import compare
from strands import Agent, tool
from strands.hooks import AfterModelCallEvent
from strands.models import BedrockModel

from veronica_otel.instrumentors.bedrock import BedrockInstrumentor
from veronica_otel.instrumentors.strands import StrandsInstrumentor
from veronica_otel.testing import FakeLLMServer

BOUND = 10


@tool
def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


def main() -> None:
    BedrockInstrumentor().instrument()
    StrandsInstrumentor().instrument()  # each invocation as agent(Agent.name)
    with FakeLLMServer(output_tokens=5, runaway=True) as server:
        os.environ.update(
            AWS_ENDPOINT_URL_BEDROCK_RUNTIME=server.base_url,
            AWS_ACCESS_KEY_ID="fake",
            AWS_SECRET_ACCESS_KEY="fake",
        )
        model = BedrockModel(
            model_id="us.anthropic.claude-sonnet-4-20250514-v1:0", region_name="us-east-1"
        )

        def stop_at_bound(event: AfterModelCallEvent) -> None:
            if server.request_count >= BOUND:
                raise RuntimeError(f"stopped by the example after {BOUND} model calls")

        def run() -> object:
            agent = Agent(model=model, tools=[lookup], callback_handler=None)
            agent.hooks.add_callback(AfterModelCallEvent, stop_at_bound)
            return agent("go")

        compare("strands-agents", f"none; bounded at {BOUND} by a hook", run, server)


if __name__ == "__main__":
    main()
