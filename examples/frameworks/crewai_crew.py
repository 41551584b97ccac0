"""crewAI: a runaway crew under its own ``max_iter``, then under ours.

Its own cap, ``max_iter``, counts an agent's iterations on one task and then
asks the model for a final answer (one more call), returning whatever that
gives; ours counts every model call and tool run of the chain, and ``CrewAIInstrumentor``
runs each agent's tasks as ``agent(role)``, so ``[agents."Looper"]`` in a
policy file limits this agent alone.

Needs ``pip install veronica-otel[openai] crewai``. Runs against the
in-process runaway fake server: python examples/frameworks/crewai_crew.py
"""

from __future__ import annotations

import os

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")

from _compare import compare
from crewai import LLM, Agent, Crew, Task
from crewai.tools import tool

from veronica_otel.instrumentors.crewai import CrewAIInstrumentor
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer


@tool("lookup")
def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


def main() -> None:
    OpenAIInstrumentor().instrument()
    CrewAIInstrumentor().instrument()
    with FakeLLMServer(output_tokens=5, runaway=True) as server:
        os.environ.update(OPENAI_BASE_URL=server.openai_base_url, OPENAI_API_KEY="fake")

        def kickoff() -> object:
            looper = Agent(
                role="Looper",
                goal="Look cities up",
                backstory="Uses the tool.",
                tools=[lookup],
                llm=LLM(model="gpt-4o-mini"),
                max_iter=10,
            )
            task = Task(description="Look up Paris.", expected_output="The weather.", agent=looper)
            return Crew(agents=[looper], tasks=[task]).kickoff()

        compare("crewai", "max_iter=10", kickoff, server)


if __name__ == "__main__":
    main()
