"""Pieces shared by the OpenAI and Anthropic response builders.

The builders are pure functions: they get an :class:`ApiCall` (the parsed
request plus the server's token settings) and return a :class:`JSONReply` or a
:class:`StreamReply`. The HTTP server in ``_server.py`` does the I/O.

Token accounting is deterministic so tests can assert exact numbers:

* input tokens: the configured number, else ``ceil(len(request body bytes) / 4)``;
* output tokens: the configured number, never more than the request's cap
  (``max_tokens`` and friends); when the cap cuts it, the reply says so
  (``finish_reason="length"``, ``stop_reason="max_tokens"``, ``incomplete``);
* reasoning and cached tokens are parts of the output and input totals
  respectively, clipped to them;
* the visible text is one word per non-reasoning output token:
  ``"tok0 tok1 tok2 ..."``, streamed one word per chunk.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._schema import dummy_from_schema

__all__ = [
    "ApiCall",
    "ApiError",
    "JSONReply",
    "ScriptedReply",
    "ScriptedToolCall",
    "StreamReply",
    "TokenSettings",
    "Usage",
    "dumps",
    "plan_usage",
    "read_cap",
    "script_pieces",
    "sse",
    "text_pieces",
]


@dataclass(frozen=True)
class TokenSettings:
    """Token numbers a server reports; see the module docstring."""

    input_tokens: int | None = None
    output_tokens: int = 20
    reasoning_tokens: int = 0
    cached_tokens: int = 0


@dataclass(frozen=True)
class Usage:
    """The token usage of one reply."""

    input_tokens: int
    output_tokens: int
    reasoning_tokens: int
    cached_tokens: int
    truncated: bool

    @property
    def text_tokens(self) -> int:
        """Output tokens that become visible text (output minus reasoning)."""
        return self.output_tokens - self.reasoning_tokens

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class ScriptedToolCall:
    """One function call a scripted chat reply asks the client to make.

    Attributes:
        name: The function (tool) name.
        arguments: Its arguments; sent JSON-encoded, as the real API does.
        id: The call id; ``None`` gives ``call_fake{request}_{index}``.
    """

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"tool call name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.arguments, Mapping):
            raise ValueError(f"tool call arguments must be a mapping, got {self.arguments!r}")
        try:
            dumps(dict(self.arguments))  # fail now, not on the handler thread
        except (TypeError, ValueError) as exc:
            raise ValueError(f"tool call arguments must be JSON-encodable: {exc}") from None


@dataclass(frozen=True)
class ScriptedReply:
    """What one chat completion answers instead of the generated ``tok0 tok1 ...``.

    Usage is reported as for any reply (see the module docstring); with tool
    calls the ``finish_reason`` is ``"tool_calls"``.

    Attributes:
        text: The assistant's text; ``None`` is no text with tool calls, and
            the generated text without.
        tool_calls: Function calls the reply asks for, in order.
    """

    text: str | None = None
    tool_calls: Sequence[ScriptedToolCall] = ()

    def __post_init__(self) -> None:
        if self.text is not None and not isinstance(self.text, str):
            raise ValueError(f"text must be a str or None, got {self.text!r}")
        calls = tuple(self.tool_calls)
        if not all(isinstance(c, ScriptedToolCall) for c in calls):
            raise ValueError("tool_calls must be ScriptedToolCall instances")
        object.__setattr__(self, "tool_calls", calls)

    @classmethod
    def tool_call(
        cls, name: str, arguments: Mapping[str, Any] | None = None, *, id: str | None = None
    ) -> ScriptedReply:
        """A reply that asks for one call of tool ``name`` with ``arguments``."""
        return cls(tool_calls=(ScriptedToolCall(name, arguments or {}, id),))


def script_pieces(text: str) -> list[str]:
    """A scripted text cut into streamed pieces, one word (with its leading space) each."""
    return re.findall(r"\s*\S+|\s+$", text)


@dataclass(frozen=True)
class ApiCall:
    """One parsed API request, as the builders see it."""

    path: str
    body: Mapping[str, Any]
    body_size: int
    settings: TokenSettings
    serial: int
    created: int
    bill: Callable[[str, Usage], None] | None = None
    script: ScriptedReply | None = None

    def plan_usage(self, cap: int | None) -> Usage:
        """The usage of this reply; recorded as billed to the model named in the body."""
        usage = plan_usage(self.settings, self.body_size, cap)
        if self.bill is not None:
            self.bill(str(self.body.get("model", "")), usage)
        return usage


@dataclass(frozen=True)
class JSONReply:
    """A complete JSON response."""

    payload: Any
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StreamReply:
    """A streamed response, one encoded chunk per item (server-sent events by default)."""

    chunks: Sequence[bytes]
    status: int = 200
    content_type: str = "text/event-stream; charset=utf-8"


class ApiError(Exception):
    """A request the fake API rejects with a 4xx status (bad or missing fields)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def dumps(payload: Any) -> bytes:
    """Encode ``payload`` as compact UTF-8 JSON."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sse(data: Any, event: str | None = None) -> bytes:
    """Encode one server-sent event (``data`` is JSON-encoded unless it is a str)."""
    text = data if isinstance(data, str) else dumps(data).decode("utf-8")
    head = f"event: {event}\n" if event is not None else ""
    return f"{head}data: {text}\n\n".encode()


def read_cap(body: Mapping[str, Any], *keys: str) -> int | None:
    """Return the first output-token cap found under ``keys``, or ``None``.

    Raises:
        ApiError: the cap is present but is not a non-negative integer.
    """
    for key in keys:
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ApiError(400, f"'{key}' must be a non-negative integer, got {value!r}")
        return value
    return None


def plan_usage(settings: TokenSettings, body_size: int, cap: int | None) -> Usage:
    """Work out the usage of one reply from the settings, body size and cap."""
    if settings.input_tokens is None:
        input_tokens = math.ceil(body_size / 4)
    else:
        input_tokens = settings.input_tokens
    output_tokens = settings.output_tokens
    truncated = cap is not None and cap < output_tokens
    if cap is not None:
        output_tokens = min(output_tokens, cap)
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        reasoning_tokens=min(settings.reasoning_tokens, output_tokens),
        cached_tokens=min(settings.cached_tokens, input_tokens),
        truncated=truncated,
    )


def text_pieces(count: int, schema: Mapping[str, Any] | None = None) -> list[str]:
    """Return the streamed pieces of a reply's text, ``count`` of them at most.

    Plain text is ``"tok0 tok1 ..."``, one word per piece. With a JSON schema
    the text is a JSON document matching it (see ``_schema.dummy_from_schema``),
    cut into up to ``count`` pieces.
    """
    if count <= 0:
        return []
    if schema is None:
        return [f"tok{i}" if i == 0 else f" tok{i}" for i in range(count)]
    text = json.dumps(dummy_from_schema(schema), separators=(",", ":"))
    parts = min(count, len(text))
    step = math.ceil(len(text) / parts)
    return [text[i : i + step] for i in range(0, len(text), step)]
