"""A small trip-planning agent whose chain you can watch in Jaeger.

It plans, calls a tool, hands the plan to a critic sub-agent, then keeps
revising until a chain limit stops it: the call that would cross the limit
is never sent, and its span carries a ``veronica.trip`` event.

Run it under ``opentelemetry-instrument`` (see README.md in this folder). The
model endpoint comes from ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` (the fake
server: ``python -m veronica_otel.testing``); the limits come from the
``VERONICA_*`` variables, e.g. ``VERONICA_MAX_STEPS=6``.
"""

from __future__ import annotations

import os

import openai

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext, contained_tool

MODEL = os.environ.get("AGENT_MODEL", "gpt-4o-mini")
client = openai.OpenAI(max_retries=0)


def ask(prompt: str) -> str:
    """One chat call (contained and traced by the veronica OpenAI instrumentor)."""
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=64
    )
    return reply.choices[0].message.content or ""


@contained_tool
def search_web(query: str) -> str:
    """Stands in for a real tool; each call is one step of the chain."""
    return f"3 results for {query!r}"


def main() -> None:
    # An explicit chain: one root span, so the whole run is one trace in Jaeger.
    with ExecutionContext(ExecutionConfig.from_env(), name="trip-planner") as ctx:
        try:
            plan = ask("Plan a three-day trip to Lisbon.")
            notes = search_web("Lisbon museums open on Monday")
            with ctx.spawn_child(name="critic"):
                ask(f"Critique this plan: {plan}\nNotes: {notes}")
            for revision in range(1, 100):  # a loop that only a limit ends
                plan = ask(f"Revise the plan (revision {revision}): {plan}")
        except BudgetExceededError as exc:
            print(
                f"stopped: {exc.reason} (limit {exc.limit:g}, this call would be {exc.observed:g})"
            )
        snap = ctx.snapshot()
        print(
            f"chain {ctx.chain_id}: {snap.steps} steps, {snap.tokens} tokens, ${snap.cost_usd:.6f}"
        )
    client.close()


if __name__ == "__main__":
    main()
