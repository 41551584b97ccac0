"""smolagents: a runaway ToolCallingAgent under its own ``max_steps``, then ours.

Its own cap, ``max_steps``, counts agent steps of one run and then asks the
model for a final answer (one more call), returning it; ours counts every
model call and tool run of the chain. smolagents wraps a model error: ours is the
``__cause__`` of its ``AgentGenerationError``.

Needs ``pip install veronica-otel[openai] 'smolagents[openai]'``. Runs against
the in-process runaway fake server: python examples/frameworks/smolagents_agent.py
"""

from __future__ import annotations

from _compare import compare
from smolagents import OpenAIServerModel, ToolCallingAgent, tool

from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.instrumentors.smolagents import SmolagentsInstrumentor
from veronica_otel.testing import FakeLLMServer


@tool
def lookup(city: str) -> str:
    """Look a city up.

    Args:
        city: The city.
    """
    return f"{city}: sunny"


def main() -> None:
    OpenAIInstrumentor().instrument()
    SmolagentsInstrumentor().instrument()  # each run as agent(name)
    with FakeLLMServer(output_tokens=5, runaway=True) as server:
        model = OpenAIServerModel(
            model_id="gpt-4o-mini", api_base=server.openai_base_url, api_key="fake"
        )

        def run() -> object:
            agent = ToolCallingAgent(tools=[lookup], model=model, max_steps=10, verbosity_level=0)
            return agent.run("go")

        compare("smolagents", "max_steps=10", run, server)


if __name__ == "__main__":
    main()
