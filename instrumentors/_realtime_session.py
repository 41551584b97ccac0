"""One ``openai`` WebSocket session as the chain sees it: what generates, what it costs.

The protocol half of :mod:`._realtime` (which hooks the SDK): it reads the
client events sent and the server events received, and says which send is
a call to admit, how its worst case is bounded, and which server event
settles which call. No I/O and no admission here.

Sessions by path (``_prepare_url`` of the SDK's connection manager):

- ``/realtime`` (``realtime.connect``, ``beta.realtime.connect``): a
  ``response.create`` makes the model generate over the whole conversation
  so far. Its input bound is every byte the client sent on the session plus
  every output token the session produced (both join the conversation), at
  most the model's context window; its output cap the response's
  ``max_output_tokens`` (beta: ``max_response_output_tokens``), else the
  session's, else the clamp (written into the event), at most
  :data:`REALTIME_MAX_OUTPUT` (the API's limit). ``response.done`` carries
  the usage. With turn detection on, the server starts responses on its
  own from the audio: while one may start, a call is kept admitted (armed
  before the audio that may end the turn is sent) for the next
  ``response.created``; one armed and never started is released at a clean
  close. A response no call of ours was waiting for is admitted when its
  ``response.created`` arrives.
- ``/responses`` (``responses.connect``, ``beta.responses.connect``): a
  ``response.create`` is a Responses request; its input bound is its own
  bytes, plus the model's context window when it continues server-side
  context (``previous_response_id``, ``conversation``). ``response.completed``
  / ``incomplete`` / ``failed`` carry the usage.
- any other path (``realtime.translations``, ``live``): not priced; the
  session is one call, refused under a cost ceiling, a step otherwise.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping
from typing import Any

from veronica_otel._call_spec import CallSpec
from veronica_otel._pricing import UnitPrices

from ._admit import input_bound
from ._common import ContainedCall, get_field
from ._modality_prices import modality_prices

__all__ = ["REALTIME_MAX_OUTPUT", "Session", "session_kind"]

PROVIDER = "openai"
#: The most output tokens one realtime response may produce (``max_output_tokens``: 1-4096).
REALTIME_MAX_OUTPUT = 4096
_REALTIME, _RESPONSES = "realtime", "responses"
_SESSION_EVENTS = frozenset(("session.created", "session.updated"))
_SETTLING = {
    _REALTIME: frozenset(("response.done",)),
    _RESPONSES: frozenset(("response.completed", "response.incomplete", "response.failed")),
}


def session_kind(path: str) -> str | None:
    """The protocol of a session at ``path``; None: one we cannot price."""
    path = path.rstrip("/")
    if path.endswith("/realtime"):
        return _REALTIME
    if path.endswith("/responses"):
        return _RESPONSES
    return None


_TYPE = re.compile(
    r'^\{\s*(?:"event_id"\s*:\s*"[^"\\{]{0,64}"\s*,\s*)?"type"\s*:\s*"([a-z_.]{1,64})"'
)
_TYPE_BYTES = re.compile(_TYPE.pattern.encode())


def _fast_type(message: str | bytes) -> str | None:
    """The event's type when its opening says it (``{"type": ...`` or
    ``{"event_id": ..., "type": ...``: top level, nothing nested before it);
    None otherwise (then the message is scanned, and parsed if it may matter)."""
    if isinstance(message, str):
        found = _TYPE.match(message, 0, 160)
        return found.group(1) if found else None
    found_bytes = _TYPE_BYTES.match(message, 0, 160)
    return found_bytes.group(1).decode() if found_bytes else None


def _loads(message: object) -> dict[str, Any] | None:
    try:
        event = json.loads(message)  # type: ignore[arg-type]
    except (TypeError, ValueError, RecursionError):
        return None
    return event if isinstance(event, dict) else None


def _cap(value: object) -> int | None:
    return value if type(value) is int and value >= 0 else None


class Session:
    """The chain's view of one session (kept across the SDK's reconnects).

    Attributes:
        kind: ``"realtime"``, ``"responses"``, or None (unpriced: one call).
        pending: Calls admitted and not settled, oldest first, each with the
            response id the server gave it (None until ``response.created``).
    """

    provider = PROVIDER

    def __init__(self, kind: str | None, model: str, beta: bool) -> None:
        self.kind = kind
        self.model = model or "unknown"
        self._cap_key = "max_response_output_tokens" if beta else "max_output_tokens"
        self._session_cap: int | None = None
        self._sent = 0  # bytes the client sent on the session
        self._produced = 0  # output tokens of settled responses (they join the conversation)
        self.pending: list[list[Any]] = []  # [call, response id, armed]
        self._turns = False  # turn detection: the server may start a response from audio
        self.lock = threading.Lock()  # a reader thread and senders share the pending list

    # -- what the client sends --------------------------------------------------

    def outgoing(self, message: object) -> tuple[CallSpec | None, dict[str, Any] | None]:
        """Note a client message; the call it makes (and its event), if it generates."""
        size = len(message) if isinstance(message, str | bytes) else 0
        self._sent += size
        if self.kind is None or not isinstance(message, str | bytes):
            return None, None
        if _fast_type(message) == "input_audio_buffer.append":  # the bulk: no scan, no parse
            return self._arm()
        text = message if isinstance(message, str) else message.decode("utf-8", "replace")
        # Only these are parsed; an escaped name (\u002e) is parsed too.
        if "response.create" not in text and "session.update" not in text and "\\u" not in text:
            return self._arm() if "input_audio_buffer." in text else (None, None)
        event = _loads(text)
        kind = event.get("type") if event is not None else None
        if event is None or not isinstance(kind, str):
            return None, None
        if kind == "response.create":
            return self._spec(event), event
        if kind == "session.update" and self.kind == _REALTIME:
            self._note_session(event.get("session"))
        elif kind.startswith("input_audio_buffer."):
            return self._arm()
        return None, None

    def _arm(self) -> tuple[CallSpec | None, None]:
        """Audio may end a turn, and with turn detection on the server then starts
        a response on its own: one is admitted before the audio leaves (armed)."""
        if self._turns and self.kind == _REALTIME and not self._armed():
            return self.server_spec(), None
        return None, None

    def _spec(self, event: dict[str, Any]) -> CallSpec:
        if self.kind == _REALTIME:
            options = event.get("response")
            options = options if isinstance(options, Mapping) else {}
            cap = _cap(options.get(self._cap_key))
            if cap is None:
                cap = self._session_cap
            # Signed with the conversation's size: the same event on a grown
            # conversation is not a repeat.
            parts = [event, self._sent, self._produced]
            return CallSpec(PROVIDER, "realtime", self.model, 0, cap, True, input_parts=parts)
        model = event.get("model")
        model = model if isinstance(model, str) and model else self.model
        cap = _cap(event.get("max_output_tokens"))
        return CallSpec(PROVIDER, "chat", model, 0, cap, True, input_parts=event)

    def bound(self, spec: CallSpec, prices: UnitPrices | None) -> CallSpec:
        """``spec`` with its input bound (the model's context window caps it)."""
        window = prices.context_window if prices is not None else None
        if self.kind == _REALTIME:
            bound = input_bound(None, 1) + self._sent + self._produced
        else:
            event = spec.input_parts
            bound = input_bound(event, 1)
            if isinstance(event, Mapping) and (
                event.get("previous_response_id") or event.get("conversation")
            ):
                bound += window if window is not None else self._sent + self._produced
        if window is not None and self.kind == _REALTIME:
            bound = min(bound, window)
        cap = spec.requested_cap
        if self.kind == _REALTIME and cap is not None:
            cap = min(cap, REALTIME_MAX_OUTPUT)
        return spec._replace(input_bound=bound, requested_cap=cap)

    def rewrite(self, event: dict[str, Any], clamp: int | None, fallback: str | None) -> str:
        """The event to send with the kernel's output cap (and fallback model) in it."""
        event = dict(event)
        if self.kind == _REALTIME:
            options = dict(event.get("response") or {})
            if clamp is not None:
                options[self._cap_key] = min(clamp, REALTIME_MAX_OUTPUT)
            event["response"] = options
        else:
            if clamp is not None:
                event["max_output_tokens"] = clamp
            if fallback is not None:
                event["model"] = fallback
        return json.dumps(event)

    def _note_session(self, session: object) -> None:
        if isinstance(session, Mapping):
            if self._cap_key in session:
                self._session_cap = _cap(session.get(self._cap_key))
            audio = session.get("audio")
            audio_input = audio.get("input") if isinstance(audio, Mapping) else None
            for holder in (session, audio_input):  # beta: session; GA: session.audio.input
                if isinstance(holder, Mapping) and "turn_detection" in holder:
                    detection = holder.get("turn_detection")
                    self._turns = isinstance(detection, Mapping) and (
                        detection.get("create_response") is not False
                    )
            model = session.get("model")
            if isinstance(model, str) and model:
                self.model = model

    def server_spec(self) -> CallSpec:
        """A response the server started on its own: the session's cap, else the API's."""
        cap = REALTIME_MAX_OUTPUT if self._session_cap is None else self._session_cap
        return CallSpec(PROVIDER, "realtime", self.model, 0, cap, False)

    # -- the calls in flight ----------------------------------------------------

    def _armed(self) -> bool:
        with self.lock:
            return any(entry[2] and entry[1] is None for entry in self.pending)

    def add(self, call: ContainedCall, armed: bool = False) -> list[Any]:
        entry = [call, None, armed]
        with self.lock:
            self.pending.append(entry)
        return entry

    def drop(self, entry: list[Any]) -> None:
        with self.lock:
            if entry in self.pending:
                self.pending.remove(entry)

    def lost(self) -> list[tuple[ContainedCall, bool]]:
        """Every call in flight, taken (the connection is gone, their outcome
        unknown), each with whether it was armed and no response started."""
        with self.lock:
            calls = [(entry[0], entry[2] and entry[1] is None) for entry in self.pending]
            self.pending.clear()
        return calls

    # -- what the server sends --------------------------------------------------

    def incoming(self, message: object) -> tuple[bool, object, list[ContainedCall]]:
        """Read a server message: whether it starts a response no call of ours
        asked for (and that response's id), and the calls it settles (usage set)."""
        if self.kind is None or not isinstance(message, str | bytes):
            return False, None, []
        kind = _fast_type(message)
        if kind is not None and kind.endswith(".delta"):  # the bulk: no decode, no parse
            return False, None, []
        text = message if isinstance(message, str) else message.decode("utf-8", "replace")
        if "response." not in text:  # one scan; only these events are parsed
            if self.kind == _REALTIME and "session." in text:
                event = _loads(text)
                if event is not None and event.get("type") in _SESSION_EVENTS:
                    self._note_session(event.get("session"))
            return False, None, []
        event = _loads(text)
        if event is None:
            return False, None, []
        kind = event.get("type")
        response = event.get("response")
        response_id = get_field(response, "id")
        if kind == "response.created":
            return self._created(response_id), response_id, []
        if kind in _SETTLING[self.kind]:
            return False, None, self._settled(response_id, response)
        return False, None, []

    def _created(self, response_id: object) -> bool:
        with self.lock:
            for entry in self.pending:
                if entry[1] is None:
                    entry[1] = response_id
                    return False
        return self.kind == _REALTIME  # the server started it: admit it now

    def _settled(self, response_id: object, response: object) -> list[ContainedCall]:
        with self.lock:
            found = next((e for e in self.pending if e[1] == response_id), None)
            if found is None and self.pending:
                found = self.pending[0]  # its response.created never came
            if found is None:
                return []
            self.pending.remove(found)
        call: ContainedCall = found[0]
        usage = get_field(response, "usage")
        if usage is not None:
            _read_usage(call, usage)
            if call.usage_seen:
                self._produced += call.output_tokens
        return [call]


def _read_usage(call: ContainedCall, usage: Any) -> None:
    """Realtime (``input_token_details``) or Responses (``input_tokens_details``) usage."""
    details = get_field(usage, "input_token_details")
    if details is not None:  # realtime: split by modality, each at its own rate
        cached = get_field(details, "cached_tokens_details")
        output = get_field(usage, "output_token_details")
        split = modality_prices(
            call,
            PROVIDER,
            (_counts(details), get_field(usage, "input_tokens")),
            (_counts(cached), get_field(details, "cached_tokens")),
            (_counts(output), get_field(usage, "output_tokens")),
        )
        if split is not None:
            call.prices = split
    else:
        details = get_field(usage, "input_tokens_details")
    output_details = get_field(usage, "output_tokens_details")
    call.set_usage(
        get_field(usage, "input_tokens"),
        get_field(usage, "output_tokens"),
        get_field(details, "cached_tokens") or 0,
        get_field(output_details, "reasoning_tokens") or 0,
    )


def _counts(split: object) -> dict[str, object]:
    """``{"text": n, "audio": n, "image": n}`` from realtime ``*_tokens`` details."""
    return {m: get_field(split, f"{m}_tokens") or 0 for m in ("text", "audio", "image")}
