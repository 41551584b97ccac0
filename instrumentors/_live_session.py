"""A Gemini Live session (``google-genai`` ``client.aio.live.connect``) as the chain sees it.

The protocol of :class:`~._realtime_session.Session` for the Live API
(``BidiGenerateContent`` over a WebSocket), used by :mod:`._realtime`:

- what makes the model generate: a ``client_content`` that completes the
  turn (``turn_complete``, the SDK's default), a ``tool_response`` (the model
  carries on), and ``realtime_input`` (audio, video or text the server's
  activity detection may end a turn on: armed, as a realtime session's audio
  with turn detection on). Each is admitted before it is sent;
- its worst case: input is the whole conversation so far (the setup's
  instructions and tools, every byte sent, every output token produced), at
  most the model's context window; output the setup's ``max_output_tokens``,
  else the model's limit (a Live turn has no cap of its own to write);
- what settles it: the latest ``usageMetadata`` when the model's turn ends
  (``turnComplete``, or a ``toolCall`` the client must answer), read as the
  turn's usage (``promptTokenCount`` plus ``toolUsePromptTokenCount`` in,
  ``responseTokenCount``, Vertex AI's ``candidatesTokenCount``, plus
  ``thoughtsTokenCount`` out), each modality at its own rate when the usage
  splits it (``promptTokensDetails``, ...); none seen: the reservation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from veronica_otel._call_spec import CallSpec
from veronica_otel._pricing import DEFAULT_MAX_OUTPUT_TOKENS, UnitPrices

from ._admit import input_bound
from ._common import ContainedCall, token_count
from ._modality_prices import modality_prices
from ._realtime_session import Session, _loads

__all__ = ["LiveSession"]

_REALTIME_INPUT = ('{"realtime_input"', '{"realtimeInput"')
_TURN_END = ('"turnComplete"', '"toolCall"', '"usageMetadata"')


def _get(mapping: Mapping[str, Any], snake: str, camel: str) -> Any:
    return mapping.get(snake, mapping.get(camel))


class LiveSession(Session):
    """A Live session: ``kind`` ``"gemini_live"``, billed to ``provider``."""

    def __init__(self, model: str, provider: str, setup: object, cap: int | None) -> None:
        super().__init__("gemini_live", model.removeprefix("models/"), beta=False)
        self.provider = provider
        self._sent = input_bound(setup, 1)  # instructions and tools: input of every turn
        self._session_cap = cap
        self._usage: Any = None  # the latest usageMetadata of the turn in progress

    def outgoing(self, message: object) -> tuple[CallSpec | None, dict[str, Any] | None]:
        self._sent += len(message) if isinstance(message, str | bytes) else 0
        if not isinstance(message, str | bytes):
            return None, None
        text = message if isinstance(message, str) else message.decode("utf-8", "replace")
        if text.startswith(_REALTIME_INPUT):  # the bulk (audio): no parse
            return self._arm()
        event = _loads(text)
        if event is None:
            return None, None
        content = _get(event, "client_content", "clientContent")
        if isinstance(content, Mapping):
            done = _get(content, "turn_complete", "turnComplete")
            return (self.server_spec(), event) if done else (None, None)
        if _get(event, "tool_response", "toolResponse") is not None:
            return self.server_spec(), event
        if _get(event, "realtime_input", "realtimeInput") is not None:
            return self._arm()
        return None, None

    def _arm(self) -> tuple[CallSpec | None, None]:
        return (None, None) if self._armed() else (self.server_spec(), None)

    def server_spec(self) -> CallSpec:
        parts = [self._sent, self._produced]  # a grown conversation is not a repeat
        return CallSpec(
            self.provider, "chat", self.model, 0, self._session_cap, False, input_parts=parts
        )

    def bound(self, spec: CallSpec, prices: UnitPrices | None) -> CallSpec:
        bound = input_bound(None, 1) + self._sent + self._produced
        if prices is not None and prices.context_window is not None:
            bound = min(bound, prices.context_window)
        cap = spec.requested_cap
        if cap is None:  # no cap to write into a Live turn: the model's own limit
            cap = prices.output_limit(bound) if prices is not None else DEFAULT_MAX_OUTPUT_TOKENS
        return spec._replace(input_bound=bound, requested_cap=cap)

    def rewrite(self, event: dict[str, Any], clamp: int | None, fallback: str | None) -> str:
        return json.dumps(event)  # the setup fixed the model and the cap

    def incoming(self, message: object) -> tuple[bool, object, list[ContainedCall]]:
        if not isinstance(message, str | bytes):
            return False, None, []
        text = message if isinstance(message, str) else message.decode("utf-8", "replace")
        started = self._started(text)
        if not any(marker in text for marker in _TURN_END):
            return started, True, []
        event = _loads(text)
        if event is None:
            return started, True, []
        usage = event.get("usageMetadata")
        if isinstance(usage, Mapping):
            self._usage = usage
        content = event.get("serverContent")
        ended = event.get("toolCall") is not None or (
            isinstance(content, Mapping) and content.get("turnComplete") is True
        )
        return started, True, self._turn_ended() if ended else []

    def _started(self, text: str) -> bool:
        """Mark the oldest call waiting as answered; True: no call was waiting
        (the server started a turn on its own: admit it now)."""
        if '"modelTurn"' not in text and '"toolCall"' not in text:
            return False
        with self.lock:
            for entry in self.pending:
                if entry[1] is None:
                    entry[1] = True
                    return False
            return not self.pending

    def _turn_ended(self) -> list[ContainedCall]:
        with self.lock:
            if not self.pending:
                return []
            call: ContainedCall = self.pending.pop(0)[0]
        usage, self._usage = self._usage, None
        if usage is not None:
            _read_live_usage(call, usage)
            if call.usage_seen:
                self._produced += call.output_tokens
        return [call]


def _read_live_usage(call: ContainedCall, usage: Mapping[str, Any]) -> None:
    response = usage.get("responseTokenCount", usage.get("candidatesTokenCount"))  # Vertex AI
    counts = [
        token_count(value or 0)
        for value in (
            usage.get("promptTokenCount"),
            usage.get("toolUsePromptTokenCount"),
            response,
            usage.get("thoughtsTokenCount"),
            usage.get("cachedContentTokenCount"),
        )
    ]
    if any(count is None for count in counts) or "promptTokenCount" not in usage:
        call.set_usage(None, None)  # unreadable: settled at the reservation
        return
    prompt, tools, output, thoughts, cached = (count or 0 for count in counts)
    split = modality_prices(
        call,
        call.provider,
        (_by_modality(usage, "promptTokensDetails", "toolUsePromptTokensDetails"), prompt + tools),
        (_by_modality(usage, "cacheTokensDetails"), cached),
        (
            _by_modality(usage, "responseTokensDetails", "candidatesTokensDetails", thoughts),
            output + thoughts,
        ),
    )
    if split is not None:
        call.prices = split  # each modality at its own rate (the reservation: the dearest)
    call.set_usage(prompt + tools, output + thoughts, cached=cached, reasoning=thoughts)


def _by_modality(usage: Mapping[str, Any], *keys: str | int) -> dict[str, int]:
    """Token counts by modality from ``[{"modality": "AUDIO", "tokenCount": n}]``
    details (summed over ``keys``; an int among them is thinking: text)."""
    counts: dict[str, int] = {}
    for key in keys:
        if isinstance(key, int):
            counts["text"] = counts.get("text", 0) + key
            continue
        for detail in usage.get(key) or ():
            if not isinstance(detail, Mapping):
                return {"unreadable": -1}
            modality = str(detail.get("modality", "")).lower()
            count = detail.get("tokenCount", 0)
            if type(count) is not int or count < 0:
                return {"unreadable": -1}
            counts[modality] = counts.get(modality, 0) + count
    return counts
