"""What one openai WebSocket session's events mean to the chain (``_realtime_session``).

The SDK-facing half is tested end to end in
``tests/integration/test_openai_realtime.py``; here, the worst-case bound, the
clamp written into the event, and the settlement of audio usage at its rate.
"""

from __future__ import annotations

import json
from typing import Any

from veronica_otel import ExecutionConfig, ExecutionContext
from veronica_otel._pricing import default_price_table
from veronica_otel.instrumentors._admit import admit
from veronica_otel.instrumentors._common import UNTRACED_SPAN
from veronica_otel.instrumentors._realtime_session import (
    REALTIME_MAX_OUTPUT,
    Session,
    _read_usage,
    session_kind,
)

MODEL = "gpt-realtime"


def test_paths_name_their_protocol() -> None:
    assert session_kind("/v1/realtime") == "realtime"
    assert session_kind("/openai/v1/responses/") == "responses"
    assert session_kind("/v1/realtime/translations") is None
    assert session_kind("/v1/live/sessions") is None


def test_the_realtime_bound_is_the_conversation_so_far_capped_by_the_window() -> None:
    session = Session("realtime", MODEL, beta=False)
    prices = default_price_table().lookup("openai", MODEL)
    assert prices is not None and prices.context_window is not None
    audio = json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 1000})
    assert session.outgoing(audio) == (None, None)  # no generation, no parse
    spec, event = session.outgoing('{"type": "response.create"}')
    assert spec is not None and event == {"type": "response.create"}
    bounded = session.bound(spec, prices)
    assert bounded.input_bound >= len(audio) + len('{"type": "response.create"}')
    assert bounded.requested_cap is None and bounded.clampable
    for _ in range(40):
        session.outgoing(audio)
    assert session.bound(spec, prices).input_bound == prices.context_window


def test_caps_come_from_the_response_then_the_session_never_over_the_api_limit() -> None:
    session = Session("realtime", MODEL, beta=False)
    session.outgoing(json.dumps({"type": "session.update", "session": {"max_output_tokens": 50}}))
    spec, _ = session.outgoing('{"type": "response.create"}')
    assert spec is not None and spec.requested_cap == 50
    spec, _ = session.outgoing('{"type":"response.create","response":{"max_output_tokens":9000}}')
    assert spec is not None and session.bound(spec, None).requested_cap == REALTIME_MAX_OUTPUT
    beta = Session("realtime", MODEL, beta=True)
    spec, event = beta.outgoing('{"type": "response.create"}')
    assert spec is not None and event is not None
    rewritten = json.loads(beta.rewrite(event, 70_000, None))
    assert rewritten["response"] == {"max_response_output_tokens": REALTIME_MAX_OUTPUT}


def test_responses_continuing_server_side_context_reserve_the_window() -> None:
    session = Session("responses", "", beta=False)
    prices = default_price_table().lookup("openai", "gpt-4o-mini")
    assert prices is not None and prices.context_window is not None
    plain, _ = session.outgoing('{"type":"response.create","model":"gpt-4o-mini","input":"hi"}')
    chained, event = session.outgoing(
        '{"type":"response.create","model":"gpt-4o-mini","input":"hi","previous_response_id":"r"}'
    )
    assert plain is not None and chained is not None and event is not None
    assert chained.model == "gpt-4o-mini"
    assert session.bound(chained, prices).input_bound >= prices.context_window
    assert session.bound(plain, prices).input_bound < 100
    assert json.loads(session.rewrite(event, 64, "gpt-4o"))["model"] == "gpt-4o"


def _settled(usage: dict[str, Any]) -> float:
    """What one realtime response reporting ``usage`` commits (USD)."""
    with ExecutionContext(ExecutionConfig(max_cost_usd=10.0)) as ctx:
        session = Session("realtime", MODEL, beta=False)
        spec, _ = session.outgoing('{"type": "response.create"}')
        assert spec is not None
        bounded = session.bound(spec, ctx.prices_for("openai", MODEL))
        call, _, _ = admit(ctx, UNTRACED_SPAN, False, bounded)
        _read_usage(call, usage)
        call.finish()
        return ctx.snapshot().cost_usd


def test_audio_settles_at_the_audio_rate_and_text_at_the_text_rate() -> None:
    spent = _settled(
        {
            "input_tokens": 1_000,
            "output_tokens": 300,
            "input_token_details": {
                "text_tokens": 600,
                "audio_tokens": 400,
                "image_tokens": 0,
                "cached_tokens": 100,
                "cached_tokens_details": {"text_tokens": 100, "audio_tokens": 0},
            },
            "output_token_details": {"text_tokens": 100, "audio_tokens": 200},
        }
    )
    # gpt-realtime, USD per million: text in 4, cached 0.4, audio in 32, text out 16, audio out 64
    expected = (500 * 4 + 100 * 0.4 + 400 * 32 + 100 * 16 + 200 * 64) / 1e6
    assert abs(spent - expected) < 1e-6


def test_usage_whose_split_does_not_add_up_settles_at_the_dearest_rate() -> None:
    spent = _settled(
        {
            "input_tokens": 1_000,
            "output_tokens": 100,
            "input_token_details": {"text_tokens": 10, "audio_tokens": 0},
            "output_token_details": {"text_tokens": 100, "audio_tokens": 0},
        }
    )
    assert abs(spent - (1_000 * 32 + 100 * 64) / 1e6) < 1e-6


def test_a_response_create_hidden_from_the_fast_path_is_still_a_call() -> None:
    session = Session("realtime", MODEL, beta=False)
    hostile = (
        '{"response": {"type": "input_audio_buffer.append"}, "type": "response.create"}',
        '{"type": "response\\u002ecreate"}',
        '{"type": "response.create", "response": {"instructions": "session.update"}}',
    )
    for message in hostile:
        spec, event = session.outgoing(message)
        assert spec is not None and event is not None, message
    spec, _ = session.outgoing('{"type": "input_audio_buffer.append", "audio": "AAAA"}')
    assert spec is None  # turn detection off: audio alone makes no response


def test_models_that_speak_are_reserved_at_their_audio_rates() -> None:
    table = default_price_table()
    realtime = table.lookup("openai", "gpt-realtime-2025-08-28")
    assert realtime is not None
    # OpenAI's gpt-realtime: text $4 / $16, audio $32 / $64 per million tokens.
    assert (realtime.input, realtime.output) == (32_000_000_000, 64_000_000_000)
    assert realtime.max_output == REALTIME_MAX_OUTPUT
    text_only = table.lookup("openai", "gpt-4o")
    assert text_only is not None and text_only.input == 2_500_000_000  # untouched
