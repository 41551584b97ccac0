"""Signed budget grants: how a chain's remaining limits cross a service boundary.

A caller sends, in W3C baggage, what its chain has left (a :class:`Grant`),
signed with HMAC-SHA256 under a key both services share
(``VERONICA_GRANT_KEY``). The receiving service joins the chain with limits
no higher than the grant's. Baggage can be read and forged by anyone on the
path, so a grant is trusted only when its signature verifies, it has not
expired, it is not dated in the future, it fits the size limit and its nonce
was not seen before; otherwise it is ignored, counted on the
``veronica.grants.rejected`` counter (by reason) and logged on
``veronica_otel.grants``. Ignoring a grant never raises a limit: the service
then runs the request on its own local configuration.

Wire form of a grant (one baggage value, ASCII, no padding)::

    base64url(JSON payload) "." base64url(HMAC-SHA256(key, "veronica-grant.v1." + payload))

Payload keys: ``v`` (1), ``c`` chain id, ``d`` hop depth of the sender,
``n`` nonce, ``iat`` / ``exp`` issue and expiry (unix seconds), and, when
limited, ``$`` cost (nano-USD), ``s`` steps, ``r`` retries, ``t`` tokens,
``md`` max depth, ``dl`` the chain's deadline (unix milliseconds), ``tr`` the
reason the sender's chain already stopped, ``l`` the id of a shared ledger and
``a`` the ancestor chain ids on that ledger.

What a downstream service spent travels back in the ``veronica-spent``
response header, signed the same way under its own domain tag and bound to
the grant's nonce::

    cost_nano=120;tokens=30;steps=2;retries=0;shared=0;nonce=<grant nonce>;sig=<base64url>

Replay protection is per process: :class:`NonceCache` remembers the nonces of
accepted grants until they expire (bounded; the oldest are forgotten first
when it is full). A server running several worker processes has one cache
per worker, so a captured grant could be presented once to each worker
within its lifetime (60 s by default) -- and even then it can only lower
that worker's limits, never raise them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics

from ._errors import REASONS
from ._units import MAX_COUNT
from ._version import __version__

__all__ = [
    "DEFAULT_GRANT_TTL_S",
    "GRANT_KEY_ENV",
    "MAX_GRANT_BYTES",
    "REJECTION_REASONS",
    "SPENT_HEADER",
    "Grant",
    "NonceCache",
    "Spent",
    "grant_key_from_env",
    "record_rejection",
    "sign_grant",
    "sign_spent",
    "verify_grant",
    "verify_spent",
]

GRANT_KEY_ENV = "VERONICA_GRANT_KEY"
SPENT_HEADER = "veronica-spent"
DEFAULT_GRANT_TTL_S = 60.0
MAX_GRANT_BYTES = 2048
MAX_SPENT_BYTES = 512
MAX_ANCESTORS = 8
MAX_HOP_DEPTH = 10_000
# A grant dated this far in the future is refused (clock skew between hosts).
MAX_SKEW_S = 30.0
_MIN_KEY_BYTES = 16
_GRANT_TAG = b"veronica-grant.v1."
_SPENT_TAG = b"veronica-spent.v1."

REJECTION_REASONS = frozenset(
    {
        "unsigned",
        "bad_signature",
        "expired",
        "not_yet_valid",
        "oversized",
        "malformed",
        "replayed",
        "no_key",
    }
)

_logger = logging.getLogger("veronica_otel.grants")
_meter = metrics.get_meter("veronica_otel", __version__)
_rejected = _meter.create_counter(
    "veronica.grants.rejected",
    unit="{grant}",
    description="Budget grants ignored by a receiving service, by reason",
)


@dataclass(frozen=True, slots=True)
class Grant:
    """What a caller's chain lets a downstream service spend.

    Attributes:
        chain_id: The caller's chain.
        depth: The caller's hop depth (the receiver runs at ``depth + 1``).
        nonce: Unique per grant; a nonce is accepted once per process.
        issued_at: Unix seconds when the grant was made.
        expires_at: Unix seconds after which the grant is refused.
        cost_nano: Cost the chain has left, in nano-USD (None: unlimited).
        steps: Steps left (None: unlimited).
        retries: Retries left (None: unlimited).
        tokens: Tokens left (None: unlimited).
        max_depth: The chain's hop ceiling (None: unlimited).
        deadline_ms: The chain's wall-clock deadline, unix milliseconds.
        trip_reason: Why the caller's chain already stopped, if it did.
        ledger_id: Id of a ledger the caller shares with others (Redis).
        ancestors: Chain ids above ``chain_id`` on that shared ledger, root first.
    """

    chain_id: str
    depth: int
    nonce: str
    issued_at: int
    expires_at: int
    cost_nano: int | None = None
    steps: int | None = None
    retries: int | None = None
    tokens: int | None = None
    max_depth: int | None = None
    deadline_ms: int | None = None
    trip_reason: str | None = None
    ledger_id: str | None = None
    ancestors: tuple[str, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class Spent:
    """What a downstream service's chain used for one request.

    Attributes:
        cost_nano: Cost in nano-USD (committed plus still reserved).
        tokens: Tokens (committed plus still reserved).
        steps: Calls dispatched.
        retries: Retries drawn.
        shared: The service charged a ledger it shares with the caller, so the
            caller must not count it again.
    """

    cost_nano: int = 0
    tokens: int = 0
    steps: int = 0
    retries: int = 0
    shared: bool = False


# -- keys ---------------------------------------------------------------------------


def coerce_key(key: bytes | str, name: str = "grant_key") -> bytes:
    """Return ``key`` as bytes, or raise ``ValueError`` naming ``name``."""
    try:
        raw = key.encode("utf-8") if isinstance(key, str) else key
    except UnicodeEncodeError:  # from the environment: bytes that were not UTF-8
        raise ValueError(f"{name} is not valid UTF-8") from None
    if not isinstance(raw, bytes):
        raise TypeError(f"{name} must be bytes or str, got {type(key).__name__}")
    if len(raw) < _MIN_KEY_BYTES:
        raise ValueError(f"{name} must be at least {_MIN_KEY_BYTES} bytes, got {len(raw)}")
    return raw


def grant_key_from_env(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The key in ``VERONICA_GRANT_KEY``, None when unset or empty.

    Raises:
        ValueError: The key is shorter than 16 bytes (naming the variable).
    """
    env = os.environ if environ is None else environ
    raw = env.get(GRANT_KEY_ENV, "")
    if not raw:
        return None
    return coerce_key(raw, GRANT_KEY_ENV)


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    """Decode canonical unpadded base64url only (one encoding per value)."""
    if not text or not text.isascii() or not all(c.isalnum() or c in "-_" for c in text):
        raise ValueError("not base64url")
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64encode(data) != text:
        raise ValueError("not canonical base64url")
    return data


def _mac(key: bytes, tag: bytes, message: bytes) -> bytes:
    return hmac.new(key, tag + message, hashlib.sha256).digest()


# -- grants ---------------------------------------------------------------------------

_OPTIONAL_INTS = (
    ("$", "cost_nano"),
    ("s", "steps"),
    ("r", "retries"),
    ("t", "tokens"),
    ("md", "max_depth"),
    ("dl", "deadline_ms"),
)


def sign_grant(grant: Grant, key: bytes | str) -> str:
    """Encode ``grant`` and sign it; the result is one baggage value."""
    secret = coerce_key(key)
    payload: dict[str, Any] = {
        "v": 1,
        "c": grant.chain_id,
        "d": grant.depth,
        "n": grant.nonce,
        "iat": grant.issued_at,
        "exp": grant.expires_at,
    }
    for short, name in _OPTIONAL_INTS:
        value = getattr(grant, name)
        if value is not None:
            payload[short] = value
    if grant.trip_reason is not None:
        payload["tr"] = grant.trip_reason
    if grant.ledger_id is not None:
        payload["l"] = grant.ledger_id
        payload["a"] = list(grant.ancestors)
    body = _b64encode(json.dumps(payload, separators=(",", ":")).encode("utf-8"))
    return f"{body}.{_b64encode(_mac(secret, _GRANT_TAG, body.encode('ascii')))}"


def verify_grant(
    raw: str | None,
    key: bytes | str | None,
    *,
    now: float | None = None,
    max_bytes: int = MAX_GRANT_BYTES,
    replay_cache: NonceCache | None = None,
) -> Grant | None:
    """Return the grant in ``raw`` if it can be trusted, else None.

    Rejected (and counted on ``veronica.grants.rejected``, and logged):
    no signature (``unsigned``), a wrong signature (``bad_signature``, compared
    in constant time), past its expiry (``expired``), issued more than 30 s in
    the future (``not_yet_valid``), longer than ``max_bytes``
    (``oversized``), undecodable or out of range (``malformed``), a nonce
    already accepted in this process (``replayed``), or no key to check it
    with (``no_key``).

    Args:
        raw: The ``veronica.grant`` baggage value.
        key: The shared HMAC key.
        now: Unix time (``time.time()`` by default).
        max_bytes: Longest grant accepted.
        replay_cache: Nonces already accepted (the process-wide cache by default).
    """
    result = _verify(raw, key, time.time() if now is None else now, max_bytes)
    if isinstance(result, str):
        record_rejection(result)
        return None
    cache = replay_cache if replay_cache is not None else _PROCESS_NONCES
    if not cache.add(result.nonce, result.expires_at, time.time() if now is None else now):
        record_rejection("replayed", result.chain_id)
        return None
    return result


def _verify(raw: str | None, key: bytes | str | None, now: float, max_bytes: int) -> Grant | str:
    if raw is None or not raw:
        return "unsigned"
    if len(raw) > max_bytes:
        return "oversized"
    if key is None:
        return "no_key"
    body, dot, signature = raw.partition(".")
    if not dot or not signature:
        return "unsigned"
    try:
        expected = _mac(coerce_key(key), _GRANT_TAG, body.encode("ascii"))
        given = _b64decode(signature)
    except (ValueError, UnicodeEncodeError, binascii.Error):
        return "malformed"
    if not hmac.compare_digest(expected, given):
        return "bad_signature"
    try:
        payload = json.loads(_b64decode(body))
        grant = _decode(payload)
    except (ValueError, TypeError, KeyError, binascii.Error):
        return "malformed"
    if grant.issued_at > now + MAX_SKEW_S:
        return "not_yet_valid"
    if now > grant.expires_at:
        return "expired"
    return grant


def _count(payload: Mapping[str, Any], short: str, upper: int = MAX_COUNT) -> int | None:
    value = payload.get(short)
    if value is None:
        return None
    if type(value) is not int or not 0 <= value <= upper:
        raise ValueError(f"{short} out of range")
    return value


def _chain_id(value: object) -> str:
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= 128
        or not value.isascii()
        or not all(c.isalnum() or c in "-_.:" for c in value)
    ):
        raise ValueError("bad chain id")
    return value


def _decode(payload: object) -> Grant:
    if not isinstance(payload, dict) or payload.get("v") != 1:
        raise ValueError("unknown grant version")
    nonce = payload["n"]
    if not isinstance(nonce, str) or not 8 <= len(nonce) <= 64 or not nonce.isascii():
        raise ValueError("bad nonce")
    trip_reason = payload.get("tr")
    if trip_reason is not None and trip_reason not in REASONS:
        raise ValueError("bad trip reason")
    ledger_id = payload.get("l")
    ancestors: tuple[str, ...] = ()
    if ledger_id is not None:
        if not isinstance(ledger_id, str) or not 0 < len(ledger_id) <= 128:
            raise ValueError("bad ledger id")
        listed = payload.get("a", [])
        if not isinstance(listed, list) or len(listed) > MAX_ANCESTORS:
            raise ValueError("bad ancestors")
        ancestors = tuple(_chain_id(item) for item in listed)
    values = {name: _count(payload, short) for short, name in _OPTIONAL_INTS}
    issued_at, expires_at = _count(payload, "iat"), _count(payload, "exp")
    depth = _count(payload, "d", MAX_HOP_DEPTH)
    if issued_at is None or expires_at is None or depth is None:
        raise ValueError("missing field")
    return Grant(
        chain_id=_chain_id(payload["c"]),
        depth=depth,
        nonce=nonce,
        issued_at=issued_at,
        expires_at=expires_at,
        trip_reason=trip_reason,
        ledger_id=ledger_id,
        ancestors=ancestors,
        **values,
    )


# -- replay protection -------------------------------------------------------------------


class NonceCache:
    """Nonces of accepted grants, remembered until they expire.

    Bounded: past ``capacity`` entries the expired ones are dropped first,
    then the oldest. Thread-safe. Scope: one process (see the module docs).
    """

    def __init__(self, capacity: int = 100_000) -> None:
        if type(capacity) is not int or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        self._capacity = capacity
        self._seen: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, nonce: str, expires_at: int, now: float) -> bool:
        """Remember ``nonce``; False if it was already accepted and is still live."""
        with self._lock:
            known = self._seen.get(nonce)
            if known is not None and known >= now:
                return False
            self._seen[nonce] = expires_at
            self._seen.move_to_end(nonce)
            if len(self._seen) > self._capacity:
                for stale in [n for n, exp in self._seen.items() if exp < now]:
                    del self._seen[stale]
                while len(self._seen) > self._capacity:
                    self._seen.popitem(last=False)
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._seen)


_PROCESS_NONCES = NonceCache()


# -- rejections ----------------------------------------------------------------------------


def record_rejection(reason: str, chain_id: str | None = None) -> None:
    """Count a rejected grant and log it (never raises)."""
    try:
        _rejected.add(1, {"veronica.grant.reason": reason})
        try:
            named = f" for chain {_chain_id(chain_id)}" if chain_id is not None else ""
        except ValueError:  # never echo what an attacker wrote into the log
            named = ""
        _logger.warning(
            "veronica-otel: budget grant rejected (%s)%s; the request runs on local limits",
            reason,
            named,
        )
    except Exception:
        _logger.debug("recording a grant rejection failed", exc_info=True)


# -- spent header ---------------------------------------------------------------------------


def sign_spent(spent: Spent, nonce: str, key: bytes | str) -> str:
    """The signed ``veronica-spent`` header value answering the grant ``nonce``."""
    text = (
        f"cost_nano={spent.cost_nano};tokens={spent.tokens};steps={spent.steps};"
        f"retries={spent.retries};shared={int(spent.shared)};nonce={nonce}"
    )
    mac = _mac(coerce_key(key), _SPENT_TAG, text.encode("ascii"))
    return f"{text};sig={_b64encode(mac)}"


def verify_spent(raw: str | None, key: bytes | str, nonce: str) -> Spent | None:
    """Parse a ``veronica-spent`` value; None unless signed and bound to ``nonce``."""
    if not raw or len(raw) > MAX_SPENT_BYTES:
        return None
    text, marker, signature = raw.rpartition(";sig=")
    if not marker:
        return None
    try:
        expected = _mac(coerce_key(key), _SPENT_TAG, text.encode("ascii"))
        if not hmac.compare_digest(expected, _b64decode(signature)):
            return None
        fields = dict(part.split("=", 1) for part in text.split(";"))
        if not hmac.compare_digest(fields["nonce"].encode("ascii"), nonce.encode("ascii")):
            return None
        values = {name: int(fields[name]) for name in ("cost_nano", "tokens", "steps", "retries")}
    except (ValueError, KeyError, UnicodeEncodeError, binascii.Error):
        return None
    if any(not 0 <= value <= MAX_COUNT for value in values.values()):
        return None
    return Spent(shared=fields.get("shared") == "1", **values)
