"""anthropic's plain readers read what the general readings read.

``read_plain`` (the request and its input bytes, for the shared plain lane)
and ``payload_lane`` (a whole message's plain usage) each copy a general rule
for the common case: for every input they take, the result must be the
general one's, and an input they do not take must reach the general reading.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace

from veronica_otel import ExecutionConfig, ExecutionContext
from veronica_otel._units import MAX_COUNT
from veronica_otel.instrumentors import _anthropic_request
from veronica_otel.instrumentors._adapter import ADMITTED
from veronica_otel.instrumentors._admit import CallSpec, _utf8_bytes, admit, input_bound
from veronica_otel.instrumentors._anthropic_response import account, payload_lane
from veronica_otel.instrumentors._common import ContainedCall
from veronica_otel.instrumentors.anthropic import _ADAPTER

_CREATE = "anthropic.messages.create"


def _options(body: object, span_name: str = _CREATE) -> Any:
    from anthropic._models import FinalRequestOptions  # imported here: not on every worker

    return FinalRequestOptions.construct(
        method="post", url="/v1/messages", json_data=body, span_name=span_name
    )


_text = st.text(max_size=12)
_message = st.dictionaries(
    st.sampled_from(("role", "name", "id")), st.one_of(_text, st.none(), st.integers()), max_size=2
).flatmap(lambda extra: st.builds(lambda content: {**extra, "content": content}, _text))
_block = st.fixed_dictionaries({"type": st.sampled_from(("text", "image")), "text": _text})
_bodies = st.fixed_dictionaries(
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
@given(_bodies)
def test_read_plain_reads_the_request_and_the_input_bytes_the_general_way_reads(
    body: dict[str, Any],
) -> None:
    request, size = _anthropic_request.read_plain(_ADAPTER, (None, _options(body)), {})
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


def test_read_plain_passes_other_calls_through() -> None:
    assert _anthropic_request.read_plain(_ADAPTER, (None, _options({}, "other")), {}) == (None, -1)
    assert (
        _anthropic_request.read_call(_ADAPTER, None, (None, _options({}, "other")), {}, "m") is None
    )


counts = st.one_of(
    st.none(),
    st.integers(-5, MAX_COUNT + 5),
    st.integers(0, 10_000),
    st.booleans(),
    st.floats(0, 100),
    st.text(max_size=3),
)


def _call(ctx: ExecutionContext) -> ContainedCall:
    spec = CallSpec("anthropic", "chat", "claude-3-5-haiku-latest", input_bound(["hi"], 1), 5, True)
    call, _, _ = admit(ctx, trace.INVALID_SPAN, False, spec)
    call.adapter = _ADAPTER
    return call


def _state(call: ContainedCall) -> tuple[Any, ...]:
    return (
        call.usage_seen,
        call.input_tokens,
        call.output_tokens,
        call.cached_tokens,
        call.cache_write_tokens,
        call.reasoning_tokens,
        call.done,
        call.handle.cost_nano,
        call.handle.tokens,
    )


class _Client:
    def _process_response_data(self, *, data: object, response: object = None) -> object:
        return data


def _through_the_lane(call: ContainedCall, data: dict[str, Any]) -> list[str]:
    """``data`` read by the payload lane, as the SDK parses it in ``call``: which way it went."""
    went: list[str] = []

    def general(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        went.append("general")
        account(call, kwargs["data"])
        return wrapped(*args, **kwargs)

    hooked = payload_lane(_ADAPTER, general)
    hooked.__wrapped__ = _Client._process_response_data  # type: ignore[attr-defined]
    mark = ADMITTED.set(call)
    try:
        assert hooked(_Client(), data=data, response=None) is data  # passed on
    finally:
        ADMITTED.reset(mark)
    return went


@settings(deadline=None, max_examples=300)
@given(counts, counts, counts, counts, st.one_of(st.none(), counts))
def test_the_payload_lane_settles_a_whole_message_as_account_does(
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
        lane, general = _call(ctx), _call(ctx)
        _through_the_lane(lane, message)
        account(general, message)
        assert _state(lane) == _state(general)
        assert lane.done


def test_the_payload_lane_reads_plain_counts_and_leaves_the_rest_to_account() -> None:
    plain = {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 0}
    thinking = {**plain, "output_tokens_details": {"thinking_tokens": 2}}
    with ExecutionContext(ExecutionConfig(max_steps=10)) as ctx:
        call = _call(ctx)
        assert _through_the_lane(call, {"type": "message", "usage": plain}) == []
        assert call.done and (call.input_tokens, call.output_tokens) == (10, 5)
        call = _call(ctx)
        assert _through_the_lane(call, {"type": "message", "usage": thinking}) == ["general"]
        assert call.done and call.reasoning_tokens == 2
        call = _call(ctx)  # a stream event: account's
        assert _through_the_lane(call, {"type": "message_start", "message": {}}) == ["general"]
        assert not call.done
