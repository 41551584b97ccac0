"""The OpenAI WebSocket APIs of the fake LLM server: realtime and Responses sessions.

A session answers each client event with the server events the ``openai``
SDK's ``realtime.connect()`` and ``responses.connect()`` read:

- ``/v1/realtime``: ``session.created`` on open; ``session.updated`` for a
  ``session.update``; for a ``response.create``: ``response.created``, one
  ``response.output_text.delta`` per output token, ``response.done`` with the
  realtime usage (input and output token details, text only). Input tokens
  are the settings' ``input_tokens``, else a quarter of the bytes the client
  sent so far (the conversation the model reads); output tokens the
  settings', capped by the response's (else the session's)
  ``max_output_tokens``. With turn detection on in the session, an
  ``input_audio_buffer.commit`` starts a response too (as server VAD does).
- ``/v1/responses``: each ``response.create`` is answered as a streamed
  ``POST /v1/responses`` with that body (``_openai_api``), event by event.

Every usage sent is billed (:attr:`FakeLLMServer.billed`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qs

from . import _openai_api
from ._common import ApiCall, ApiError, TokenSettings, Usage, read_cap, text_pieces

__all__ = ["SESSIONS", "Session"]

Bill = Callable[[str, Usage], None]


class Session:
    """One WebSocket session: the server events answering each client event."""

    def __init__(self, query: str, settings: TokenSettings, serial: int, bill: Bill) -> None:
        self.settings = settings
        self.serial = serial
        self.bill = bill
        self.model = (parse_qs(query).get("model") or [""])[0]
        self.received_bytes = 0  # what the client sent: the conversation, bounded
        self.responses = 0

    def opened(self) -> list[dict[str, Any]]:
        return []

    def answer(self, event: Mapping[str, Any], size: int) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _call(self, body: Mapping[str, Any], size: int) -> ApiCall:
        self.responses += 1
        serial = self.serial * 1000 + self.responses
        return ApiCall("", body, size, self.settings, serial, 0, self.bill)


class RealtimeSession(Session):
    """``/v1/realtime`` (GA event names)."""

    def __init__(self, query: str, settings: TokenSettings, serial: int, bill: Bill) -> None:
        super().__init__(query, settings, serial, bill)
        self.session: dict[str, Any] = {
            "id": f"sess_fake{serial}",
            "object": "realtime.session",
            "type": "realtime",
            "model": self.model,
            "output_modalities": ["text"],
            "max_output_tokens": "inf",
        }

    def opened(self) -> list[dict[str, Any]]:
        return [{"type": "session.created", "event_id": "event_0", "session": self.session}]

    def answer(self, event: Mapping[str, Any], size: int) -> list[dict[str, Any]]:
        self.received_bytes += size
        kind = event.get("type")
        if kind == "session.update" and isinstance(event.get("session"), Mapping):
            self.session.update(event["session"])
            return [{"type": "session.updated", "session": self.session}]
        if kind == "input_audio_buffer.commit" and self._detects_turns():
            return [{"type": "input_audio_buffer.committed"}, *self._respond({})]
        if kind != "response.create":
            return []
        options = event.get("response")
        return self._respond(options if isinstance(options, Mapping) else {})

    def _detects_turns(self) -> bool:
        """Turn detection on (``session.audio.input.turn_detection``, beta
        ``session.turn_detection``): a committed turn starts a response."""
        audio = self.session.get("audio")
        nested = audio.get("input") if isinstance(audio, Mapping) else None
        detection = nested.get("turn_detection") if isinstance(nested, Mapping) else None
        return bool(detection or self.session.get("turn_detection"))

    def _respond(self, options: Mapping[str, Any]) -> list[dict[str, Any]]:
        cap = _cap(options) if "max_output_tokens" in options else _cap(self.session)
        call = self._call({"model": self.model}, self.received_bytes)
        usage = call.plan_usage(cap)
        response_id = f"resp_fake{call.serial}"
        status = "incomplete" if usage.truncated else "completed"
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": _response(response_id, "in_progress")}
        ]
        where = {"response_id": response_id, "item_id": f"item_{call.serial}"}
        for piece in text_pieces(usage.text_tokens):
            events.append({"type": "response.output_text.delta", **where, "delta": piece})
        done = _response(response_id, status)
        done["usage"] = _realtime_usage(usage)
        events.append({"type": "response.done", "response": done})
        self.received_bytes += 4 * usage.output_tokens  # the reply joins the conversation
        return events


def _cap(options: Mapping[str, Any]) -> int | None:
    value = options.get("max_output_tokens")
    return None if value in (None, "inf") else read_cap(options, "max_output_tokens")


def _response(response_id: str, status: str) -> dict[str, Any]:
    return {"id": response_id, "object": "realtime.response", "status": status, "output": []}


def _realtime_usage(usage: Usage) -> dict[str, Any]:
    return {
        "total_tokens": usage.total_tokens,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "input_token_details": {
            "text_tokens": usage.input_tokens,
            "audio_tokens": 0,
            "cached_tokens": usage.cached_tokens,
        },
        "output_token_details": {"text_tokens": usage.output_tokens, "audio_tokens": 0},
    }


class ResponsesSession(Session):
    """``/v1/responses``: each ``response.create`` answered as a streamed Responses call."""

    def answer(self, event: Mapping[str, Any], size: int) -> list[dict[str, Any]]:
        if event.get("type") != "response.create":
            return []
        body = {key: value for key, value in event.items() if key != "type"}
        body["stream"] = True
        try:
            reply = _openai_api.ROUTES["/v1/responses"](self._call(body, size))
        except ApiError as exc:
            error = {"type": "invalid_request_error", "message": exc.message}
            return [{"type": "error", "error": error}]
        events = []
        for chunk in getattr(reply, "chunks", ()):
            for line in chunk.decode("utf-8").splitlines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
        return events


SESSIONS: Mapping[str, type[Session]] = {
    "/v1/realtime": RealtimeSession,
    "/v1/responses": ResponsesSession,
}
"""WebSocket routes (``GET`` with ``Upgrade: websocket``), by path."""
