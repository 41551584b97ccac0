"""The worst case of an OpenAI batch, from its input file when this process uploaded it.

``batches.create`` names a file already on the server; what the batch will
bill is in that file: one request a line, each with its model, input and
output cap. When the file went up through ``files.create(purpose="batch")``
in this process, its lines are read on the way (:func:`read_upload`) and kept
under the id the server gave it (:func:`remember`, a bounded table), so
:func:`batch_cents` can price the batch when it is created: each line at its
worst case (input bound, its cap or the model's output limit, times ``n``) at
the batch rate (half the standard price). A file not seen, too large, or
with a line that cannot be bounded (no model, server-side input) is
unknown: the configured ``per_request`` bound applies instead.
"""

from __future__ import annotations

import io
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from veronica_otel._pricing import PriceTable

from ._admit import input_bound
from ._openai_request import _ROUTES, _choices, _requested_cap

__all__ = ["BATCH_DISCOUNT", "batch_cents", "read_upload", "remember"]

_MAX_FILES = 64  # files remembered (the oldest forgotten first)
_MAX_BYTES = 32 * 1024 * 1024  # larger uploads are not read on the way
_MAX_LINES = 50_000  # the Batch API's own limit per file
BATCH_DISCOUNT = 2  # OpenAI and Anthropic bill batches at half the standard price
_SERVER_SIDE = ("previous_response_id", "conversation", "prompt")  # input we cannot see

# One line's worst case: (model, input token bound, output cap or -1: the model's limit, choices).
_Line = tuple[str, int, int, int]
_FILES: OrderedDict[str, tuple[_Line, ...]] = OrderedDict()
_lock = threading.Lock()


def read_upload(options: Any) -> tuple[_Line, ...] | None:
    """The lines of a batch input file being uploaded (None: not one, or unreadable)."""
    url = str(getattr(options, "url", "")).split("?", 1)[0]
    body = getattr(options, "json_data", None)
    if not url.endswith("/files") or not isinstance(body, Mapping):
        return None
    if body.get("purpose") != "batch":
        return None
    content = _content(getattr(options, "files", None))
    if content is None or len(content) > _MAX_BYTES:
        return None
    lines: list[_Line] = []
    for raw in content.splitlines():
        if not raw.strip():
            continue
        line = _line(raw)
        if line is None or len(lines) >= _MAX_LINES:
            return None
        lines.append(line)
    return tuple(lines) or None


def remember(result: Any, lines: tuple[_Line, ...]) -> None:
    """Keep ``lines`` under the id of the uploaded file ``result``."""
    file_id = getattr(result, "id", None)
    if not isinstance(file_id, str):
        return
    with _lock:
        _FILES[file_id] = lines
        _FILES.move_to_end(file_id)
        while len(_FILES) > _MAX_FILES:
            _FILES.popitem(last=False)


def batch_cents(table: PriceTable, provider: str, file_id: object) -> int | None:
    """The batch's worst case in cents, rounded up; None: the file is unknown or
    one of its models has no price."""
    lines = _FILES.get(file_id) if isinstance(file_id, str) else None
    if lines is None:
        return None
    nano = 0
    for model, bound, cap, choices in lines:
        prices = table.lookup(provider, model)
        if prices is None:
            return None
        output = (prices.output_limit(bound) if cap < 0 else cap) * choices
        nano += -(-prices.max_cost_nano(bound, output) // BATCH_DISCOUNT)
    return max(1, -(-nano // 10_000_000))


def _content(files: Any) -> bytes | None:
    pairs = files.items() if isinstance(files, Mapping) else files
    for key, value in pairs or ():
        if key != "file":
            continue
        content = value[1] if isinstance(value, tuple) else value
        if isinstance(content, (bytes, bytearray)):
            return bytes(content)
        if isinstance(content, io.IOBase) and content.seekable():
            at = content.tell()
            try:
                data = content.read(_MAX_BYTES + 1)
            finally:
                content.seek(at)  # the SDK sends it from where it was
            return data if isinstance(data, bytes) else None
    return None


def _line(raw: bytes) -> _Line | None:
    try:
        item = json.loads(raw)
    except ValueError:
        return None
    body = item.get("body") if isinstance(item, dict) else None
    url = item.get("url") if isinstance(item, dict) else None
    if not isinstance(body, dict) or not isinstance(url, str):
        return None
    route = next((r for suffix, r in _ROUTES.items() if url.endswith(suffix)), None)
    model = body.get("model")
    if route is None or not isinstance(model, str) or any(k in body for k in _SERVER_SIDE):
        return None
    operation, input_keys, cap_keys = route
    parts = [part for part in map(body.get, input_keys) if part is not None]
    messages = body.get("messages")
    bound = input_bound(parts, len(messages) if isinstance(messages, list) else 1)
    cap = _requested_cap(body, cap_keys)[0] if cap_keys else 0
    return model, bound, -1 if cap is None else cap, _choices(body, operation)
