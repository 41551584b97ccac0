"""The adapters' plain lane (``_adapter._lane``) and the general way agree.

The lane runs only with no TracerProvider, so the calls run in a fresh
interpreter (the test process has its TracerProvider set). Each request goes
once through the lane (a chain with nothing in the way) and once the general
way (the same chain config, with baggage current: the lane leaves it to the
general way, which strips ours before the send); what each reserved (read
while its HTTP request is sent), committed and counted must be the same, and
each must have taken the way it was meant to (a function only the general way
runs: ``_describe``; ``admit`` where an SDK retries by calling itself, whose
inner call is described and passed). openai's lane (usage read by the payload
hook), then the lane of the adapters that read their own reply.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

# Sends one call the lane's way or the general way (baggage current: the lane
# leaves it to the general way): what it raised, and whether the general way ran
# (GENERAL: a code object only it runs). Part of each script below.
_SENDING = """
def sending(call, way):
    ran = []
    def profile(frame, event, arg):
        if event == "call" and frame.f_code is GENERAL:
            ran.append(1)
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
    return raised, bool(ran)
"""

_SCRIPT = (
    """
import json, sys
import httpx2, openai
from opentelemetry import baggage, context
from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext, _propagation
from veronica_otel.instrumentors import _adapter
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer

server = FakeLLMServer(output_tokens=5).__enter__()
big = FakeLLMServer(output_tokens=5, input_tokens=900).__enter__()  # over any input bound here
reserved = []  # the chain's reservation while each HTTP request is sent
chain = []
def client(retries=0, at=server):
    return openai.OpenAI(
        base_url=at.openai_base_url, api_key="k", max_retries=retries,
        http_client=httpx2.Client(event_hooks={"request": [
            lambda request: reserved.append(chain[-1].snapshot().reserved_usd)]}),
    )
CLIENT, RETRYING, OVER = client(), client(retries=1), client(at=big)
PLAIN = dict(messages=[{"role": "user", "content": "hi"}], max_tokens=5)
# name: (body, client, failures the server answers first, max_steps). A denial
# drops the model's unused breaker: the call after it makes one the general way.
CASES = {
    "plain": (PLAIN, CLIENT, 0, 50),
    "two messages, a name": (dict(messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello there", "name": "ann"}], max_completion_tokens=7),
        CLIENT, 0, 50),
    "unicode": (dict(messages=[{"role": "user", "content": "héllo ☃ 日本"}], max_tokens=5),
                CLIENT, 0, 50),
    "an HTTP error": (PLAIN, CLIENT, 1, 50),
    "retried": (PLAIN, RETRYING, 1, 50),
    "no step left": (PLAIN, CLIENT, 0, 0),
    "a null value": (dict(messages=[{"role": "user", "content": "x", "name": None}],
                          max_tokens=5), CLIENT, 0, 50),
    "usage over the reservation": (PLAIN, OVER, 0, 50),
    "no cap (clamped)": (dict(messages=[{"role": "user", "content": "hi"}]), CLIENT, 0, 50),
    "tools": (dict(messages=[{"role": "user", "content": "hi"}], max_tokens=5, tools=[
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]),
        CLIENT, 0, 50),
    "two choices": (dict(messages=[{"role": "user", "content": "hi"}], max_tokens=5, n=2),
                    CLIENT, 0, 50),
}
GENERAL = _adapter._describe.__code__
def sent_count():
    return server.count("/v1/chat/completions") + big.count("/v1/chat/completions")
"""
    + _SENDING
    + """
def run(ctx, body, sdk, failures, way):
    reserved.clear()
    chain.append(ctx)
    server.fail_next(failures) if failures else None
    sent = sent_count()
    raised, general = sending(
        lambda: sdk.chat.completions.create(model="gpt-4o-mini", **body), way)
    snap = ctx.snapshot()
    return {
        "reserved": reserved[:], "cost": snap.cost_usd, "tokens": snap.tokens,
        "steps": snap.steps, "retries": snap.retries, "held": snap.reserved_usd,
        "raised": raised, "sent": sent_count() - sent,
        "general": general,
    }

OpenAIInstrumentor().instrument()
def config(steps=50):
    return ExecutionConfig(max_cost_usd=5.0, max_steps=steps, max_tokens=100_000,
                           max_retries_total=5)
with ExecutionContext(config()) as ctx:  # the model's breaker and price, made the general way
    chain.append(ctx)
    CLIENT.chat.completions.create(model="gpt-4o-mini", **PLAIN)
out = {}
for name, (body, sdk, failures, steps) in CASES.items():
    for way in ("lane", "general"):
        with ExecutionContext(config(steps)) as ctx:
            out.setdefault(name, {})[way] = run(ctx, body, sdk, failures, way)
# The process default chain (zero code) takes the lane too.
for way in ("lane", "general"):
    default = ExecutionContext(config())
    _propagation.set_default_context(default)
    out.setdefault("default chain", {})[way] = run(default, PLAIN, CLIENT, 0, way)
_propagation.set_default_context(None)
server.__exit__(None, None, None)
big.__exit__(None, None, None)
print(json.dumps(out))
"""
)

# Requests the lane takes (the rest are left to the general way).
_LANE = {
    *("plain", "two messages, a name", "unicode", "an HTTP error", "retried"),
    *("usage over the reservation", "default chain"),
}


def _agreeing(script: str, cases: int, lane_cases: set[str], keys: tuple[str, ...]) -> Any:
    """What ``script`` printed: per case, its outcome each way, checked to agree on
    ``keys``, taken by the lane only for ``lane_cases``, and nothing left reserved."""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert len(out) == cases
    for name, ways in out.items():
        lane, general = ways["lane"], ways["general"]
        assert general["general"] is True, name
        assert lane["general"] is (name not in lane_cases), name
        assert lane["held"] == 0, name  # settled: nothing left reserved
        for key in keys:
            assert lane[key] == general[key], (name, key, lane, general)
    return out


def test_the_plain_lane_and_the_general_way_agree() -> None:
    keys = ("reserved", "cost", "tokens", "steps", "retries", "raised", "sent")
    out = _agreeing(_SCRIPT, 12, _LANE, keys)
    # What each case did, once (the same both ways, above).
    plain, error, retried = (
        out["plain"]["lane"],
        out["an HTTP error"]["lane"],
        out["retried"]["lane"],
    )
    assert plain["reserved"][0] > 0 and plain["cost"] > 0 and plain["steps"] == 1
    assert (error["raised"], error["cost"], error["steps"]) == ("InternalServerError", 0, 1)
    assert (retried["raised"], retried["sent"], retried["retries"]) == (None, 2, 1)
    assert out["no step left"]["lane"]["raised"] == "BudgetExceededError"
    assert out["no step left"]["lane"]["sent"] == 0
    over = out["usage over the reservation"]["lane"]  # committed as used, over what was held
    assert over["sent"] == 1 and over["tokens"] > 900 and over["cost"] > over["reserved"][0]


# The adapters whose lane reads their own reply (``read_reply``: ollama, cohere,
# Bedrock's Converse): it reads such a reply in its own frame and commits its plain
# usage there (``_settle``'s and ``finish``'s rules, copied); an HTTP error status the
# reader settles, a retried call and a denied one must end as the general way ends them.
_ADAPTERS_SCRIPT = (
    """
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
# name: (call, failures the server answers first (status), max_steps)
CASES = {
    "ollama": (ollama_chat, None, 50),
    "ollama, an HTTP error": (ollama_chat, 400, 50),
    "ollama, no step left": (ollama_chat, None, 0),  # the general way denies it
    # hosted (a cloud tag): priced under ollama.cloud, the general way
    "ollama, a cloud tag": (lambda: ollama_chat("glm-4.6:cloud"), None, 50),
    "cohere": (cohere_chat, None, 50),
    "cohere, an HTTP error": (cohere_chat, 400, 50),
    "cohere, retried": (lambda: cohere_chat(
        request_options={"max_retries": 1}), 503, 50),
    "cohere, tools": (lambda: cohere_chat(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object"}}}]), None, 50),
    "bedrock": (converse, None, 50),
    "bedrock, an HTTP error": (converse, 400, 50),
    "bedrock, retried": (converse, 503, 50),
    # the lane reads the client seen last: another one's first call goes the general way
    "bedrock, another client": (lambda: converse(OTHER_AWS), None, 50),
}
GENERAL = _adapter.admit.__code__  # the general way's admission (the lane reserves inline)
"""
    + _SENDING
    + """
def run(ctx, call, failures, way):
    if failures:
        server.fail_next(1, failures)
    sent = server.request_count
    raised, general = sending(call, way)
    snap = ctx.snapshot()
    return {
        "cost": snap.cost_usd, "tokens": snap.tokens, "steps": snap.steps,
        "retries": snap.retries, "held": snap.reserved_usd, "raised": raised,
        "sent": server.request_count - sent, "general": general,
    }

def config(steps=50):
    return ExecutionConfig(max_cost_usd=5.0, max_steps=steps, max_tokens=100_000,
                           max_retries_total=5)
# Each model's breaker and price, made the general way first.
with ExecutionContext(config(), price_table=PRICES):
    ollama_chat(), cohere_chat(), converse()
out = {}
for name, (call, failures, steps) in CASES.items():
    for way in ("lane", "general"):
        with ExecutionContext(config(steps), price_table=PRICES) as ctx:
            out.setdefault(name, {})[way] = run(ctx, call, failures, way)
server.__exit__(None, None, None)
print(json.dumps(out))
"""
)


# Requests the adapters' lane takes.
_ADAPTER_LANE = {
    "ollama",
    "ollama, an HTTP error",
    "cohere",
    "cohere, an HTTP error",
    "cohere, retried",
    "bedrock",
    "bedrock, an HTTP error",
    "bedrock, retried",
}


def test_the_lane_of_adapters_that_read_their_reply_agrees_with_the_general_way() -> None:
    keys = ("cost", "tokens", "steps", "retries", "raised", "sent")
    out = _agreeing(_ADAPTERS_SCRIPT, 12, _ADAPTER_LANE, keys)
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
