"""An app that knows nothing about veronica-otel, calling every provider client.

Each client is called once in turn, then each again. Run under
``opentelemetry-instrument`` with ``VERONICA_MAX_STEPS`` equal to the number
of clients: every first call goes out, every second one must be refused.
The fake server's base URL comes from ``FAKE_LLM_URL``. Prints one line per
call: ``<client> sent`` or ``<client> refused <exception type>``.
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

import boto3
import cohere
import httpx
import litellm
import ollama
import requests
from botocore.config import Config
from google import genai
from google.genai import types
from mistralai.client import Mistral

URL = os.environ["FAKE_LLM_URL"]
SAY = [{"role": "user", "content": "hello"}]

gemini = genai.Client(api_key="k", http_options=types.HttpOptions(base_url=URL))
bedrock = boto3.client(
    "bedrock-runtime",
    endpoint_url=URL,
    region_name="us-east-1",
    aws_access_key_id="x",
    aws_secret_access_key="x",
    config=Config(retries={"mode": "standard", "max_attempts": 1}),
)
mistral = Mistral(api_key="k", server_url=URL)
http = httpx.Client()
command = cohere.ClientV2(api_key="k", base_url=URL, httpx_client=http, max_retries=0)
local = ollama.Client(host=URL)

CALLS = {
    "google-genai": lambda: gemini.models.generate_content(
        model="gemini-2.0-flash", contents="hello"
    ),
    "bedrock": lambda: bedrock.converse(
        modelId="anthropic.claude-3-haiku-20240307-v1:0",
        messages=[{"role": "user", "content": [{"text": "hello"}]}],
    ),
    "mistralai": lambda: mistral.chat.complete(model="mistral-small-latest", messages=SAY),
    "cohere": lambda: command.chat(model="command-r-plus-08-2024", messages=SAY),
    "ollama": lambda: local.chat(model="llama3.2", messages=SAY),
    "litellm": lambda: litellm.completion(
        model="anthropic/claude-3-5-haiku-latest",
        messages=SAY,
        api_base=URL,
        api_key="k",
        max_tokens=8,
    ),
    "requests": lambda: requests.post(
        URL + "/v1/chat/completions",
        json={"model": "gpt-4o-mini", "messages": SAY, "max_tokens": 8},
        timeout=10,
    ).raise_for_status(),
}

for _round in range(2):
    for name, call in CALLS.items():
        try:
            call()
            print(name, "sent", flush=True)
        except Exception as exc:
            print(name, "refused", type(exc).__name__, flush=True)

gemini.close()
bedrock.close()
http.close()
local._client.close()
