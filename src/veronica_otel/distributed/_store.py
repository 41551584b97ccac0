"""Plumbing shared by the Redis ledger and breaker.

* Our own Redis traffic is never traced or contained: every operation runs
  in a fixed context with instrumentation suppressed (:func:`quiet`), attached
  once per operation rather than per command.
* Errors are mapped at the boundary: a script's corruption report becomes
  :class:`LedgerCorruptedError`; every other Redis error means the store
  cannot be used right now (:func:`corruption` returns None for those).
* Trips travel as JSON (:class:`TripCodec`), decoded strictly.
* The store is named in messages without its password (:func:`describe`).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import redis
from opentelemetry import context as otel_context
from opentelemetry.instrumentation.utils import suppress_instrumentation

from veronica_otel._errors import REASONS, TripEvent

from ._errors import LedgerCorruptedError
from ._scripts import CORRUPT_TAG

__all__ = [
    "LOCAL",
    "POOL_NAMES",
    "POOL_SNAPSHOT",
    "SNAPSHOT_FIELDS",
    "TripCodec",
    "check_seconds",
    "corruption",
    "describe",
    "parse_int",
    "quiet",
    "text",
]

# A chain's fields a snapshot reads, in the order its reply is parsed.
SNAPSHOT_FIELDS = ("c", "rc", "s", "r", "t", "rt", "trip", "e", "ov", "k", "kt")
# Stand-ins in a plan's steps for what the client answers itself (no round
# trip: LOCAL) and for the pool reads a step runs (not scripts of their own).
LOCAL: Any = object()
POOL_SNAPSHOT: Any = object()
POOL_NAMES: Any = object()

_QUIET: otel_context.Context | None = None
_INT = re.compile(r"-?(?:0|[1-9][0-9]{0,18})")


def quiet() -> otel_context.Context:
    """The context our Redis calls run in: empty, instrumentation suppressed.

    Built once from the public API. Attaching a prepared context costs about
    a microsecond; ``with suppress_instrumentation()`` costs several, because
    it copies the current context twice.
    """
    global _QUIET
    if _QUIET is None:
        token = otel_context.attach(otel_context.Context())
        try:
            with suppress_instrumentation():
                _QUIET = otel_context.get_current()
        finally:
            otel_context.detach(token)
    return _QUIET


def text(value: object) -> str:
    """A reply value as text (clients may or may not decode responses)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def parse_int(key: str, field: str, value: object) -> int:
    """A stored counter; anything but a canonical integer is corruption."""
    if value is None:
        return 0
    raw = text(value)
    if _INT.fullmatch(raw) is None:
        raise LedgerCorruptedError(key, field, raw[:64])
    return int(raw)


def corruption(exc: redis.RedisError) -> LedgerCorruptedError | None:
    """The corruption a script reported, or None for any other store error."""
    if not isinstance(exc, redis.ResponseError):
        return None
    message = str(exc)
    if message.startswith(CORRUPT_TAG + "\t"):
        parts = message.split("\t")
        if len(parts) >= 4:
            return LedgerCorruptedError(parts[1], parts[2], parts[3])
    if message.startswith("WRONGTYPE"):
        return LedgerCorruptedError("(a ledger key)", "(type)", message)
    return None


def describe(client: redis.Redis) -> str:
    """Where ``client`` points, as a URL without credentials."""
    label = getattr(client, "store_label", None)  # a cluster client names its nodes
    if isinstance(label, str):
        return label
    pool = getattr(client, "connection_pool", None)
    kwargs: dict[str, Any] = dict(getattr(pool, "connection_kwargs", {}) or {})
    db = kwargs.get("db", 0)
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}?db={db}"
    connection_class = getattr(pool, "connection_class", None)
    scheme = "rediss" if connection_class is redis.SSLConnection else "redis"
    host = kwargs.get("host", "localhost")
    port = kwargs.get("port", 6379)
    user = kwargs.get("username")
    auth = f"{user}:***@" if user else ("***@" if kwargs.get("password") else "")
    return f"{scheme}://{auth}{host}:{port}/{db}"


def check_seconds(name: str, value: object, *, minimum: float = 0.0) -> float:
    """A finite number of seconds >= ``minimum``, or ValueError naming it."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < minimum
    ):
        raise ValueError(f"{name} must be a finite number of seconds >= {minimum:g}, got {value!r}")
    return float(value)


class TripCodec:
    """Trips to JSON and back; decoded trips are cached so a sticky trip read
    twice in this process is the same object (as with the local ledger)."""

    __slots__ = ("_cache",)

    _LIMIT = 1024

    def __init__(self) -> None:
        self._cache: dict[str, TripEvent] = {}

    def encode(self, event: TripEvent) -> str:
        """Serialise ``event`` and remember it, so decoding it gives it back."""
        raw = json.dumps(
            {
                "reason": event.reason,
                "limit": event.limit,
                "observed": event.observed,
                "chain_id": event.chain_id,
                "message": event.message,
                "time": event.time,
            },
            separators=(",", ":"),
        )
        self._keep(raw, event)
        return raw

    def decode(self, value: object, key: str) -> TripEvent:
        """The trip stored at ``key``; LedgerCorruptedError if it is not one."""
        raw = text(value)
        event = self._cache.get(raw)
        if event is not None:
            return event
        try:
            data = json.loads(raw)
            reason = data["reason"]
            if reason not in REASONS:
                raise ValueError(reason)
            fields = (data["limit"], data["observed"], data["time"])
            if not all(isinstance(f, (int, float)) and not isinstance(f, bool) for f in fields):
                raise TypeError(fields)
            chain_id, message = data["chain_id"], data["message"]
            if not isinstance(chain_id, str) or not isinstance(message, str):
                raise TypeError(chain_id)
        except (ValueError, TypeError, KeyError) as exc:
            raise LedgerCorruptedError(key, "trip", raw[:64]) from exc
        event = TripEvent(
            reason,
            float(fields[0]),
            float(fields[1]),
            chain_id,
            message,
            float(fields[2]),
        )
        self._keep(raw, event)
        return event

    def _keep(self, raw: str, event: TripEvent) -> None:
        if len(self._cache) >= self._LIMIT:
            self._cache.clear()
        self._cache[raw] = event
