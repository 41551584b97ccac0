"""Google ADK: a runaway agent under its own ``max_llm_calls``, then under ours.

Its own cap, ``RunConfig(max_llm_calls=...)``, counts the model calls of one
run; ours counts every model call and tool run of the chain. ADK's own spans
name the agent of a model call (``gen_ai.agent.name``), our hook that of a tool
run, so ``[agents."Looper"]`` in a policy file limits this agent alone.
google-adk pins ``opentelemetry-api<=1.44``; veronica-otel needs >= 1.41, so
both install together.

Needs ``pip install veronica-otel[google-genai] google-adk``. Runs against the
in-process runaway fake server: python examples/frameworks/google_adk_agent.py
"""

from __future__ import annotations

import os

from _compare import compare
from google.adk.agents import Agent
from google.adk.agents.run_config import RunConfig
from google.adk.runners import InMemoryRunner
from google.genai import types

from veronica_otel.instrumentors.google_adk import GoogleADKInstrumentor
from veronica_otel.instrumentors.google_genai import GoogleGenAIInstrumentor
from veronica_otel.testing import FakeLLMServer


def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


def main() -> None:
    GoogleGenAIInstrumentor().instrument()
    GoogleADKInstrumentor().instrument()  # each tool run a step, under the agent's name
    with FakeLLMServer(output_tokens=5, runaway=True) as server:
        os.environ.update(GOOGLE_GEMINI_BASE_URL=server.base_url, GOOGLE_API_KEY="fake")
        agent = Agent(name="Looper", model="gemini-2.5-flash", tools=[lookup])
        runner = InMemoryRunner(agent=agent, app_name="runaway")

        def run() -> None:
            session = runner.session_service.create_session_sync(app_name="runaway", user_id="u")
            message = types.Content(role="user", parts=[types.Part(text="go")])
            config = RunConfig(max_llm_calls=10)
            for _ in runner.run(
                user_id="u", session_id=session.id, new_message=message, run_config=config
            ):
                pass

        compare("google-adk", "max_llm_calls=10", run, server)


if __name__ == "__main__":
    main()
