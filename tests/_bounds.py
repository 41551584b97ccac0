"""The documented input-token bound, written plainly, for tests to compare against."""

from __future__ import annotations

from veronica_otel._pricing import TOKENS_PER_MESSAGE, TOKENS_PER_REQUEST


def text_bytes(value: object) -> int:
    """UTF-8 bytes of every string, 2 per dict entry, 1 per list item, ``str()`` of scalars."""
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, dict):
        return sum(text_bytes(k) + text_bytes(v) + 2 for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(text_bytes(v) + 1 for v in value)
    return len(str(value))


def input_bound(parts: object, n_messages: int) -> int:
    """The documented input bound: those bytes plus per-message and per-request framing."""
    return text_bytes(parts) + TOKENS_PER_MESSAGE * n_messages + TOKENS_PER_REQUEST
