"""From inside the process default chain: a request to your own service, then an LLM call.

Run under ``opentelemetry-instrument`` with ``VERONICA_PROPAGATE_HOSTS`` and
``VERONICA_GRANT_KEY``; ``SERVICE_URL`` is the service, ``OPENAI_BASE_URL``
the LLM. The app's own baggage entry (``tenant=acme``) is in the context.
"""

import os

import httpx2
import openai
from opentelemetry import baggage, context

context.attach(baggage.set_baggage("tenant", "acme"))
httpx2.get(os.environ["SERVICE_URL"])
client = openai.OpenAI(max_retries=0)
client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
print("done", flush=True)
