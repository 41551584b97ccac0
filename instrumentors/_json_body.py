"""A reply body's JSON, decoded by the C scanner without ``json.loads``' frames.

An adapter whose hook sees the raw reply (``cohere``'s ``httpx.Response``,
``google-genai``'s ``SdkHttpResponse.body``) decodes it once per call to read
its usage. ``json.loads`` reaches the C scanner through three Python frames
(``loads``, ``JSONDecoder.decode``, ``raw_decode``) and a regular expression
for the whitespace around the value; :func:`loads` calls the scanner directly
and keeps ``json.loads``' result exactly: a body with whitespace before its
value, anything but JSON whitespace after it, or that is not JSON at all takes
``json.loads`` itself (which raises as it always did).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["loads"]

# The C scanner (CPython), else json's Python one: (value, end) of the JSON value at an index.
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_loads = json.loads
_WHITESPACE = " \t\n\r"  # JSON's whitespace (RFC 8259 section 2), what json.loads skips


def loads(text: str | bytes) -> Any:
    """``json.loads(text)``, by the scanner when the body is a ``str`` that allows it."""
    if type(text) is not str:
        return _loads(text)  # bytes: json.loads detects their encoding
    try:
        value, end = _scan(text, 0)
    except (StopIteration, ValueError):  # no value at 0 (leading whitespace), or bad JSON
        return _loads(text)
    if end == len(text) or not text[end:].strip(_WHITESPACE):
        return value
    return _loads(text)  # extra data: json.loads' own error
