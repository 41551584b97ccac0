"""The plain lane (``_adapter._lane``) of the adapters that read their own reply
(``read_reply``: ollama, cohere, Bedrock's Converse) agrees with the general way.

As in ``test_plain_lane``: the lane runs only with no TracerProvider, so the
calls run in a fresh interpreter. Each request goes once through the lane and
once the general way (baggage current: the lane leaves it to the general way);
what each committed, counted and sent must be the same, and each must have
taken the way it was meant to (``admit`` runs only on the general way).
The lane reads such a reply in its own frame and commits its plain usage there
(``_settle``'s and ``finish``'s rules, copied): an HTTP error status the reader
settles, a retried call and a denied one must end as the general way ends them.
"""

from __future__ import annotations

import json
import subprocess
import sys

_SCRIPT = """
import json, sys
import boto3, cohere, ollama
from opentelemetry import baggage, context
from veronica_otel import ExecutionConfig, ExecutionContext
from veronica_otel._pricing import PriceTable, UnitPrices
from veronica_otel.instrumentors import _adapter
from veronica_otel.instrumentors.bedrock import BedrockInstrumentor
from veronica_otel.instrumentors.cohere import CohereInstrumentor
from veronica_otel.instrumentors.ollama import OllamaInstrumentor
from veronica_otel.testing import FakeLLMServer

server = FakeLLMServer(output_tokens=5).__enter__()
for instrumentor in (OllamaInstrumentor, CohereInstrumentor, BedrockInstrumentor):
    instrumentor().instrument()
PRICES = PriceTable({"ollama:*": UnitPrices(1_000_000, 2_000_000, 0, 0),
                     "ollama.cloud:*": UnitPrices(3_000_000, 4_000_000, 0, 0)})
LOCAL = ollama.Client(host=server.base_url)
CO = cohere.ClientV2(api_key="k", base_url=server.base_url)
CO_RETRYING = cohere.ClientV2(api_key="k", base_url=server.base_url)
def aws(attempts):
    from botocore.config import Config
    return boto3.client(
        "bedrock-runtime", endpoint_url=server.base_url, region_name="us-east-1",
        aws_access_key_id="k", aws_secret_access_key="k",
        config=Config(retries={"max_attempts": attempts, "mode": "standard"}))
AWS, OTHER_AWS = aws(2), aws(2)
MESSAGES = [{"role": "user", "content": "hello there"}]
CONVERSE = [{"role": "user", "content": [{"text": "hello there"}]}]
BEDROCK_MODEL = "anthropic.claude-3-haiku-20240307-v1:0"
def ollama_chat(model="llama3.2"):
    return LOCAL.chat(model=model, messages=MESSAGES, options={"num_predict": 5})
def cohere_chat(client=CO, **more):
    return client.chat(model="command-a-03-2025", messages=MESSAGES, max_tokens=5, **more)
def converse(client=AWS):
    return client.converse(modelId=BEDROCK_MODEL, messages=CONVERSE,
                           inferenceConfig={"maxTokens": 5})
# name: (call, failures the server answers first (status), max_steps, taken by the lane)
CASES = {
    "ollama": (ollama_chat, None, 50, True),
    "ollama, an HTTP error": (ollama_chat, 400, 50, True),
    "ollama, no step left": (ollama_chat, None, 0, False),  # the general way denies it
    # hosted (a cloud tag): priced under ollama.cloud, the general way
    "ollama, a cloud tag": (lambda: ollama_chat("glm-4.6:cloud"), None, 50, False),
    "cohere": (cohere_chat, None, 50, True),
    "cohere, an HTTP error": (cohere_chat, 400, 50, True),
    "cohere, retried": (lambda: cohere_chat(
        request_options={"max_retries": 1}), 503, 50, True),
    "cohere, tools": (lambda: cohere_chat(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object"}}}]), None, 50, False),
    "bedrock": (converse, None, 50, True),
    "bedrock, an HTTP error": (converse, 400, 50, True),
    "bedrock, retried": (converse, 503, 50, True),
    # the lane reads the client seen last: another one's first call goes the general way
    "bedrock, another client": (lambda: converse(OTHER_AWS), None, 50, False),
}
described = []
ADMIT = _adapter.admit.__code__  # the general way's admission (the lane reserves inline)
def profile(frame, event, arg):
    if event == "call" and frame.f_code is ADMIT:
        described.append(1)

def run(ctx, call, failures, way):
    described.clear()
    if failures:
        server.fail_next(1, failures)
    sent = server.request_count
    token = None if way == "lane" else context.attach(baggage.set_baggage("app", "1"))
    sys.setprofile(profile)
    try:
        call()
        raised = None
    except Exception as exc:
        raised = type(exc).__name__
    finally:
        sys.setprofile(None)
        if token is not None:
            context.detach(token)
    snap = ctx.snapshot()
    return {
        "cost": snap.cost_usd, "tokens": snap.tokens, "steps": snap.steps,
        "retries": snap.retries, "held": snap.reserved_usd, "raised": raised,
        "sent": server.request_count - sent, "general": bool(described),
    }

def config(steps=50):
    return ExecutionConfig(max_cost_usd=5.0, max_steps=steps, max_tokens=100_000,
                           max_retries_total=5)
# Each model's breaker and price, made the general way first.
with ExecutionContext(config(), price_table=PRICES):
    ollama_chat(), cohere_chat(), converse()
out = {}
for name, (call, failures, steps, _) in CASES.items():
    for way in ("lane", "general"):
        with ExecutionContext(config(steps), price_table=PRICES) as ctx:
            out.setdefault(name, {})[way] = run(ctx, call, failures, way)
server.__exit__(None, None, None)
print(json.dumps({"lane": [n for n, c in CASES.items() if c[3]], "out": out}))
"""


def test_the_lane_of_adapters_that_read_their_reply_agrees_with_the_general_way() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    out, taken = result["out"], set(result["lane"])
    assert len(out) == 12
    for name, ways in out.items():
        lane, general = ways["lane"], ways["general"]
        assert general["general"] is True, name
        assert lane["general"] is (name not in taken), name
        assert lane["held"] == 0, name  # settled: nothing left reserved
        for key in ("cost", "tokens", "steps", "retries", "raised", "sent"):
            assert lane[key] == general[key], (name, key, lane, general)
    # What each case did, once (the same both ways, above).
    for adapter in ("ollama", "cohere", "bedrock"):
        plain, error = out[adapter]["lane"], out[f"{adapter}, an HTTP error"]["lane"]
        assert plain["raised"] is None and plain["tokens"] > 0 and plain["steps"] == 1
        assert plain["sent"] == 1, adapter
        assert error["raised"] is not None and error["cost"] == 0 and error["steps"] == 1
        assert error["tokens"] == 0, adapter  # an HTTP error reply is billed nothing
    assert out["ollama"]["lane"]["cost"] > 0  # priced: the usage committed, not zero
    # About the same tokens at ollama.cloud's dearer price: hosted, not read as local.
    cloud = out["ollama, a cloud tag"]["lane"]
    assert cloud["cost"] > 1.5 * out["ollama"]["lane"]["cost"]
    for name in ("cohere, retried", "bedrock, retried"):
        retried = out[name]["lane"]
        assert (retried["raised"], retried["sent"], retried["retries"]) == (None, 2, 1), name
    denied = out["ollama, no step left"]["lane"]
    assert (denied["raised"], denied["sent"]) == ("BudgetExceededError", 0)
