"""A runaway Google ADK agent on the Gemini API, unchanged (no veronica-otel import)."""

from __future__ import annotations

from _report import run
from google.adk.agents import Agent
from google.adk.agents.run_config import RunConfig
from google.adk.runners import InMemoryRunner
from google.genai import types


def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


def main() -> None:
    agent = Agent(
        name="Looper", model="gemini-2.5-flash", instruction="Use the tool.", tools=[lookup]
    )
    runner = InMemoryRunner(agent=agent, app_name="runaway")
    session = runner.session_service.create_session_sync(app_name="runaway", user_id="u")
    message = types.Content(role="user", parts=[types.Part(text="go")])
    config = RunConfig(max_llm_calls=50)
    for _ in runner.run(user_id="u", session_id=session.id, new_message=message, run_config=config):
        pass


run(main)
