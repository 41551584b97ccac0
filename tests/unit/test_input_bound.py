"""The input-token bound used for reservations is an upper bound (property test)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from openai._models import FinalRequestOptions

from tests._bounds import text_bytes
from veronica_otel._pricing import TOKENS_PER_MESSAGE, TOKENS_PER_REQUEST
from veronica_otel.instrumentors._admit import _utf8_bytes, input_bound
from veronica_otel.instrumentors._openai_request import read_plain, read_request
from veronica_otel.instrumentors.openai import OpenAIAdapter

roles = st.sampled_from(["system", "user", "assistant", "tool"])
messages = st.lists(
    st.fixed_dictionaries({"role": roles, "content": st.text(max_size=300)}),
    min_size=1,
    max_size=8,
)


@given(messages)
def test_bound_covers_every_byte_of_text_and_the_framing(msgs: list[dict[str, str]]) -> None:
    text_bytes = sum(len(m["content"].encode("utf-8")) + len(m["role"]) for m in msgs)
    framing = TOKENS_PER_MESSAGE * len(msgs) + TOKENS_PER_REQUEST
    # No byte-level BPE token is shorter than one byte: tokens <= bytes.
    assert input_bound([msgs], len(msgs)) >= text_bytes + framing


@given(st.text(min_size=1, max_size=200), st.integers(1, 5))
def test_bound_grows_with_the_text(text: str, repeat: int) -> None:
    one = input_bound([[{"role": "user", "content": text}]], 1)
    more = input_bound([[{"role": "user", "content": text * (repeat + 1)}]], 1)
    assert more > one


def test_non_ascii_counts_bytes_not_characters() -> None:
    emoji = "\U0001f600" * 10  # 4 bytes each
    assert input_bound([emoji], 1) >= 40


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@given(json_like)
def test_fast_paths_count_exactly_what_the_plain_walk_counts(value: object) -> None:
    # The C-level shortcut for dicts of ASCII strings and the per-item walk
    # must agree with the plain definition on every shape, ASCII or not.
    from veronica_otel.instrumentors._admit import _utf8_bytes

    assert _utf8_bytes(value) == text_bytes(value)


# Request bodies as SDKs build them: content-block lists inside messages
# (Gemini ``contents[].parts[]``, Converse ``content``), None for what is
# unset, numbers, tuples, and now and then a key that is not a str.
scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
keys = st.text(max_size=8) | st.integers(-5, 5)
bodies = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(keys, children, max_size=4)
    ),
    max_leaves=30,
)
blocks = st.lists(
    st.fixed_dictionaries(
        {
            "role": roles,
            "content": st.lists(
                st.fixed_dictionaries({"text": st.text(max_size=40)}) | st.text(max_size=10),
                max_size=3,
            ),
        }
    ),
    max_size=4,
)


@given(bodies)
def test_the_exact_type_paths_count_what_the_plain_walk_counts(value: object) -> None:
    from veronica_otel.instrumentors._admit import _utf8_bytes

    assert _utf8_bytes(value) == text_bytes(value)


@given(st.lists(blocks | st.none(), max_size=5))
def test_content_block_lists_are_bounded_by_every_byte_of_their_text(parts: list[object]) -> None:
    from veronica_otel.instrumentors._admit import _utf8_bytes

    text = 0
    for messages in parts:
        for message in messages or ():
            text += len(message["role"])
            for block in message["content"]:
                value = block if isinstance(block, str) else block["text"]
                text += len(value.encode("utf-8"))
    assert _utf8_bytes(parts) == text_bytes(parts) >= text


@given(st.integers(min_value=-(10**20), max_value=10**20))
def test_usage_counts_from_a_payload_are_capped_and_negatives_unreadable(value: int) -> None:
    from veronica_otel._units import MAX_COUNT
    from veronica_otel.instrumentors._common import token_count

    # A negative count is unreadable (the call then costs its reservation), never 0.
    assert token_count(value) == (None if value < 0 else min(value, MAX_COUNT))


def test_a_usage_count_that_is_not_a_number_is_unreadable() -> None:
    from veronica_otel.instrumentors._common import token_count

    assert token_count("many") is None


# openai's plain lane reads a chat request's input bytes in its own frame
# (_openai_request.read_plain): the same count as the walk, the same request.
plain_messages = st.lists(
    st.dictionaries(
        st.text(max_size=8),
        st.text(max_size=40) | st.none() | st.integers(),
        max_size=3,
    ).map(lambda message: {**message, "content": message.get("content") or "hi"}),
    max_size=5,
)


@given(plain_messages, st.none() | st.integers(0, 10**6), st.booleans())
def test_the_plain_lane_reads_what_the_walk_counts(
    msgs: list[dict[str, object]], cap: int | None, extra: bool
) -> None:
    body: dict[str, object] = {"model": "gpt-4o-mini", "messages": msgs}
    if cap is not None:
        body["max_tokens"] = cap
    options = FinalRequestOptions.construct(
        method="post",
        url="/chat/completions",
        json_data=body,
        extra_json={"user": "u"} if extra else None,
    )
    adapter = OpenAIAdapter()
    request, size = read_plain(adapter, (object, options), {})
    assert request == read_request(adapter, None, (object, options), {}, "request")
    assert request is not None and request.cap == cap
    plain = all(type(v) is str for m in msgs for v in m.values())
    assert size == (_utf8_bytes(request.input_parts) if plain else -1)
