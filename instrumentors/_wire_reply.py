"""LLM providers' HTTP replies, read from the wire: the usage they report.

:class:`ReplyReader` is fed a reply body's bytes as they pass (never holding
a stream back) and hands the usage to the call
(:meth:`~._common.ContainedCall.set_usage`) when the final report arrives:

- a JSON body, read whole at its end (up to :data:`MAX_JSON_BYTES`);
- ``text/event-stream`` (OpenAI, Anthropic, Gemini ``alt=sse``, Cohere v2):
  each ``data:`` event as it completes;
- JSON lines (Ollama's ``application/x-ndjson``, Cohere v1's stream);
- AWS event streams (``application/vnd.amazon.eventstream``: Bedrock's
  ``converse-stream`` and ``invoke-with-response-stream``).

Usage is found in any known format (:func:`usage_in`): OpenAI chat,
responses and embeddings (``usage``), Anthropic (``usage``, ``message.usage``
of ``message_start``, ``message_delta``), Gemini (``usageMetadata``), Bedrock
(``usage`` in camelCase, ``amazon-bedrock-invocationMetrics``, the
``x-amzn-bedrock-*-token-count`` headers), Cohere (``meta.billed_units``,
``usage.billed_units``) and Ollama (``prompt_eval_count`` / ``eval_count``).
A stream's reports are merged field by field (a later count replaces an
earlier one: Anthropic's input comes first, its output last), and applied
only once the report that ends the reply arrives: a stream cut before it
costs the reservation (DESIGN G10), never the partial count.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from ._common import ContainedCall

__all__ = ["MAX_JSON_BYTES", "ReplyReader", "usage_in"]

MAX_JSON_BYTES = 64 * 1024 * 1024  # a larger whole body is not read: the reservation
_MAX_LINE = 16 * 1024 * 1024  # one stream event; a longer one stops the reading
_FINAL_TYPES = frozenset(
    (
        "message_delta",  # Anthropic: after the last content block
        "response.completed",
        "response.incomplete",
        "response.failed",
        "message-end",  # Cohere v2
        "stream-end",  # Cohere v1
    )
)
# Merged usage fields: input (all of it, cache included), output (reasoning
# included), cached input, reasoning, cache writes; and Anthropic/Bedrock's
# input without the cache, added up at the end.
Usage = dict[str, Any]


def _holder(value: object) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


def _openai_like(usage: Mapping[str, Any]) -> Usage:
    """``usage`` of OpenAI (chat, responses, embeddings), Anthropic, Bedrock or Cohere v2."""
    found: Usage = {}
    billed = _holder(usage.get("billed_units"))
    if billed is not None:  # Cohere v2: what is billed, not the raw token counts
        found["input"] = billed.get("input_tokens", 0)
        found["output"] = billed.get("output_tokens", 0)
        return found
    if "prompt_tokens" in usage:  # chat completions, embeddings
        found["input"] = usage["prompt_tokens"]
        found["output"] = usage.get("completion_tokens", 0)
        details_in = _holder(usage.get("prompt_tokens_details"))
        details_out = _holder(usage.get("completion_tokens_details"))
    elif "inputTokens" in usage or "outputTokens" in usage:  # Bedrock Converse
        for key, name in (
            ("inputTokens", "raw_input"),
            ("outputTokens", "output"),
            ("cacheReadInputTokens", "cache_read"),
            ("cacheWriteInputTokens", "cache_write"),
        ):
            if key in usage:
                found[name] = usage[key]
        return found
    else:  # responses, Anthropic
        anthropic = any(key.startswith("cache_") for key in usage) or (
            "input_tokens_details" not in usage and "output_tokens_details" not in usage
        )
        for key, name in (
            ("input_tokens", "raw_input" if anthropic else "input"),
            ("output_tokens", "output"),
            ("cache_read_input_tokens", "cache_read"),
            ("cache_creation_input_tokens", "cache_write"),
        ):
            if key in usage:
                found[name] = usage[key]
        details_in = _holder(usage.get("input_tokens_details"))
        details_out = _holder(usage.get("output_tokens_details"))
    if details_in is not None and "cached_tokens" in details_in:
        found["cached"] = details_in["cached_tokens"]
    if details_out is not None and "reasoning_tokens" in details_out:
        found["reasoning"] = details_out["reasoning_tokens"]
    return found


def _gemini(meta: Mapping[str, Any]) -> Usage:
    thoughts = meta.get("thoughtsTokenCount", 0)
    candidates = meta.get("candidatesTokenCount", 0)
    prompt = meta.get("promptTokenCount", 0)
    tools = meta.get("toolUsePromptTokenCount", 0)
    found: Usage = {"cached": meta.get("cachedContentTokenCount", 0), "reasoning": thoughts}
    found["input"] = _add(prompt, tools)
    found["output"] = _add(candidates, thoughts)
    return found


def _add(a: object, b: object) -> object:
    """The sum of two counts, or a non-count (unreadable) when either is not one."""
    if type(a) in (int, float) and type(b) in (int, float):
        return a + b  # type: ignore[operator]
    return None


def usage_in(payload: object) -> tuple[Usage, bool] | None:
    """The usage one reply or stream event reports, and whether it is final.

    None when it reports none. A whole (non-stream) reply is final whatever
    this says; in a stream only the report that ends the reply is.
    """
    if not isinstance(payload, Mapping):
        return None
    kind = payload.get("type") or payload.get("event_type")
    final = kind in _FINAL_TYPES
    meta = _holder(payload.get("usageMetadata"))
    if meta is not None:  # Gemini: every chunk has it; the one with a finish reason ends
        candidates = payload.get("candidates")
        done = isinstance(candidates, list) and any(
            isinstance(c, Mapping) and c.get("finishReason") for c in candidates
        )
        return _gemini(meta), done
    if "prompt_eval_count" in payload or "eval_count" in payload:  # Ollama
        found = {
            "input": payload.get("prompt_eval_count", 0),
            "output": payload.get("eval_count", 0),
        }
        return found, payload.get("done") is True
    metrics = _holder(payload.get("amazon-bedrock-invocationMetrics"))
    if metrics is not None:
        found = {
            "input": metrics.get("inputTokenCount"),
            "output": metrics.get("outputTokenCount"),
        }
        return found, True
    for holder in (
        payload,
        _holder(payload.get("response")),  # responses' final events; Cohere v1 stream-end
        _holder(payload.get("message")),  # Anthropic's message_start
        _holder(payload.get("delta")),  # Cohere v2's message-end
    ):
        if holder is None:
            continue
        usage = _holder(holder.get("usage"))
        if usage is not None:
            # OpenAI's chat stream: the usage-only last chunk ends it; Bedrock
            # Converse's metadata event likewise.
            return _openai_like(usage), final or kind is None
        meta = _holder(holder.get("meta"))
        billed = _holder(meta.get("billed_units")) if meta is not None else None
        if billed is not None:  # Cohere v1
            found = {"input": billed.get("input_tokens", 0)}
            found["output"] = billed.get("output_tokens", 0)
            return found, final or kind is None
    return None


def _apply(call: ContainedCall, merged: Usage) -> None:
    """Hand the merged usage to the call (input counts the cache, as prices do)."""
    if "raw_input" in merged:  # Anthropic / Bedrock: input without the cache
        read, write = merged.get("cache_read", 0), merged.get("cache_write", 0)
        total = _add(_add(merged["raw_input"], read), write)
        call.set_usage(total, merged.get("output"), read, 0, write)
        return
    if "input" not in merged or "output" not in merged:
        call.set_usage(None, None)  # half a report: unreadable, the reservation
        return
    call.set_usage(
        merged["input"],
        merged["output"],
        merged.get("cached", 0),
        merged.get("reasoning", 0),
        merged.get("cache_write", 0),
    )


class ReplyReader:
    """Reads one reply body's usage as its bytes pass; see the module docs.

    Args:
        call: The admitted call the reply belongs to.
        content_type: The reply's ``content-type`` header.
        stream: Whether the request asked for a stream (a body of unknown type
            that is not one JSON document is then read as JSON lines).
        encoding: The reply's ``content-encoding``, for bytes fed raw
            (:meth:`feed_raw`): gzip and deflate are read; another one is
            not (the reservation).
    """

    def __init__(
        self, call: ContainedCall, content_type: str, stream: bool, encoding: str = ""
    ) -> None:
        self.call = call
        self.merged: Usage = {}
        self._buffer = bytearray()
        self._data: list[bytes] = []
        self.broken = False  # gave up reading: the call settles at its reservation
        self.ended = False
        self._encoding = encoding.strip().lower()
        self._inflate: Any = None
        kind = content_type.split(";", 1)[0].strip().lower()
        feed: Callable[[bytes], None]
        if kind == "text/event-stream":
            feed = self._sse
        elif kind == "application/vnd.amazon.eventstream":
            feed = self._eventstream
        elif kind.endswith(("ndjson", "jsonl", "stream+json")):
            feed = self._lines
        else:
            feed = self._whole
        self.feed = feed
        self._lines_at_end = stream and feed == self._whole
        # A stream is cut at its next chunk when the chain trips; a whole
        # reply, already generated and billed, is delivered.
        self.streaming = stream or feed != self._whole

    def feed_raw(self, chunk: bytes) -> None:
        """Feed bytes as they came over the wire (still content-encoded)."""
        encoding = self._encoding
        if not encoding or encoding == "identity":
            self.feed(chunk)
            return
        inflate = self._inflate
        if inflate is None:
            if encoding in ("gzip", "x-gzip"):
                inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
            elif encoding == "deflate":
                inflate = zlib.decompressobj()
            else:  # br, zstd, several: not read here
                self._give_up()
                return
            self._inflate = inflate
        try:
            plain = inflate.decompress(chunk, MAX_JSON_BYTES)
        except zlib.error:
            self._give_up()
            return
        if inflate.unconsumed_tail:  # more than a whole body's worth from one chunk
            self._give_up()
            return
        self.feed(plain)

    def headers(self, get: Callable[[str], Any]) -> None:
        """Read usage a reply carries in its headers (Bedrock ``InvokeModel``)."""
        inp = get("x-amzn-bedrock-input-token-count")
        out = get("x-amzn-bedrock-output-token-count")
        if inp is not None and out is not None:
            try:
                self._report({"input": int(inp), "output": int(out)}, True)
            except ValueError:
                self.call.set_usage(None, None)

    def end(self) -> None:
        """The body ended or was closed: read what was held back (once).

        Safe on a body closed half-way: a cut JSON document does not parse,
        and a cut stream's last event is not its final report.
        """
        if self.broken or self.ended:
            return
        self.ended = True
        if self.feed == self._whole:
            self._end_whole()
        elif self.feed == self._sse:
            self._buffer.extend(b"\n\n")  # an event not closed by a blank line
            self._sse(b"")
        elif self.feed == self._lines and self._buffer:
            self._event(bytes(self._buffer))
            self._buffer.clear()

    # -- events ----------------------------------------------------------------

    def _event(self, raw: bytes) -> None:
        if not raw or raw == b"[DONE]":
            return
        try:
            payload = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return  # not JSON: a keep-alive or a comment; usage never comes in one
        found = usage_in(payload)
        if found is not None:
            self._report(found[0], found[1])

    def _report(self, usage: Usage, final: bool) -> None:
        self.merged.update(usage)
        if final:
            _apply(self.call, self.merged)

    def _give_up(self) -> None:
        self.broken = True
        self._buffer = bytearray()
        self._data = []

    # -- framings --------------------------------------------------------------

    def _whole(self, chunk: bytes) -> None:
        if self.broken:
            return
        self._buffer.extend(chunk)
        if len(self._buffer) > MAX_JSON_BYTES:
            self._give_up()

    def _end_whole(self) -> None:
        raw = bytes(self._buffer)
        self._buffer = bytearray()
        try:
            payload = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            if self._lines_at_end:
                for line in raw.splitlines():
                    self._event(line.strip())
            return
        found = usage_in(payload)
        if found is not None:
            self._report(found[0], True)

    def _sse(self, chunk: bytes) -> None:
        if self.broken:
            return
        buffer = self._buffer
        buffer.extend(chunk)
        while True:
            end = buffer.find(b"\n")
            if end < 0:
                if len(buffer) > _MAX_LINE:
                    self._give_up()
                return
            line = bytes(buffer[:end]).rstrip(b"\r")
            del buffer[: end + 1]
            if not line:
                if self._data:
                    data, self._data = b"\n".join(self._data), []
                    self._event(data)
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)

    def _lines(self, chunk: bytes) -> None:
        if self.broken:
            return
        buffer = self._buffer
        buffer.extend(chunk)
        while True:
            end = buffer.find(b"\n")
            if end < 0:
                if len(buffer) > _MAX_LINE:
                    self._give_up()
                return
            line = bytes(buffer[:end]).strip()
            del buffer[: end + 1]
            self._event(line)

    def _eventstream(self, chunk: bytes) -> None:
        """AWS event-stream framing: total length, headers length, prelude CRC,
        headers, payload, message CRC (CRCs are the transport's business)."""
        if self.broken:
            return
        buffer = self._buffer
        buffer.extend(chunk)
        while len(buffer) >= 12:
            total, headers = struct.unpack_from(">II", buffer)
            if total < 16 + headers or total > _MAX_LINE:
                self._give_up()
                return
            if len(buffer) < total:
                return
            payload = bytes(buffer[12 + headers : total - 4])
            del buffer[:total]
            self._aws_event(payload)

    def _aws_event(self, payload: bytes) -> None:
        try:
            event = json.loads(payload)
        except (ValueError, UnicodeDecodeError):
            return
        if isinstance(event, Mapping) and isinstance(event.get("bytes"), str):
            try:  # invoke-with-response-stream: the model's own JSON, base64
                inner = base64.b64decode(event["bytes"], validate=True)
            except ValueError:
                return
            self._event(inner)
            return
        self._event(payload)
