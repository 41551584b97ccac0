"""OpenAI Agents SDK: a runaway tool loop, and two agents handing off forever.

Its own cap, ``max_turns``, counts turns of a run; ours counts model calls
and tool runs across the whole chain, and ``[agents."Alpha"]`` limits one agent by the name
the SDK gave it (``OpenAIAgentsInstrumentor`` runs each turn as ``agent(name)``).

Needs ``pip install veronica-otel[openai] openai-agents``. Runs against the
in-process runaway fake server (no network, no key):
python examples/frameworks/openai_agents_handoffs.py
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from _compare import compare
from agents import Agent, MaxTurnsExceeded, Runner, function_tool, set_tracing_disabled

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext, PolicyPipeline
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.instrumentors.openai_agents import OpenAIAgentsInstrumentor
from veronica_otel.policy_file import FilePolicy, PolicyFile
from veronica_otel.testing import FakeLLMServer


@function_tool
def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


def main() -> None:
    OpenAIInstrumentor().instrument()
    OpenAIAgentsInstrumentor().instrument()
    set_tracing_disabled(True)
    with FakeLLMServer(output_tokens=5, runaway=True) as server:
        os.environ.update(OPENAI_BASE_URL=server.openai_base_url, OPENAI_API_KEY="fake")
        looper = Agent(name="Looper", tools=[lookup], model="gpt-4o-mini")
        compare(
            "openai-agents",
            "max_turns=10",
            lambda: Runner.run_sync(looper, "go", max_turns=10),
            server,
        )

        alpha = Agent(name="Alpha", instructions="Hand off.", model="gpt-4o-mini")
        beta = Agent(name="Beta", instructions="Hand off.", model="gpt-4o-mini", handoffs=[alpha])
        alpha.handoffs = [beta]
        server.reset()
        try:
            Runner.run_sync(alpha, "go", max_turns=10)
        except MaxTurnsExceeded:
            print(f"handoff loop, own cap (max_turns=10): {server.request_count} requests")
        with tempfile.TemporaryDirectory() as tmp:
            policy = Path(tmp, "policy.toml")
            policy.write_text('[agents."Alpha"]\nmax_steps = 2\n')
            pipeline = PolicyPipeline([FilePolicy(PolicyFile(policy))])
            server.reset()
            try:
                with ExecutionContext(ExecutionConfig(max_steps=20), pipeline):
                    Runner.run_sync(alpha, "go", max_turns=10)
            except BudgetExceededError as exc:
                print(
                    f'handoff loop, [agents."Alpha"] max_steps=2: {server.request_count} requests '
                    f"(Alpha 2, Beta 2), then agent {exc.agent!r} denied"
                )


if __name__ == "__main__":
    main()
