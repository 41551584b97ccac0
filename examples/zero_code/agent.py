"""An agent that knows nothing about veronica-otel.

It asks the model for a plan and keeps "refining" it: a loop that only a
ceiling ends. Run it unchanged under ``opentelemetry-instrument`` with
``VERONICA_*`` limits (see README.md next to this file).
"""

import os

import openai

client = openai.OpenAI(max_retries=2)
plan = "write the quarterly report"
for round_ in range(int(os.environ.get("AGENT_ROUNDS", "50"))):
    reply = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": f"Improve this plan (round {round_}): {plan}"}],
    )
    plan = reply.choices[0].message.content or plan
    print(f"round {round_}: {len(plan)} chars", flush=True)
client.close()
