"""Two agents that never agree, uncontained and contained.

A planner proposes, a critic rejects, the planner revises... for 30 rounds:
60 model calls, each one legitimate. With ``max_handoffs`` the chain allows
control to pass between the same two agents a fixed number of times; the
call that would hand it over once more is never sent.

``veronica-otel demo`` runs this loop with the same ceiling (60 -> 9, trip
``loop``). The benchmark table (benchmarks/README.md) says 60 -> 8: it uses
``max_steps=8``, a step per model call, to compare with the paper's step guard.

Runs against the in-process fake LLM server (real ``openai`` SDK, real HTTP,
no network, no key). Run: python examples/planner_critic.py
"""

from __future__ import annotations

import openai

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext, agent
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer

ROUNDS = 30


def debate(client: openai.OpenAI) -> None:
    """The agents' loop: nothing in it knows about budgets."""
    plan = "first draft"
    for round_no in range(1, ROUNDS + 1):
        with agent("planner"):
            plan = ask(client, f"Revise the plan (round {round_no}): {plan}")
        with agent("critic"):
            ask(client, f"Find a flaw in: {plan}")  # it always finds one


def ask(client: openai.OpenAI, prompt: str) -> str:
    reply = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": prompt}], max_tokens=40
    )
    return reply.choices[0].message.content or ""


def main() -> None:
    OpenAIInstrumentor().instrument()
    with FakeLLMServer(output_tokens=40) as server:
        client = openai.OpenAI(base_url=server.openai_base_url, api_key="fake", max_retries=0)

        debate(client)  # no chain: nothing is checked
        uncontained = server.request_count
        print(f"uncontained: {uncontained} model calls")

        server.reset()
        try:
            with ExecutionContext(ExecutionConfig(max_handoffs=8, max_cost_usd=1.0)) as ctx:
                debate(client)
        except BudgetExceededError as exc:
            print(f"contained:   {server.request_count} model calls, then {exc.reason}: {exc}")
        snapshot = ctx.snapshot()
        print(f"chain spent ${snapshot.cost_usd:.6f} in {snapshot.steps} steps")
        assert server.request_count == 9 < uncontained


if __name__ == "__main__":
    main()
