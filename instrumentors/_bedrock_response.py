"""How a Bedrock reply reads: usage, text, finish reasons (``bedrock.py`` hooks it).

Bedrock reports input tokens *without* the prompt-cache reads and writes
(``cacheReadInputTokens``, ``cacheWriteInputTokens`` and their header and
metrics twins): the prompt total priced here is their sum.

- Converse: ``usage``; ConverseStream: the final ``metadata`` event.
- InvokeModel: the ``X-Amzn-Bedrock-Input-Token-Count`` /
  ``-Output-Token-Count`` headers (every family has them, botocore exposes
  them in ``ResponseMetadata.HTTPHeaders``); without them, the family's body.
- InvokeModelWithResponseStream: ``amazon-bedrock-invocationMetrics`` in the
  final chunk.

A stream that ends or is cut before its usage costs the reservation.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Mapping
from typing import Any

from veronica_otel._attributes import GEN_AI_RESPONSE_FINISH_REASONS, GEN_AI_RESPONSE_ID
from veronica_otel._units import MAX_COUNT

from ._common import ContainedCall, attribute_value

__all__ = [
    "AsyncEvents",
    "Events",
    "converse_item",
    "converse_reply",
    "invoke_item",
    "invoke_reply",
    "status_of",
]

_HEADERS = (
    "x-amzn-bedrock-input-token-count",
    "x-amzn-bedrock-output-token-count",
    "x-amzn-bedrock-cache-read-input-token-count",
    "x-amzn-bedrock-cache-write-input-token-count",
)


def status_of(error: BaseException) -> int | None:
    """The HTTP status of a botocore ``ClientError`` (None: no HTTP reply)."""
    response = getattr(error, "response", None)
    if not isinstance(response, Mapping):
        return None
    metadata = response.get("ResponseMetadata")
    status = metadata.get("HTTPStatusCode") if isinstance(metadata, Mapping) else None
    return status if type(status) is int and 100 <= status <= 599 else None


def _set(call: ContainedCall, inp: object, out: object, read: object, write: object) -> None:
    """Usage with Bedrock's input excluding its cache reads and writes."""
    read = read or 0
    write = write or 0
    if type(inp) is int and type(read) is int and type(write) is int:
        call.set_usage(inp + read + write, out, read, 0, write)
    else:
        call.set_usage(inp, out, read, 0, write)  # unreadable: the reservation


def _finish_reason(call: ContainedCall, reason: object) -> None:
    attributes = call.pending_attributes
    if attributes is not None and type(reason) is str:
        attributes[GEN_AI_RESPONSE_FINISH_REASONS] = [reason]


def _request_id(call: ContainedCall, reply: Mapping[str, Any]) -> None:
    attributes = call.pending_attributes
    metadata = reply.get("ResponseMetadata")
    if attributes is not None and isinstance(metadata, Mapping):
        value = attribute_value(metadata.get("RequestId"))
        if value is not None:
            attributes["aws.request_id"] = value


# -- Converse -----------------------------------------------------------------------


def _converse_usage(call: ContainedCall, usage: object) -> None:
    if type(usage) is dict or isinstance(usage, Mapping):
        _set(
            call,
            usage.get("inputTokens"),
            usage.get("outputTokens"),
            usage.get("cacheReadInputTokens"),
            usage.get("cacheWriteInputTokens"),
        )


def converse_reply(call: ContainedCall, reply: Any) -> None:
    try:  # the plain reply: usage of input and output tokens alone (no cache reads or writes)
        usage = reply["usage"]
        inp, out = usage["inputTokens"], usage["outputTokens"]
        plain = not usage.get("cacheReadInputTokens") and not usage.get("cacheWriteInputTokens")
    except (KeyError, TypeError, AttributeError):  # not there, not a mapping
        plain = False
    # Two plain counts, each in set_usage's range (their sum within it: stricter;
    # a negative one makes ``inp | out`` negative): set as ContainedCall.set_usage
    # sets them (its rule, copied; _set's sum is the input itself); anything
    # else, the general rules below.
    if (
        plain
        and type(inp) is int is type(out)
        and (inp | out) >= 0
        and inp + out <= MAX_COUNT
        and type(call) is ContainedCall
    ):
        call.cached_tokens = call.cache_write_tokens = call.reasoning_tokens = 0
        call.input_tokens, call.output_tokens, call.usage_seen = inp, out, True
    elif type(reply) is dict or isinstance(reply, Mapping):
        usage = reply.get("usage")
        if (
            type(usage) is dict
            and not usage.get("cacheReadInputTokens")
            and not usage.get("cacheWriteInputTokens")
        ):  # no cache reads or writes: _set's sum is the input itself
            call.set_usage(usage.get("inputTokens"), usage.get("outputTokens"))
        else:
            _converse_usage(call, usage)
    else:
        return
    if call.pending_attributes is not None:
        _finish_reason(call, reply.get("stopReason"))
        _request_id(call, reply)


def converse_item(call: ContainedCall, event: Any) -> None:
    """One ConverseStream event: text deltas, the stop reason, the final usage."""
    if not isinstance(event, Mapping):
        return
    delta = event.get("contentBlockDelta")
    if delta is not None:
        text = delta.get("delta", {}).get("text") if isinstance(delta, Mapping) else None
        if type(text) is str:
            call.add_text(text)
        return
    metadata = event.get("metadata")
    if isinstance(metadata, Mapping):
        _converse_usage(call, metadata.get("usage"))
        return
    stop = event.get("messageStop")
    if isinstance(stop, Mapping):
        _finish_reason(call, stop.get("stopReason"))


# -- InvokeModel ------------------------------------------------------------------------


def invoke_reply(call: ContainedCall, reply: Any) -> None:
    """Usage from the token-count headers; the body only without them (or for attributes)."""
    if not isinstance(reply, Mapping):
        return
    metadata = reply.get("ResponseMetadata")
    headers = metadata.get("HTTPHeaders") if isinstance(metadata, Mapping) else None
    if isinstance(headers, Mapping) and _HEADERS[0] in headers and _HEADERS[1] in headers:
        inp, out, read, write = (_int(headers.get(name)) for name in _HEADERS)
        _set(call, inp, out, read, write)
        if call.pending_attributes is None:
            return
    body = _read_body(reply)
    if body is None:
        return
    if not call.usage_seen:
        _body_usage(call, body)
    if call.pending_attributes is not None:
        _request_id(call, reply)
        _finish_reason(call, _body_finish(body))
        response_id = attribute_value(body.get("id"))
        if response_id is not None:
            call.pending_attributes[GEN_AI_RESPONSE_ID] = response_id


def _int(value: object) -> int | None:
    """A header's count (absent: 0; not a count: None, the usage unreadable)."""
    if value is None:
        return 0
    try:
        return int(str(value))
    except ValueError:
        return None


def _read_body(reply: Any) -> dict[str, Any] | None:
    """The JSON body of a sync reply, read once and put back as a fresh stream."""
    stream = reply.get("body")
    read = getattr(stream, "read", None)
    if read is None or not callable(read) or hasattr(stream, "__aenter__"):
        return None  # an async body is not read here
    from botocore.response import StreamingBody  # type: ignore[import-untyped]

    data = read()
    reply["body"] = StreamingBody(io.BytesIO(data), len(data))
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) else None


def _body_usage(call: ContainedCall, body: Mapping[str, Any]) -> None:
    usage = body.get("usage")
    if isinstance(usage, Mapping):
        if "input_tokens" in usage:  # anthropic
            _set(
                call,
                usage.get("input_tokens"),
                usage.get("output_tokens"),
                usage.get("cache_read_input_tokens"),
                usage.get("cache_creation_input_tokens"),
            )
        else:  # nova
            _set(
                call,
                usage.get("inputTokens"),
                usage.get("outputTokens"),
                usage.get("cacheReadInputTokenCount"),
                usage.get("cacheWriteInputTokenCount"),
            )
    elif "prompt_token_count" in body:  # llama
        call.set_usage(body.get("prompt_token_count"), body.get("generation_token_count"))
    elif "inputTextTokenCount" in body:  # titan (text and embeddings)
        results = body.get("results")
        out: object = 0
        if isinstance(results, list):
            counts = [r.get("tokenCount") for r in results if isinstance(r, Mapping)]
            ints = [c for c in counts if type(c) is int]
            out = sum(ints) if len(ints) == len(counts) else None
        call.set_usage(body.get("inputTextTokenCount"), out)


def _body_finish(body: Mapping[str, Any]) -> object:
    for key in ("stop_reason", "stopReason"):
        if key in body:
            return body[key]
    results = body.get("results")
    if isinstance(results, list) and results and isinstance(results[0], Mapping):
        return results[0].get("completionReason")
    return None


def invoke_item(call: ContainedCall, event: Any) -> None:
    """One InvokeModelWithResponseStream event: a model chunk, its text, the final metrics."""
    chunk = event.get("chunk") if isinstance(event, Mapping) else None
    raw = chunk.get("bytes") if isinstance(chunk, Mapping) else None
    if not isinstance(raw, (bytes, bytearray)):
        return
    try:
        payload = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return
    if not isinstance(payload, dict):
        return
    text = _chunk_text(payload)
    if type(text) is str and text:
        call.add_text(text)
    metrics = payload.get("amazon-bedrock-invocationMetrics")
    if isinstance(metrics, Mapping):
        _set(
            call,
            metrics.get("inputTokenCount"),
            metrics.get("outputTokenCount"),
            metrics.get("cacheReadInputTokenCount"),
            metrics.get("cacheWriteInputTokenCount"),
        )
    if call.pending_attributes is not None:
        reason = _body_finish(payload)
        if reason is None and isinstance(payload.get("delta"), Mapping):
            reason = payload["delta"].get("stop_reason")  # anthropic message_delta
        if reason is None and isinstance(payload.get("messageStop"), Mapping):
            reason = payload["messageStop"].get("stopReason")  # nova
        _finish_reason(call, reason)


def _chunk_text(payload: Mapping[str, Any]) -> object:
    delta = payload.get("delta")
    if isinstance(delta, Mapping):  # anthropic content_block_delta
        return delta.get("text")
    block = payload.get("contentBlockDelta")
    if isinstance(block, Mapping):  # nova
        inner = block.get("delta")
        return inner.get("text") if isinstance(inner, Mapping) else None
    for key in ("generation", "outputText", "completion"):  # llama, titan, others
        if key in payload:
            return payload[key]
    outputs = payload.get("outputs")  # mistral
    if isinstance(outputs, list) and outputs and isinstance(outputs[0], Mapping):
        return outputs[0].get("text")
    return None


# -- botocore event streams as iterators ---------------------------------------------------


class Events:
    """A botocore ``EventStream`` as an iterator (it is only iterable), closable."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self._events: Iterator[Any] = iter(stream)

    def __next__(self) -> Any:
        return next(self._events)

    def close(self) -> None:
        self.stream.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


class AsyncEvents:
    """An aiobotocore ``AioEventStream`` as an async iterator, closable."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self._events: Any = stream.__aiter__()

    async def __anext__(self) -> Any:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        try:
            await self._events.aclose()
        finally:
            close = self.stream.close()
            if hasattr(close, "__await__"):
                await close

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)
