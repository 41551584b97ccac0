"""_json_body.loads: json.loads' result and errors, by the C scanner where the body allows."""

from __future__ import annotations

import json

import pytest

from veronica_otel.instrumentors._json_body import loads

BODIES = [
    '{"usage": {"input_tokens": 3, "output_tokens": 5}, "text": "h\\u00e9llo"}',  # scanner
    '{"a": [1, 2.5, null, true]}\n',  # trailing JSON whitespace: scanner
    '{"a": 1} \r\n\t',
    ' {"a": 1}',  # leading whitespace: json.loads
    "[1, 2]",
    '"text"',
    "[Infinity, -Infinity]",
    b'{"a": 1}',  # bytes: json.loads (encoding detection)
    '{"a": 1}'.encode("utf-16"),
]


@pytest.mark.parametrize("body", BODIES)
def test_loads_is_json_loads(body: str | bytes) -> None:
    assert loads(body) == json.loads(body)


@pytest.mark.parametrize(
    "body",
    [
        '{"a": 1} x',  # extra data after the value
        '{"a": 1}\x0b',  # whitespace to str.isspace, not to JSON
        '{"a": ',  # truncated
        "",
        "   ",
        "\ufeff{}",  # a BOM in a str
        "{'a': 1}",
    ],
)
def test_loads_raises_as_json_loads_does(body: str) -> None:
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(body)
    with pytest.raises(json.JSONDecodeError) as caught:
        loads(body)
    assert str(caught.value) == str(expected.value)


def test_each_call_decodes_a_new_object() -> None:
    body = '{"a": {"b": [1]}}'
    first, second = loads(body), loads(body)
    assert first == second and first is not second and first["a"] is not second["a"]
