"""Budget pools: a tenant's daily budget and each user's hourly one, across tasks.

A chain bounds one task. Pools bound what many tasks spend together: every
call of a chain is reserved in the chain and in each of its pools in one
step, and is not sent unless all have room. Here tenant acme has a daily
pool and each of its users an hourly one; alice runs out of her hour, then
bob works on until acme's day is spent. Each denial names the pool and says
when its window frees room (``retry_after_s``).

Runs against the in-process fake LLM server (real ``openai`` SDK, real HTTP,
no network, no key). Run: python examples/budget_pools.py
"""

from __future__ import annotations

import openai

from veronica_otel import (
    BudgetExceededError,
    BudgetPool,
    ExecutionConfig,
    ExecutionContext,
)
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer

# Pools with the same name (and ledger) share one budget, wherever they are made.
acme = BudgetPool("tenant:acme", max_cost_usd=0.005, window="1d")
users = {
    "alice": BudgetPool("user:alice", max_steps=3, window="1h"),
    "bob": BudgetPool("user:bob", max_steps=50, window="1h"),
}


def task(client: openai.OpenAI, user: str, calls: int) -> int:
    """One task of ``user``: up to ``calls`` model calls; returns how many were sent."""
    sent = 0
    config = ExecutionConfig(max_cost_usd=0.10)  # the task's own ceiling
    with ExecutionContext(config, pools=[acme, users[user]]):
        try:
            for step in range(calls):
                client.chat.completions.create(
                    model="gpt-4o",
                    messages=[{"role": "user", "content": f"{user}, step {step}"}],
                    max_tokens=40,
                )
                sent += 1
        except BudgetExceededError as exc:
            wait = f"{exc.retry_after_s:.0f} s" if exc.retry_after_s is not None else "never"
            print(f"{user}: stopped by pool {exc.pool} ({exc.reason}); room again in {wait}")
    return sent


def main() -> dict[str, int]:
    OpenAIInstrumentor().instrument()
    with FakeLLMServer(output_tokens=40) as server:
        client = openai.OpenAI(base_url=server.openai_base_url, api_key="demo", max_retries=0)
        sent = {"alice": task(client, "alice", 5)}
        sent["bob"] = task(client, "bob", 5)
        sent["bob"] += task(client, "bob", 20)  # a second task: acme's day runs out
        client.close()
        spent = acme.snapshot()
        print(f"calls sent: {sent} (the server saw {server.request_count})")
        print(f"acme spent ${spent.cost_usd:.4f} of ${acme.max_cost_usd} today")
    return sent


if __name__ == "__main__":
    main()
