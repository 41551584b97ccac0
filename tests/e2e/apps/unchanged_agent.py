"""An agent that knows nothing about veronica-otel: five chat calls in a loop.

Run under ``opentelemetry-instrument``; the endpoint comes from OPENAI_BASE_URL.
"""

import openai

client = openai.OpenAI(max_retries=0)
for step in range(5):
    reply = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": f"step {step}: what next?"}],
    )
    print("step", step, "ok", flush=True)
client.close()
