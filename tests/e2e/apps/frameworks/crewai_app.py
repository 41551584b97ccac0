"""A runaway crewAI crew, unchanged (no veronica-otel import)."""

from __future__ import annotations

from _report import run
from crewai import LLM, Agent, Crew, Task
from crewai.tools import tool


@tool("lookup")
def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


looper = Agent(
    role="Looper",
    goal="Look cities up",
    backstory="Uses the tool.",
    tools=[lookup],
    llm=LLM(model="gpt-4o-mini"),
    max_iter=50,
    max_retry_limit=0,
)
task = Task(description="Look up Paris.", expected_output="The weather.", agent=looper)
run(lambda: Crew(agents=[looper], tasks=[task]).kickoff())
