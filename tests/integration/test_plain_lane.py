"""The adapters' plain lane (``_adapter._lane``) and the general way agree.

The lane runs only with no TracerProvider, so the calls run in a fresh
interpreter (the test process has its TracerProvider set). Each request goes
once through the lane (a chain with nothing in the way) and once the general
way (the same chain config, with baggage current: the lane leaves it to the
general way, which strips ours before the send); what each reserved (read
while its HTTP request is sent), committed and counted must be the same, and
each must have taken the way it was meant to (``_describe`` runs only on the
general way).
"""

from __future__ import annotations

import json
import subprocess
import sys

_SCRIPT = """
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
described = []
def sent_count():
    return server.count("/v1/chat/completions") + big.count("/v1/chat/completions")
DESCRIBE = _adapter._describe.__code__
def profile(frame, event, arg):
    if event == "call" and frame.f_code is DESCRIBE:
        described.append(1)

def run(ctx, body, sdk, failures, way):
    reserved.clear()
    described.clear()
    chain.append(ctx)
    server.fail_next(failures) if failures else None
    sent = sent_count()
    token = None if way == "lane" else context.attach(baggage.set_baggage("app", "1"))
    sys.setprofile(profile)
    try:
        sdk.chat.completions.create(model="gpt-4o-mini", **body)
        raised = None
    except Exception as exc:
        raised = type(exc).__name__
    finally:
        sys.setprofile(None)
        if token is not None:
            context.detach(token)
    snap = ctx.snapshot()
    return {
        "reserved": reserved[:], "cost": snap.cost_usd, "tokens": snap.tokens,
        "steps": snap.steps, "retries": snap.retries, "held": snap.reserved_usd,
        "raised": raised, "sent": sent_count() - sent,
        "general": bool(described),
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

# Requests the lane takes (the rest are left to the general way).
_LANE = {
    *("plain", "two messages, a name", "unicode", "an HTTP error", "retried"),
    *("usage over the reservation", "default chain"),
}


def test_the_plain_lane_and_the_general_way_agree() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert len(out) == 12
    for name, ways in out.items():
        lane, general = ways["lane"], ways["general"]
        assert general["general"] is True, name
        assert lane["general"] is (name not in _LANE), name
        assert lane["held"] == 0, name  # settled: nothing left reserved
        for key in ("reserved", "cost", "tokens", "steps", "retries", "raised", "sent"):
            assert lane[key] == general[key], (name, key)
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
