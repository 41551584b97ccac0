"""The first example: an instrumented ``openai`` client, a budget, the denial.

It starts the bundled fake LLM server (no API key, no network), so it runs
as pasted. Requires ``pip install 'veronica-otel[openai]'`` (or the checkout).

Run: python examples/quickstart.py
"""

import openai

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer

OpenAIInstrumentor().instrument()  # every openai call now checks its chain first

with FakeLLMServer() as server:  # a local stand-in for the OpenAI API
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="test")
    with ExecutionContext(ExecutionConfig(max_steps=3, max_cost_usd=0.05)) as chain:
        try:
            for turn in range(10):  # an agent loop that would never stop on its own
                client.chat.completions.create(
                    model="gpt-4o-mini", messages=[{"role": "user", "content": f"step {turn}"}]
                )
        except BudgetExceededError as denial:
            print("denied before sending:", denial)
    spent = chain.snapshot()
    print("requests the server received:", server.count("/v1/chat/completions"))
    print(f"spent: ${spent.cost_usd:.6f} in {spent.steps} steps")
