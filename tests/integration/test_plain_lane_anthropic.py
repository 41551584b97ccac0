"""anthropic's ``messages.create`` on the plain lane (``_adapter._lane``) and
the general way agree: what each reserved, committed, counted and sent.

The lane runs only with no TracerProvider: the calls run in a fresh
interpreter. Each request goes once through the lane (a chain with nothing in
the way) and once the general way (baggage current: the lane leaves the call
to the general way, which strips ours before the send). A request whose input
the plain reader cannot bound exactly (tools, system blocks, images, a
document, cache marks, a value that is not a string) must take the general way
even with nothing in the way.
"""

from __future__ import annotations

import json
import subprocess
import sys

_SCRIPT = """
import json
import anthropic
from opentelemetry import baggage, context
from veronica_otel import ExecutionConfig, ExecutionContext, _propagation
from veronica_otel.instrumentors import _adapter
from veronica_otel.instrumentors.anthropic import AnthropicInstrumentor
from veronica_otel.testing import FakeLLMServer

server = FakeLLMServer(output_tokens=5).__enter__()
held_at_send, chains = [], []
def client(retries=0, **options):
    hooks = {"request": [lambda request: held_at_send.append(chains[-1].snapshot().reserved_usd)]}
    return anthropic.Anthropic(
        base_url=server.anthropic_base_url, api_key="k", max_retries=retries,
        http_client=anthropic.DefaultHttpxClient(event_hooks=hooks), **options)
OFF, DEFAULT = client(open_telemetry=False), client()
RETRYING = client(retries=1, open_telemetry=False)
HI = [{"role": "user", "content": "hi"}]
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}
PDF = {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}
# name: (body, client, failures the server answers first, max_steps, whether the lane takes it)
CASES = {
    "plain": (dict(messages=HI), OFF, 0, 50, True),
    "the SDK's tracing on": (dict(messages=HI), DEFAULT, 0, 50, True),
    "a system prompt, turns": (dict(system="Be brief.", messages=[
        {"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "and?"}]), OFF, 0, 50, True),
    "unicode": (dict(system="sé", messages=[{"role": "user", "content": "héllo ☃ 日本"}]),
                OFF, 0, 50, True),
    # Thinking is output, within max_tokens: nothing hidden in the input.
    "thinking": (dict(messages=HI, thinking={"type": "enabled", "budget_tokens": 1024}),
                 OFF, 0, 50, True),
    "an HTTP error": (dict(messages=HI), OFF, 1, 50, True),
    "retried": (dict(messages=HI), RETRYING, 1, 50, True),
    "no step left": (dict(messages=HI), OFF, 0, 0, False),  # the admission lane's: denied
    "tools": (dict(messages=HI, tools=[{"name": "f", "input_schema": {"type": "object"}}]),
              OFF, 0, 50, False),
    "system blocks": (dict(system=[{"type": "text", "text": "Be brief."}], messages=HI),
                      OFF, 0, 50, False),
    "an image": (dict(messages=[{"role": "user", "content": [IMAGE]}]), OFF, 0, 50, False),
    "a document": (dict(messages=[{"role": "user", "content": [PDF]}]), OFF, 0, 50, False),
    "cache marks": (dict(messages=HI, cache_control={"type": "ephemeral"}), OFF, 0, 50, False),
    "a value not a string": (dict(messages=HI, extra_body={"messages": [
        {"role": "user", "content": "hi", "n": 1}]}), OFF, 0, 50, False),
}
described = []  # _describe runs only on the general way: counted where it is looked up
_describe = _adapter._describe
_adapter._describe = lambda *args: described.append(1) or _describe(*args)

def run(ctx, body, sdk, failures, way):
    chains.append(ctx)
    del held_at_send[:], described[:]
    if failures:
        server.fail_next(failures)
    before = server.count("/v1/messages")
    token = context.attach(baggage.set_baggage("app", "1")) if way == "general" else None
    raised = None
    try:
        sdk.messages.create(model="claude-3-5-haiku-latest", max_tokens=5, **body)
    except Exception as exc:
        raised = type(exc).__name__
    if token is not None:
        context.detach(token)
    snap = ctx.snapshot()
    return dict(
        held_at_send=list(held_at_send), cost=snap.cost_usd, tokens=snap.tokens,
        steps=snap.steps, retries=snap.retries, held=snap.reserved_usd, raised=raised,
        sent=server.count("/v1/messages") - before, general=bool(described),
    )

AnthropicInstrumentor().instrument()
LIMITS = dict(max_cost_usd=5.0, max_tokens=100_000, max_retries_total=5)
def config(steps=50):
    return ExecutionConfig(max_steps=steps, **LIMITS)
# The model's breaker and price, made the general way before the cases.
chains.append(ExecutionContext(config()))
with chains[-1]:
    OFF.messages.create(model="claude-3-5-haiku-latest", max_tokens=5, messages=HI)
out = {}
for name, (body, sdk, failures, steps, lane) in CASES.items():
    for way in ("lane", "general"):
        with ExecutionContext(config(steps)) as ctx:
            out.setdefault(name, {"lane_taken": lane})[way] = run(ctx, body, sdk, failures, way)
for way in ("lane", "general"):  # the process default chain (zero code) takes the lane too
    default = ExecutionContext(config())
    _propagation.set_default_context(default)
    out.setdefault("default chain", {"lane_taken": True})[way] = run(
        default, dict(messages=HI), OFF, 0, way)
_propagation.set_default_context(None)
server.__exit__(None, None, None)
print(json.dumps(out))
"""


def test_anthropic_plain_lane_and_the_general_way_agree() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert len(out) == 15
    same = ("held_at_send", "cost", "tokens", "steps", "retries", "raised", "sent")
    for name, ways in out.items():
        lane, general = ways["lane"], ways["general"]
        # The way each took (_describe runs only on the general way), nothing left held.
        assert (lane["general"], general["general"]) == (not ways["lane_taken"], True), name
        assert (lane["held"], general["held"]) == (0, 0), name
        assert [lane[key] for key in same] == [general[key] for key in same], name
    # What each case did, once (the same both ways, above).
    plain = out["plain"]["lane"]
    assert plain["held_at_send"][0] > 0 and plain["cost"] > 0 and plain["steps"] == 1
    error, retried, denied = (
        out[name]["lane"] for name in ("an HTTP error", "retried", "no step left")
    )
    assert (error["raised"], error["cost"], error["steps"]) == ("InternalServerError", 0, 1)
    assert (retried["raised"], retried["sent"], retried["retries"]) == (None, 2, 1)
    assert (denied["raised"], denied["sent"]) == ("BudgetExceededError", 0)
    # Hidden input is bounded on the general way: an image costs more than its bytes.
    assert out["an image"]["lane"]["held_at_send"][0] > plain["held_at_send"][0]
