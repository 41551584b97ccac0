"""The plain lanes of the openai and anthropic fronts read what the general ones read.

Each lane copies a general rule for the common request or reply (a plain chat
body, a usage report of plain counts, a plain price): for every input it
takes, its result must be the general path's, and an input it does not take
must reach the general path.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai._models import FinalRequestOptions as OpenAIOptions
from opentelemetry import trace

from veronica_otel import ExecutionConfig, ExecutionContext
from veronica_otel._units import MAX_COUNT
from veronica_otel.instrumentors import _anthropic_request, _openai_request
from veronica_otel.instrumentors._adapter import ADMITTED
from veronica_otel.instrumentors._admit import CallSpec, _utf8_bytes, admit, input_bound
from veronica_otel.instrumentors._anthropic_response import account as anthropic_account
from veronica_otel.instrumentors._anthropic_response import payload_lane as anthropic_payload_lane
from veronica_otel.instrumentors._common import UNTRACED_SPAN, ContainedCall
from veronica_otel.instrumentors._openai_response import _usage
from veronica_otel.instrumentors._openai_response import account as openai_account
from veronica_otel.instrumentors.anthropic import _ADAPTER as ANTHROPIC
from veronica_otel.instrumentors.openai import OpenAIAdapter

OPENAI = OpenAIAdapter()
TEXT = [{"role": "user", "content": "Say hello."}]


def _openai_options(body: dict[str, Any], url: str = "/chat/completions") -> Any:
    return OpenAIOptions.construct(method="post", url=url, json_data=body)


def _general_openai(body: dict[str, Any], stream: bool = False) -> Any:
    route = _openai_request._route(_openai_options(body))
    assert route is not None
    model = body.get("model")
    if type(model) is not str or not model:
        model = str(model or "unknown")
    return _openai_request._general("openai", route, body, model, stream)


@pytest.mark.parametrize(
    "body",
    [
        {"model": "gpt-4o-mini", "messages": TEXT, "max_tokens": 5},
        {"model": "gpt-4o-mini", "messages": TEXT, "max_completion_tokens": 7},
        {"model": "gpt-4o-mini", "messages": TEXT * 3},
        {"model": "", "messages": []},
        {"messages": TEXT, "max_tokens": True},  # a bool is no cap
        {"model": "gpt-4o", "messages": TEXT, "stream": True, "temperature": 0.2},
        {"model": "gpt-4o", "messages": None},
    ],
)
def test_openai_plain_chat_lane_reads_what_the_general_reading_reads(
    body: dict[str, Any],
) -> None:
    read = _openai_request.read_request(OPENAI, None, (None, _openai_options(body)), {}, "m")
    assert read == _general_openai(body, stream=body.get("stream") is True)


@pytest.mark.parametrize(
    "body",
    [
        {"model": "gpt-4o", "messages": TEXT, "tools": [{"type": "web_search"}]},
        {"model": "gpt-4o", "messages": TEXT, "n": 3},
        {
            "model": "gpt-4o",
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ],
        },
        {"model": "gpt-4o", "messages": TEXT, "previous_response_id": "resp_1"},
    ],
)
def test_openai_bodies_the_plain_lane_does_not_take_are_read_in_full(
    body: dict[str, Any],
) -> None:
    read = _openai_request.read_request(OPENAI, None, (None, _openai_options(body)), {}, "m")
    assert read == _general_openai(body)
    assert read is not None
    assert read.extra_input_tokens or read.choices > 1 or "tools" in body  # the hidden input


def test_openai_stream_kwarg_streams_in_both_lanes() -> None:
    for body in ({"model": "m", "messages": TEXT}, {"model": "m", "messages": TEXT, "n": 2}):
        read = _openai_request.read_request(
            OPENAI, None, (None, _openai_options(body)), {"stream": True}, "m"
        )
        assert read is not None and read.stream


def _anthropic_options(
    body: dict[str, Any], url: str = "/v1/messages", span_name: str = "anthropic.messages.create"
) -> Any:
    # anthropic imported here: at the module's top, collection on every worker would import it
    from anthropic._models import FinalRequestOptions

    return FinalRequestOptions.construct(
        method="post", url=url, json_data=body, span_name=span_name
    )


@pytest.mark.parametrize(
    "body",
    [
        {"model": "claude-3-5-haiku-latest", "max_tokens": 5, "messages": TEXT},
        {"model": "claude", "max_tokens": 5, "messages": TEXT, "system": "Be brief."},
        {"model": "claude", "messages": TEXT * 2, "stream": True, "temperature": 0.1},
        {"model": None, "max_tokens": False, "messages": []},
        # Not taken by the lane: the general reading's answer either way.
        {"model": "claude", "max_tokens": 5, "messages": TEXT, "tools": [{"name": "t"}]},
        {"model": "claude", "messages": TEXT, "system": [{"type": "text", "text": "x"}]},
        {"model": "claude", "messages": TEXT, "cache_control": {"type": "ephemeral"}},
        {
            "model": "claude",
            "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}],
        },
        {"model": "claude", "messages": "hi"},
    ],
)
def test_anthropic_plain_lane_reads_what_the_general_reading_reads(body: dict[str, Any]) -> None:
    options = _anthropic_options(body)
    read = _anthropic_request.read_call(ANTHROPIC, None, (None, options), {}, "m")
    assert read == _anthropic_request.read_request(body)


def test_anthropic_calls_other_than_messages_create_pass_through() -> None:
    options = _anthropic_options({}, "/v1/messages/count_tokens", "other")
    assert _anthropic_request.read_call(ANTHROPIC, None, (None, options), {}, "m") is None
    assert _anthropic_request.read_plain(ANTHROPIC, (None, options), {}) == (None, -1)


_text = st.text(max_size=12)
_message = st.dictionaries(
    st.sampled_from(("role", "name", "id")), st.one_of(_text, st.none(), st.integers()), max_size=2
).flatmap(lambda extra: st.builds(lambda content: {**extra, "content": content}, _text))
_block = st.fixed_dictionaries({"type": st.sampled_from(("text", "image")), "text": _text})
_anthropic_bodies = st.fixed_dictionaries(
    {"model": st.one_of(_text, st.none()), "messages": st.lists(_message, max_size=4)},
    optional={
        "system": st.one_of(_text, st.lists(_block, max_size=2)),
        "max_tokens": st.one_of(st.integers(-1, 10**6), st.booleans(), st.none()),
        "stream": st.booleans(),
        "tools": st.lists(st.fixed_dictionaries({"name": _text}), max_size=1),
        "cache_control": st.just({"type": "ephemeral"}),
        "temperature": st.floats(0, 1),
    },
)


@settings(deadline=None, max_examples=300)
@given(_anthropic_bodies)
def test_anthropic_read_plain_reads_the_request_and_the_input_bytes_the_general_way_reads(
    body: dict[str, Any],
) -> None:
    request, size = _anthropic_request.read_plain(ANTHROPIC, (None, _anthropic_options(body)), {})
    assert request == _anthropic_request.read_request(body)
    assert request is not None
    if size >= 0:  # taken: the input bound's walk, exactly, and nothing hidden
        assert size == _utf8_bytes(request.input_parts)
        assert request.extra_input_tokens == 0 and not request.cache_writes
    plain = (
        type(body.get("system", "")) is str
        and not {"tools", "cache_control"} & body.keys()
        and all(type(value) is str for message in body["messages"] for value in message.values())
    )
    assert (size >= 0) is plain


def _call(ctx: ExecutionContext, stream: bool = False) -> ContainedCall:
    spec = CallSpec("openai", "chat", "gpt-4o-mini", input_bound([TEXT], 1), 5, True)
    call, _, _ = admit(ctx, trace.INVALID_SPAN, False, spec)
    call.handle.metrics = False
    call.request = _general_openai({"model": "gpt-4o-mini", "messages": TEXT}, stream=stream)
    return call


def _usage_state(call: ContainedCall) -> tuple[Any, ...]:
    return (
        call.usage_seen,
        call.input_tokens,
        call.output_tokens,
        call.cached_tokens,
        call.cache_write_tokens,
        call.reasoning_tokens,
    )


counts = st.one_of(
    st.none(),
    st.sampled_from([0, 1, 26, MAX_COUNT, MAX_COUNT + 1, -1, 2.5, True, "3"]),
    st.integers(0, 10**6),
)
details = st.one_of(st.none(), st.fixed_dictionaries({}, optional={"cached_tokens": counts}))
out_details = st.one_of(st.none(), st.fixed_dictionaries({}, optional={"reasoning_tokens": counts}))


@settings(deadline=None, max_examples=150)
@given(counts, counts, details, out_details)
def test_openai_usage_lane_keeps_what_set_usage_keeps(
    inp: Any, out: Any, din: Any, dout: Any
) -> None:
    usage: dict[str, Any] = {"prompt_tokens": inp, "completion_tokens": out}
    if din is not None:
        usage["prompt_tokens_details"] = din
    if dout is not None:
        usage["completion_tokens_details"] = dout
    with ExecutionContext(ExecutionConfig(max_steps=10)) as ctx:
        fast, general = _call(ctx), _call(ctx)
        openai_account(fast, {"usage": usage})  # the reply's payload
        _usage(general, usage)  # the general reading
        assert _usage_state(fast) == _usage_state(general)
        fast.finish()
        general.finish()
        assert fast.handle.cost_nano == general.handle.cost_nano


class _Client:
    def _process_response_data(self, *, data: object, response: object = None) -> object:
        return data


def _through_anthropic_payload_lane(call: ContainedCall, data: dict[str, Any]) -> list[str]:
    """``data`` read by anthropic's payload lane, as the SDK parses it in ``call``
    (admitted, in flight): which way it went (``["general"]``: to account)."""
    went: list[str] = []

    def general(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        went.append("general")
        anthropic_account(call, kwargs["data"])
        return wrapped(*args, **kwargs)

    hooked = anthropic_payload_lane(ANTHROPIC, general)
    hooked.__wrapped__ = _Client._process_response_data  # type: ignore[attr-defined]
    call.adapter = ANTHROPIC
    mark = ADMITTED.set(call)
    try:
        assert hooked(_Client(), data=data, response=None) is data  # passed on
    finally:
        ADMITTED.reset(mark)
    return went


@settings(deadline=None, max_examples=200)
@given(counts, counts, counts, counts, st.one_of(st.none(), counts))
def test_anthropic_whole_message_lane_keeps_what_the_general_reading_keeps(
    inp: Any, out: Any, read: Any, write: Any, thinking: Any
) -> None:
    usage: dict[str, Any] = {"input_tokens": inp, "output_tokens": out}
    if read is not None:
        usage["cache_read_input_tokens"] = read
    if write is not None:
        usage["cache_creation_input_tokens"] = write
    if thinking is not None:
        usage["output_tokens_details"] = {"thinking_tokens": thinking}
    message = {"type": "message", "id": "msg_1", "usage": usage}
    with ExecutionContext(ExecutionConfig(max_steps=10)) as ctx:
        fast, general = _call(ctx), _call(ctx)
        _through_anthropic_payload_lane(fast, message)  # settles it
        anthropic_account(general, message)  # the reading of every other payload
        assert _usage_state(fast) == _usage_state(general)
        assert fast.done and general.done
        assert fast.handle.cost_nano == general.handle.cost_nano
        assert fast.handle.tokens == general.handle.tokens


def test_anthropic_payload_lane_reads_plain_counts_and_leaves_the_rest_to_account() -> None:
    plain = {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 0}
    thinking = {**plain, "output_tokens_details": {"thinking_tokens": 2}}
    with ExecutionContext(ExecutionConfig(max_steps=10)) as ctx:
        call = _call(ctx)
        assert _through_anthropic_payload_lane(call, {"type": "message", "usage": plain}) == []
        assert call.done and (call.input_tokens, call.output_tokens) == (10, 5)
        call = _call(ctx)
        message = {"type": "message", "usage": thinking}
        assert _through_anthropic_payload_lane(call, message) == ["general"]
        assert call.done and call.reasoning_tokens == 2
        call = _call(ctx)  # no span to end: left to settle as request() returns
        call.span = UNTRACED_SPAN
        assert _through_anthropic_payload_lane(call, {"type": "message", "usage": plain}) == []
        assert (
            call.usage_seen
            and not call.done
            and (call.input_tokens, call.output_tokens)
            == (
                10,
                5,
            )
        )
        call = _call(ctx)  # a stream event: account's
        event = {"type": "message_start", "message": {}}
        assert _through_anthropic_payload_lane(call, event) == ["general"]
        assert not call.done


def test_finish_plain_lane_commits_the_general_amounts() -> None:
    with ExecutionContext(ExecutionConfig(max_steps=10)) as ctx:
        for usage in ((26, 5, 0, 0, 0), (26, 5, 10, 0, 0), (26, 5, 0, 3, 0), (0, 0, 0, 0, 0)):
            call = _call(ctx)
            assert call.set_usage(*usage)
            expected = call._usage_amounts()
            call.finish()
            assert (call.handle.cost_nano, call.handle.tokens) == expected
