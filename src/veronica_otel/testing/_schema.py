"""Dummy JSON documents that validate against a JSON schema.

Structured-output requests (``response_format`` / ``text.format`` /
``output_config.format`` of type ``json_schema``) get a reply built here, so
the SDKs' ``parse`` helpers validate it into the caller's pydantic model.
It covers what pydantic and the SDKs' strict-schema transforms emit, not all
of JSON Schema (``pattern`` is ignored, for instance).
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["dummy_from_schema"]

# Past this depth (or on a $ref already being expanded) the walker keeps
# documents small: nullable picks null, arrays take their minimum length.
_SHRINK_DEPTH = 6
# Past this depth a schema cannot be satisfied finitely; give up with {}.
_MAX_DEPTH = 40

# anthropic's transform_schema moves constraints it cannot send into the
# description, e.g. "{maximum: 9, minimum: 5}"; read the numeric ones back.
_DESCRIBED_CONSTRAINT = re.compile(
    r"\b(minimum|maximum|exclusiveMinimum|exclusiveMaximum|minLength|maxLength|minItems|maxItems)"
    r": (-?\d+(?:\.\d+)?)\b"
)

_STRING_FORMATS = {
    "date-time": "2024-01-01T00:00:00Z",
    "date": "2024-01-01",
    "time": "00:00:00",
    "duration": "P1D",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "email": "user@example.com",
    "uri": "https://example.com/",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
}


def dummy_from_schema(schema: Mapping[str, Any]) -> Any:
    """Build a value that validates against ``schema`` (the common subset).

    Objects get their required properties; strings honour ``format``,
    ``minLength`` and ``maxLength``; numbers their bounds; arrays ``items``,
    ``prefixItems`` and ``minItems``; ``$ref`` into ``$defs`` / ``definitions``,
    ``anyOf`` / ``oneOf`` (first non-null option), ``allOf``, ``enum`` and
    ``const`` are followed. Recursive schemas stay small and finite.

    Args:
        schema: A JSON schema, e.g. ``Model.model_json_schema()``.

    Returns:
        A JSON-compatible value.
    """
    return _Walker(schema).value(schema, 0, frozenset(), shrink=False)


class _Walker:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self._root = root

    def _lookup(self, ref: str) -> Mapping[str, Any]:
        target: Any = self._root
        for part in ref.removeprefix("#").strip("/").split("/"):
            if not part:
                continue
            if not isinstance(target, Mapping):
                return {}
            target = target.get(part.replace("~1", "/").replace("~0", "~"), {})
        return target if isinstance(target, Mapping) else {}

    def value(
        self, node: Mapping[str, Any], depth: int, refs: frozenset[str], *, shrink: bool
    ) -> Any:
        if depth > _MAX_DEPTH:
            return {}
        shrink = shrink or depth >= _SHRINK_DEPTH
        ref = node.get("$ref")
        if isinstance(ref, str):
            if ref in refs:
                shrink = True
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return self.value({**self._lookup(ref), **rest}, depth + 1, refs | {ref}, shrink=shrink)
        if "const" in node:
            return node["const"]
        enum = node.get("enum")
        if isinstance(enum, list) and enum:
            return enum[0]
        for key in ("anyOf", "oneOf"):
            options = node.get(key)
            if isinstance(options, list) and options:
                choice = _pick(options, prefer_null=shrink)
                return self.value(choice, depth + 1, refs, shrink=shrink)
        all_of = node.get("allOf")
        if isinstance(all_of, list) and all_of:
            merged: dict[str, Any] = {k: v for k, v in node.items() if k != "allOf"}
            for part in all_of:
                if isinstance(part, Mapping):
                    part_ref = part.get("$ref")
                    merged.update(self._lookup(part_ref) if isinstance(part_ref, str) else part)
            return self.value(merged, depth + 1, refs, shrink=shrink)
        description = node.get("description")
        if isinstance(description, str) and "{" in description:
            node = _with_described_constraints(node, description)
        kind = node.get("type")
        if isinstance(kind, str):
            kind = kind.lower()  # Gemini's schemas say "OBJECT", "STRING", ...
        if isinstance(kind, list):
            kinds = [k for k in kind if k != "null"]
            kind = "null" if not kinds or ("null" in kind and shrink) else kinds[0]
        if kind is None:
            kind = "object" if "properties" in node else "string"
        if kind == "object":
            return self._object(node, depth, refs, shrink)
        if kind == "array":
            return self._array(node, depth, refs, shrink)
        if kind in ("integer", "number"):
            return _number(str(kind), node)
        if kind == "boolean":
            return True
        if kind == "null":
            return None
        return _string(node)

    def _object(
        self, node: Mapping[str, Any], depth: int, refs: frozenset[str], shrink: bool
    ) -> dict[str, Any]:
        properties = node.get("properties")
        required = node.get("required")
        if not isinstance(properties, Mapping) or not isinstance(required, list):
            return {}
        return {
            name: self.value(properties[name], depth + 1, refs, shrink=shrink)
            for name in required
            if isinstance(properties.get(name), Mapping)
        }

    def _array(
        self, node: Mapping[str, Any], depth: int, refs: frozenset[str], shrink: bool
    ) -> list[Any]:
        prefix = node.get("prefixItems")
        prefix_schemas = (
            [p for p in prefix if isinstance(p, Mapping)] if isinstance(prefix, list) else []
        )
        low = node.get("minItems", 0)
        low = low if isinstance(low, int) else 0
        count = max(low, len(prefix_schemas)) if shrink else max(low, len(prefix_schemas), 1)
        high = node.get("maxItems")
        if isinstance(high, int):
            count = min(count, high)
        if prefix_schemas and node.get("items") is False:
            count = min(count, len(prefix_schemas))
        items = node.get("items")
        item_schema: Mapping[str, Any] = items if isinstance(items, Mapping) else {}
        return [
            self.value(
                prefix_schemas[i] if i < len(prefix_schemas) else item_schema,
                depth + 1,
                refs,
                shrink=shrink,
            )
            for i in range(count)
        ]


def _with_described_constraints(node: Mapping[str, Any], description: str) -> Mapping[str, Any]:
    found: dict[str, Any] = {}
    for name, number in _DESCRIBED_CONSTRAINT.findall(description):
        if name not in node:
            found[name] = float(number) if "." in number else int(number)
    start = description.find("prefixItems: [")
    if start >= 0 and "prefixItems" not in node:
        found["prefixItems"] = _literal_list(description, start + len("prefixItems: "))
    return {**node, **found} if found else node


def _literal_list(text: str, start: int) -> list[Any]:
    """The Python list literal starting at ``text[start]``, or ``[]``."""
    depth = 0
    for end in range(start, len(text)):
        depth += {"[": 1, "]": -1}.get(text[end], 0)
        if depth == 0:
            try:
                value = ast.literal_eval(text[start : end + 1])
            except (ValueError, SyntaxError):
                return []
            return value if isinstance(value, list) else []
    return []


def _pick(options: Sequence[Any], *, prefer_null: bool) -> Mapping[str, Any]:
    schemas = [o for o in options if isinstance(o, Mapping)]
    if not schemas:
        return {}
    nulls = [o for o in schemas if o.get("type") == "null"]
    others = [o for o in schemas if o.get("type") != "null"]
    if prefer_null and nulls:
        return nulls[0]
    return others[0] if others else schemas[0]


def _number(kind: str, node: Mapping[str, Any]) -> int | float:
    value: float = 0
    low = node.get("minimum")
    if isinstance(low, (int, float)):
        value = max(value, low)
    low = node.get("exclusiveMinimum")
    if isinstance(low, (int, float)) and value <= low:
        value = low + 1
    high = node.get("maximum")
    if isinstance(high, (int, float)):
        value = min(value, high)
    high = node.get("exclusiveMaximum")
    if isinstance(high, (int, float)) and value >= high:
        value = high - 1
    return math.ceil(value) if kind == "integer" else float(value)


def _string(node: Mapping[str, Any]) -> str:
    text = _STRING_FORMATS.get(str(node.get("format")), "string")
    low = node.get("minLength")
    if isinstance(low, int) and len(text) < low:
        text += "x" * (low - len(text))
    high = node.get("maxLength")
    if isinstance(high, int) and len(text) > high:
        text = text[:high]
    return text
