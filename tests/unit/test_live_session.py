"""What a Gemini Live session's messages mean to the chain (``_live_session``).

End to end (the real ``google-genai`` against FakeLLMServer) in
``tests/integration/test_google_genai_live.py``.
"""

from __future__ import annotations

import json

from veronica_otel import ExecutionConfig, ExecutionContext
from veronica_otel.instrumentors._admit import admit
from veronica_otel.instrumentors._common import UNTRACED_SPAN
from veronica_otel.instrumentors._live_session import LiveSession

MODEL = "gemini-live-2.5-flash"
TURN = {"client_content": {"turns": [{"role": "user", "parts": [{"text": "hi"}]}]}}


def _session() -> LiveSession:
    return LiveSession(f"models/{MODEL}", "gcp.gemini", {"system_instruction": "Be brief."}, None)


def test_what_makes_the_model_generate_is_a_call() -> None:
    session = _session()
    complete = {"client_content": {**TURN["client_content"], "turn_complete": True}}
    spec, event = session.outgoing(json.dumps(complete))
    assert spec is not None and event == complete and spec.model == MODEL
    assert session.outgoing(json.dumps(TURN)) == (None, None)  # the turn goes on
    spec, _ = session.outgoing(json.dumps({"toolResponse": {"functionResponses": []}}))
    assert spec is not None
    audio = json.dumps({"realtime_input": {"audio": {"data": "AAAA", "mime_type": "audio/pcm"}}})
    spec, event = session.outgoing(audio)
    assert spec is not None and event is None  # armed: the server may end the turn on it
    with ExecutionContext(ExecutionConfig(max_steps=5)) as ctx:
        call, _, _ = admit(ctx, UNTRACED_SPAN, False, session.bound(spec, None))
        session.add(call, armed=True)
        assert session.outgoing(audio) == (None, None)  # one armed call at a time
        call.finish(sent=False)


def test_a_turn_settles_each_modality_at_its_rate() -> None:
    session = _session()
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        spec, _ = session.outgoing(json.dumps({"client_content": {"turn_complete": True}}))
        assert spec is not None
        bounded = session.bound(spec, ctx.prices_for("gcp.gemini", MODEL))
        assert bounded.requested_cap is not None  # a Live turn has no cap to write: the model's
        call, _, _ = admit(ctx, UNTRACED_SPAN, False, bounded)
        session.add(call)
        started, _, settled = session.incoming(
            b'{"serverContent": {"modelTurn": {"parts": [{"text": "tok0"}]}}}'
        )
        assert not started and not settled
        usage = {
            "promptTokenCount": 40,
            "responseTokenCount": 5,
            "promptTokensDetails": [
                {"modality": "TEXT", "tokenCount": 30},
                {"modality": "AUDIO", "tokenCount": 10},
            ],
            "responseTokensDetails": [{"modality": "TEXT", "tokenCount": 5}],
        }
        message = {"serverContent": {"turnComplete": True}, "usageMetadata": usage}
        _, _, settled = session.incoming(json.dumps(message).encode())
        assert settled == [call]
        call.finish()
        spent = ctx.snapshot().cost_usd
    # gemini-live-2.5-flash, USD per million: text in 0.5, audio in 3, text out 2
    assert abs(spent - (30 * 0.5 + 10 * 3 + 5 * 2) / 1e6) < 1e-9


def test_a_turn_the_server_starts_on_its_own_is_announced() -> None:
    session = _session()
    started, _, _ = session.incoming('{"serverContent": {"modelTurn": {"parts": []}}}')
    assert started
