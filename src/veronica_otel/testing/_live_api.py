"""Gemini Live (``BidiGenerateContent`` over a WebSocket) for the fake LLM server.

Enough of the protocol for ``google-genai``'s ``client.aio.live.connect``:
``setupComplete`` for the ``setup`` message; for a ``client_content`` that
completes the turn (or a ``tool_response``), one ``serverContent.modelTurn``
text part per output token, then ``turnComplete`` with the turn's
``usageMetadata`` (output as ``responseTokenCount``; Vertex AI's as
``candidatesTokenCount``). Input tokens are the settings' ``input_tokens``, else a
quarter of the bytes the client sent so far; output tokens the settings',
capped by the setup's ``generationConfig.maxOutputTokens``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._common import text_pieces
from ._realtime_api import Session

__all__ = ["SESSIONS"]


def _get(mapping: Mapping[str, Any], snake: str, camel: str) -> Any:
    return mapping.get(snake, mapping.get(camel))


class LiveSession(Session):
    """One Live session."""

    cap: int | None = None
    output_key = "responseTokenCount"  # Vertex AI says candidatesTokenCount

    def answer(self, event: Mapping[str, Any], size: int) -> list[dict[str, Any]]:
        self.received_bytes += size
        setup = event.get("setup")
        if isinstance(setup, Mapping):
            self.model = str(setup.get("model", "")).rpartition("/")[2]
            config = _get(setup, "generation_config", "generationConfig")
            if isinstance(config, Mapping):
                cap = _get(config, "max_output_tokens", "maxOutputTokens")
                self.cap = cap if type(cap) is int else None
            return [{"setupComplete": {}}]
        content = _get(event, "client_content", "clientContent")
        turn = isinstance(content, Mapping) and _get(content, "turn_complete", "turnComplete")
        if not turn and _get(event, "tool_response", "toolResponse") is None:
            return []
        usage = self._call({"model": self.model}, self.received_bytes).plan_usage(self.cap)
        events: list[dict[str, Any]] = [
            {"serverContent": {"modelTurn": {"role": "model", "parts": [{"text": piece}]}}}
            for piece in text_pieces(usage.text_tokens)
        ]
        events.append(
            {
                "serverContent": {"turnComplete": True},
                "usageMetadata": {
                    "promptTokenCount": usage.input_tokens,
                    self.output_key: usage.output_tokens,
                    "totalTokenCount": usage.total_tokens,
                },
            }
        )
        self.received_bytes += 4 * usage.output_tokens  # the reply joins the conversation
        return events


class VertexLiveSession(LiveSession):
    output_key = "candidatesTokenCount"


SESSIONS: Mapping[str, type[Session]] = {
    f"/ws/google.{service}.{version}.{method}": kind
    for version in ("v1alpha", "v1beta", "v1beta1", "v1")
    for service, method, kind in (
        ("ai.generativelanguage", "GenerativeService.BidiGenerateContent", LiveSession),
        ("cloud.aiplatform", "LlmBidiService/BidiGenerateContent", VertexLiveSession),
    )
}
"""Live WebSocket routes, by path."""
