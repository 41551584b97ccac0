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

from veronica_otel.testing import FakeLLMServer

_SCRIPT = """
import json, sys
import httpx2, openai
from opentelemetry import baggage, context
from veronica_otel import ExecutionConfig, ExecutionContext
from veronica_otel.instrumentors import _adapter
from veronica_otel.instrumentors.openai import OpenAIInstrumentor

reserved = []  # the chain's reservation while each HTTP request is sent
chain = []
client = openai.OpenAI(
    base_url=sys.argv[1], api_key="k", max_retries=0,
    http_client=httpx2.Client(event_hooks={"request": [
        lambda request: reserved.append(chain[-1].snapshot().reserved_usd)]}),
)
BODIES = {
    "plain": dict(messages=[{"role": "user", "content": "hi"}], max_tokens=5),
    "two messages, a name": dict(messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello there", "name": "ann"}], max_completion_tokens=7),
    "unicode": dict(messages=[{"role": "user", "content": "héllo ☃ 日本"}], max_tokens=5),
    "a null value": dict(messages=[{"role": "user", "content": "x", "name": None}], max_tokens=5),
    "no cap (clamped)": dict(messages=[{"role": "user", "content": "hi"}]),
    "tools": dict(messages=[{"role": "user", "content": "hi"}], max_tokens=5, tools=[
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]),
    "two choices": dict(messages=[{"role": "user", "content": "hi"}], max_tokens=5, n=2),
}
described = []
DESCRIBE = _adapter._describe.__code__
def profile(frame, event, arg):
    if event == "call" and frame.f_code is DESCRIBE:
        described.append(1)

OpenAIInstrumentor().instrument()
config = ExecutionConfig(max_cost_usd=5.0, max_steps=50, max_tokens=100_000)
with ExecutionContext(config) as ctx:  # the model's breaker and price, made the general way
    chain.append(ctx)
    client.chat.completions.create(model="gpt-4o-mini", **BODIES["plain"])
out = {}
for name, body in BODIES.items():
    for way in ("lane", "general"):
        reserved.clear()
        described.clear()
        token = None if way == "lane" else context.attach(baggage.set_baggage("app", "1"))
        try:
            with ExecutionContext(config) as ctx:
                chain.append(ctx)
                sys.setprofile(profile)
                client.chat.completions.create(model="gpt-4o-mini", **body)
                sys.setprofile(None)
                snap = ctx.snapshot()
        finally:
            if token is not None:
                context.detach(token)
        out.setdefault(name, {})[way] = {
            "reserved": reserved[:], "cost": snap.cost_usd, "tokens": snap.tokens,
            "steps": snap.steps, "held": snap.reserved_usd, "general": bool(described),
        }
# The process default chain (zero code) takes the lane too; baggage sends it the general way.
from veronica_otel import _propagation
for way in ("lane", "general"):
    default = ExecutionContext(config)
    _propagation.set_default_context(default)
    chain.append(default)
    reserved.clear()
    described.clear()
    token = None if way == "lane" else context.attach(baggage.set_baggage("app", "1"))
    sys.setprofile(profile)
    client.chat.completions.create(model="gpt-4o-mini", **BODIES["plain"])
    sys.setprofile(None)
    if token is not None:
        context.detach(token)
    snap = default.snapshot()
    out.setdefault("default chain", {})[way] = {
        "reserved": reserved[:], "cost": snap.cost_usd, "tokens": snap.tokens,
        "steps": snap.steps, "held": snap.reserved_usd, "general": bool(described),
    }
_propagation.set_default_context(None)
print(json.dumps(out))
"""

# Requests the lane takes (the rest are left to the general way).
_LANE = {"plain", "two messages, a name", "unicode", "default chain"}


def test_the_plain_lane_and_the_general_way_agree() -> None:
    with FakeLLMServer(output_tokens=5) as server:
        done = subprocess.run(
            [sys.executable, "-c", _SCRIPT, server.openai_base_url],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert len(out) == 8
    for name, ways in out.items():
        lane, general = ways["lane"], ways["general"]
        assert general["general"] is True, name
        assert lane["general"] is (name not in _LANE), name
        assert lane["reserved"] and lane["reserved"][0] > 0, name
        assert lane["steps"] == 1 and lane["cost"] > 0 and lane["tokens"] > 0, name
        assert lane["held"] == 0, name  # settled: nothing left reserved
        for key in ("reserved", "cost", "tokens", "steps", "held"):
            assert lane[key] == general[key], (name, key)
