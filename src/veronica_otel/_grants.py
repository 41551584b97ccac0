"""Signed budget grants: how a chain's budget crosses a service boundary.

A caller sends, in W3C baggage, what a downstream service may spend for one
request (a :class:`Grant`), signed with HMAC-SHA256 under a key both
services hold. The grant names its audience (the receiving ``host[:port]``)
and the id of the key that signed it. The receiving service joins the chain
with limits no higher than the grant's. Baggage can be read and forged by
anyone on the path, so a grant is trusted only when its key id is known, its
signature verifies, it is addressed to this service, it has not expired, it
is not dated in the future, it fits the size limit and its nonce was not seen
before; otherwise it is ignored, counted on the ``veronica.grants.rejected``
counter (by reason) and logged on ``veronica_otel.grants``.

Keys (:class:`GrantKeys`): ``VERONICA_GRANT_KEYS`` holds ``kid:secret`` pairs,
comma-separated (the first signs, every one verifies: two keys during a
rotation); ``VERONICA_GRANT_KEY`` holds a single secret whose key id is
derived from it (``k`` + 8 hex digits of a hash of the secret). Secrets are at
least 16 bytes; key ids are 1-32 of ``A-Z a-z 0-9 _ - .``.

Wire form of a grant (one baggage value, ASCII, no padding)::

    kid "." payload "." base64url(HMAC-SHA256(key, "veronica-grant.v2." + kid + "." + payload))

where ``payload`` is base64url(JSON).

Payload keys: ``v`` (2), ``c`` chain id, ``d`` hop depth of the sender,
``n`` nonce, ``aud`` audience, ``iat`` / ``exp`` issue and expiry (unix
seconds), and, when limited, ``$`` cost (nano-USD), ``s`` steps, ``r``
retries, ``t`` tokens, ``md`` max depth, ``dl`` the chain's deadline (unix
milliseconds); ``cv`` 1 when the cost, steps and tokens are carved
(reserved) out of the caller's chain, ``l`` the id of a ledger the caller
shares (then ``a``, the caller's path on it, root first: ``[chain id, cost,
steps, tokens, retries]`` ceilings per level, null for unlimited; and ``p``,
the caller's budget pools on that ledger: ``[name, cost, steps, tokens,
window seconds]``, so the service charges them as the caller would).

What the downstream service's chain spent travels back in the
``veronica-spent`` response header, signed with the service's own signing
key and bound to the grant's nonce and audience::

    v=2;cost_nano=120;tokens=30;steps=2;retries=0;nonce=<grant nonce>;aud=<audience>;
    kid=<kid>;sig=<base64url HMAC-SHA256(key, "veronica-spent.v2." + the text before ";sig=")>

(one line).

Replay protection is per process: :class:`NonceCache` remembers the nonces of
accepted grants until they expire (bounded; the oldest are forgotten first
when it is full). A server running several worker processes has one cache
per worker, so a captured grant could be presented once to each worker
within its lifetime (60 s by default) -- and even then it can only lower
that worker's limits, never raise them, and its budget is carved once.
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

from ._attributes import GRANT_REASON
from ._errors import REASONS
from ._ledger import Level, Limits, PoolLevel
from ._limits import GRANT_MARK
from ._pools import check_pool_name
from ._units import MAX_COUNT
from ._version import __version__
from ._window import check_window

__all__ = [
    "AUDIENCE_ENV",
    "DEFAULT_GRANT_TTL_S",
    "GRANT_KEYS_ENV",
    "GRANT_KEY_ENV",
    "MAX_GRANT_BYTES",
    "REJECTION_REASONS",
    "SPENT_HEADER",
    "SPENT_REJECTION_REASONS",
    "Grant",
    "GrantKeys",
    "NonceCache",
    "Spent",
    "audience_of",
    "coerce_keys",
    "grant_key_from_env",
    "record_rejection",
    "record_spent_rejection",
    "sign_grant",
    "sign_spent",
    "verify_grant",
    "verify_spent",
]

GRANT_KEY_ENV = "VERONICA_GRANT_KEY"
GRANT_KEYS_ENV = "VERONICA_GRANT_KEYS"
AUDIENCE_ENV = "VERONICA_GRANT_AUDIENCE"
SPENT_HEADER = "veronica-spent"
DEFAULT_GRANT_TTL_S = 60.0
MAX_GRANT_BYTES = 2048
MAX_SPENT_BYTES = 512
MAX_ANCESTORS = 8
MAX_HOP_DEPTH = 10_000
# A grant dated this far in the future is refused (clock skew between hosts).
MAX_SKEW_S = 30.0
_MIN_KEY_BYTES = 16
_GRANT_TAG = b"veronica-grant.v2."
_SPENT_TAG = b"veronica-spent.v2."
_KID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")

REJECTION_REASONS = frozenset(
    {
        "unsigned",
        "bad_signature",
        "unknown_key",
        "wrong_audience",
        "expired",
        "not_yet_valid",
        "oversized",
        "malformed",
        "replayed",
        "no_key",
        "ledger_mismatch",
    }
)
# Why a caller did not trust a spend-back (the whole carve is then committed).
SPENT_REJECTION_REASONS = frozenset(
    {"missing", "malformed", "bad_signature", "unknown_key", "wrong_grant", "over_carve"}
)

_logger = logging.getLogger("veronica_otel.grants")
_meter = metrics.get_meter("veronica_otel", __version__)
_rejected = _meter.create_counter(
    "veronica.grants.rejected",
    unit="{grant}",
    description="Budget grants ignored by a receiving service, by reason",
)
_spent_rejected = _meter.create_counter(
    "veronica.grants.spent_rejected",
    unit="{response}",
    description="Spend-back headers a caller did not trust (the whole carve is committed)",
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
        audience: The receiving service, ``host[:port]`` (lower case).
        cost_nano: Cost the service may spend, in nano-USD (None: unlimited).
        steps: Steps it may take (None: unlimited).
        retries: Retries left (None: unlimited).
        tokens: Tokens it may use (None: unlimited).
        max_depth: The chain's hop ceiling (None: unlimited).
        deadline_ms: The chain's wall-clock deadline, unix milliseconds.
        trip_reason: Why the caller's chain already stopped, if it did.
        carved: Cost, steps and tokens are reserved in the caller's chain
            until the spend-back settles them.
        ledger_id: Id of a ledger the caller shares with others (Redis).
        path: On that shared ledger, the caller's chain and the chains above
            it with their ceilings, root first, ``chain_id`` last (the root and
            the nearest levels when the path is deeper than a grant carries).
        pools: On that shared ledger, the caller's budget pools: the
            service's calls for the request are reserved in them too.
    """

    chain_id: str
    depth: int
    nonce: str
    issued_at: int
    expires_at: int
    audience: str = ""
    cost_nano: int | None = None
    steps: int | None = None
    retries: int | None = None
    tokens: int | None = None
    max_depth: int | None = None
    deadline_ms: int | None = None
    trip_reason: str | None = None
    carved: bool = False
    ledger_id: str | None = None
    path: tuple[Level, ...] = field(default=())
    pools: tuple[PoolLevel, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class Spent:
    """What a downstream service's chain used for one request.

    Attributes:
        cost_nano: Cost in nano-USD (committed plus still reserved).
        tokens: Tokens (committed plus still reserved).
        steps: Calls dispatched.
        retries: Retries drawn.
    """

    cost_nano: int = 0
    tokens: int = 0
    steps: int = 0
    retries: int = 0


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


def _derived_kid(secret: bytes) -> str:
    return "k" + hashlib.sha256(b"veronica-kid." + secret).hexdigest()[:8]


def _check_kid(kid: object, name: str) -> str:
    if not isinstance(kid, str) or not 0 < len(kid) <= 32 or not set(kid) <= _KID_CHARS:
        shown = repr(kid) if isinstance(kid, str) and len(kid) <= 40 else "(too long)"
        raise ValueError(f"{name}: bad key id {shown} (1-32 of A-Z a-z 0-9 _ - .)")
    return kid


class GrantKeys:
    """The keys a service signs and verifies grants and spend-backs with.

    Args:
        keys: ``(kid, secret)`` pairs; the first one signs, every one verifies.
        name: What to name in error messages (an argument or a variable).
    """

    __slots__ = ("_by_id", "kid", "secret")

    def __init__(self, keys: list[tuple[str, bytes | str]], name: str = "grant_key") -> None:
        if not keys:
            raise ValueError(f"{name}: at least one key is needed")
        by_id: dict[str, bytes] = {}
        for kid, secret in keys:
            _check_kid(kid, name)
            if kid in by_id:
                raise ValueError(f"{name}: key id {kid!r} is listed twice")
            by_id[kid] = coerce_key(secret, f"{name} (key {kid!r})")
        self._by_id = by_id
        self.kid, self.secret = keys[0][0], by_id[keys[0][0]]

    @classmethod
    def single(cls, secret: bytes | str, name: str = "grant_key") -> GrantKeys:
        """One key whose id is derived from the secret."""
        raw = coerce_key(secret, name)
        return cls([(_derived_kid(raw), raw)], name)

    def get(self, kid: str) -> bytes | None:
        """The secret of ``kid``, or None when it is not one of ours."""
        return self._by_id.get(kid)

    @property
    def kids(self) -> tuple[str, ...]:
        return tuple(self._by_id)

    def __repr__(self) -> str:  # never the secrets
        return f"GrantKeys(kids={self.kids!r})"


def coerce_keys(value: Any, name: str = "grant_key") -> GrantKeys:
    """A :class:`GrantKeys` from a secret, a ``{kid: secret}`` mapping (first signs)
    or a :class:`GrantKeys`; ``ValueError`` / ``TypeError`` naming ``name``."""
    if isinstance(value, GrantKeys):
        return value
    if isinstance(value, Mapping):
        return GrantKeys(list(value.items()), name)
    return GrantKeys.single(value, name)


def grant_key_from_env(environ: Mapping[str, str] | None = None) -> GrantKeys | None:
    """The keys in ``VERONICA_GRANT_KEYS`` (else ``VERONICA_GRANT_KEY``); None when unset.

    Raises:
        ValueError: A malformed value, naming the variable.
    """
    env = os.environ if environ is None else environ
    listed = env.get(GRANT_KEYS_ENV, "")
    if listed.strip():
        pairs: list[tuple[str, bytes | str]] = []
        for item in listed.split(","):
            kid, colon, secret = item.strip().partition(":")
            if not colon:
                raise ValueError(
                    f"{GRANT_KEYS_ENV}: each entry must be kid:secret (entry {len(pairs) + 1})"
                )
            pairs.append((kid, secret))
        return GrantKeys(pairs, GRANT_KEYS_ENV)
    raw = env.get(GRANT_KEY_ENV, "")
    if not raw:
        return None
    return GrantKeys.single(raw, GRANT_KEY_ENV)


def audience_of(host: str, port: int | None, scheme: str = "http") -> str:
    """The audience naming ``host`` and ``port`` (the port left out when it is the default)."""
    host = host.lower().rstrip(".")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    default = {"http": 80, "https": 443, "ws": 80, "wss": 443}.get(scheme.lower())
    return host if port is None or port == default else f"{host}:{port}"


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

MAX_GRANT_POOLS = 16  # as many as one chain may list

_OPTIONAL_INTS = (
    ("$", "cost_nano"),
    ("s", "steps"),
    ("r", "retries"),
    ("t", "tokens"),
    ("md", "max_depth"),
    ("dl", "deadline_ms"),
)


def sign_grant(grant: Grant, keys: Any) -> str:
    """Encode ``grant`` and sign it with the signing key; the result is one baggage value."""
    signer = coerce_keys(keys)
    payload: dict[str, Any] = {
        "v": 2,
        "c": grant.chain_id,
        "d": grant.depth,
        "n": grant.nonce,
        "aud": grant.audience,
        "iat": grant.issued_at,
        "exp": grant.expires_at,
    }
    for short, name in _OPTIONAL_INTS:
        value = getattr(grant, name)
        if value is not None:
            payload[short] = value
    if grant.trip_reason is not None:
        payload["tr"] = grant.trip_reason
    if grant.carved:
        payload["cv"] = 1
    if grant.ledger_id is not None:
        payload["l"] = grant.ledger_id
        payload["a"] = [_level_json(level) for level in grant.path]
        if grant.pools:
            payload["p"] = [_pool_json(pool) for pool in grant.pools]
    body = _b64encode(json.dumps(payload, separators=(",", ":")).encode("utf-8"))
    signed = f"{signer.kid}.{body}"
    return f"{signed}.{_b64encode(_mac(signer.secret, _GRANT_TAG, signed.encode('ascii')))}"


def verify_grant(
    raw: str | None,
    keys: Any,
    *,
    audience: str | tuple[str, ...] | None,
    now: float | None = None,
    max_bytes: int = MAX_GRANT_BYTES,
    replay_cache: NonceCache | None = None,
) -> Grant | None:
    """Return the grant in ``raw`` if it can be trusted, else None.

    Rejected (and counted on ``veronica.grants.rejected``, and logged):
    no signature (``unsigned``), a key id not among ``keys``
    (``unknown_key``), a wrong signature (``bad_signature``, compared in
    constant time), addressed to another service (``wrong_audience``), past
    its expiry (``expired``), issued more than 30 s in the future
    (``not_yet_valid``), longer than ``max_bytes`` (``oversized``),
    undecodable or out of range (``malformed``), a nonce already accepted in
    this process (``replayed``), or no key to check it with (``no_key``).

    Args:
        raw: The ``veronica.grant`` baggage value.
        keys: The keys (a :class:`GrantKeys`, a secret or a mapping).
        audience: The names this service answers to (``host[:port]``);
            None accepts any audience (tests and tools only).
        now: Unix time (``time.time()`` by default).
        max_bytes: Longest grant accepted.
        replay_cache: Nonces already accepted (the process-wide cache by default).
    """
    wall = time.time() if now is None else now
    result = _verify(raw, keys, wall, max_bytes)
    if isinstance(result, str):
        record_rejection(result)
        return None
    if audience is not None:
        names = (audience,) if isinstance(audience, str) else audience
        if result.audience not in names:
            record_rejection("wrong_audience", result.chain_id)
            return None
    cache = replay_cache if replay_cache is not None else _PROCESS_NONCES
    if not cache.add(result.nonce, result.expires_at, wall):
        record_rejection("replayed", result.chain_id)
        return None
    return result


def _verify(raw: str | None, keys: Any, now: float, max_bytes: int) -> Grant | str:
    if raw is None or not raw:
        return "unsigned"
    if len(raw) > max_bytes:
        return "oversized"
    if keys is None:
        return "no_key"
    parts = raw.split(".")
    if len(parts) != 3 or not all(parts):
        return "unsigned" if len(parts) < 3 else "malformed"
    kid, body, signature = parts
    try:
        secret = coerce_keys(keys).get(kid)
        if secret is None:
            return "unknown_key"
        expected = _mac(secret, _GRANT_TAG, f"{kid}.{body}".encode("ascii"))
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
        or not all(c.isalnum() or c in "-_.:" for c in value.replace(GRANT_MARK, ":"))
    ):
        raise ValueError("bad chain id")  # a request chain (``:grant/``) may grant further
    return value


def _level_json(level: Level) -> list[Any]:
    limits = level.limits
    return [level.chain_id, limits.cost_nano, limits.steps, limits.tokens, limits.retries]


def _pool_json(pool: PoolLevel) -> list[Any]:
    limits = pool.limits
    return [pool.name, limits.cost_nano, limits.steps, limits.tokens, pool.window_s]


def _pool(item: object) -> PoolLevel:
    if not isinstance(item, list) or len(item) != 5:
        raise ValueError("bad pool")
    name, window = item[0], item[4]
    try:
        check_pool_name(name)
    except TypeError:
        raise ValueError("bad pool name") from None
    counts = []
    for value in item[1:4]:
        if value is not None and (type(value) is not int or not 0 <= value <= MAX_COUNT):
            raise ValueError("bad pool limit")
        counts.append(value)
    bucket_s: float | None = None
    if window is not None:
        if type(window) not in (int, float):
            raise ValueError("bad pool window")
        window, bucket_s = check_window(float(window))  # ValueError when out of range
    cost, steps, tokens = counts
    return PoolLevel(name, Limits(cost_nano=cost, steps=steps, tokens=tokens), window, bucket_s)


def _level(item: object) -> Level:
    if not isinstance(item, list) or len(item) != 5:
        raise ValueError("bad level")
    counts = []
    for value in item[1:]:
        if value is not None and (type(value) is not int or not 0 <= value <= MAX_COUNT):
            raise ValueError("bad level limit")
        counts.append(value)
    cost, steps, tokens, retries = counts
    return Level(_chain_id(item[0]), Limits(cost, steps, retries, tokens))


def _audience(value: object) -> str:
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= 262
        or not value.isascii()
        or any(c in value for c in " ,;/?#@\t\r\n")
    ):
        raise ValueError("bad audience")
    return value


def _decode(payload: object) -> Grant:
    if not isinstance(payload, dict) or payload.get("v") != 2:
        raise ValueError("unknown grant version")
    nonce = payload["n"]
    if not isinstance(nonce, str) or not 8 <= len(nonce) <= 64 or not nonce.isascii():
        raise ValueError("bad nonce")
    if not all(c.isalnum() or c in "-_" for c in nonce):
        raise ValueError("bad nonce")
    trip_reason = payload.get("tr")
    if trip_reason is not None and trip_reason not in REASONS:
        raise ValueError("bad trip reason")
    carved = payload.get("cv", 0)
    if carved not in (0, 1) or type(carved) is not int:
        raise ValueError("bad carve flag")
    ledger_id = payload.get("l")
    path: tuple[Level, ...] = ()
    pools: tuple[PoolLevel, ...] = ()
    if ledger_id is not None:
        if not isinstance(ledger_id, str) or not 0 < len(ledger_id) <= 128:
            raise ValueError("bad ledger id")
        listed = payload.get("a", [])
        if not isinstance(listed, list) or not 0 < len(listed) <= MAX_ANCESTORS:
            raise ValueError("bad path")
        path = tuple(_level(item) for item in listed)
        if path[-1].chain_id != payload["c"]:
            raise ValueError("the path must end at the caller's chain")
        pooled = payload.get("p", [])
        if not isinstance(pooled, list) or len(pooled) > MAX_GRANT_POOLS:
            raise ValueError("bad pools")
        pools = tuple(_pool(item) for item in pooled)
        if len({pool.name for pool in pools}) != len(pools):
            raise ValueError("a pool listed twice")
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
        audience=_audience(payload["aud"]),
        trip_reason=trip_reason,
        carved=bool(carved),
        ledger_id=ledger_id,
        path=path,
        pools=pools,
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
        _rejected.add(1, {GRANT_REASON: reason})
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


def record_spent_rejection(reason: str, chain_id: str) -> None:
    """Count a spend-back the caller did not trust, and log it (never raises)."""
    try:
        _spent_rejected.add(1, {GRANT_REASON: reason})
        _logger.warning(
            "veronica-otel: %s header not trusted (%s); chain %s is charged the whole carve",
            SPENT_HEADER,
            reason,
            chain_id,
        )
    except Exception:
        _logger.debug("recording a spend-back rejection failed", exc_info=True)


# -- spent header ---------------------------------------------------------------------------

_SPENT_COUNTS = ("cost_nano", "tokens", "steps", "retries")


def sign_spent(spent: Spent, nonce: str, audience: str, keys: Any) -> str:
    """The signed ``veronica-spent`` value answering the grant ``nonce`` sent to ``audience``."""
    signer = coerce_keys(keys)
    text = (
        f"v=2;cost_nano={spent.cost_nano};tokens={spent.tokens};steps={spent.steps};"
        f"retries={spent.retries};nonce={nonce};aud={audience};kid={signer.kid}"
    )
    mac = _mac(signer.secret, _SPENT_TAG, text.encode("ascii"))
    return f"{text};sig={_b64encode(mac)}"


def verify_spent(raw: str | None, keys: Any, nonce: str, audience: str) -> Spent | str:
    """Parse a ``veronica-spent`` value: the :class:`Spent`, or why it is not trusted.

    Trusted only when signed by one of ``keys`` and bound to the grant
    ``nonce`` and ``audience``; a reason from :data:`SPENT_REJECTION_REASONS`
    otherwise. Every count is 0 to 10**15.
    """
    if raw is None:
        return "missing"
    if not raw or len(raw) > MAX_SPENT_BYTES or not raw.isascii():
        return "malformed"
    text, marker, signature = raw.rpartition(";sig=")
    if not marker:
        return "malformed"
    try:
        fields: dict[str, str] = {}
        for part in text.split(";"):
            name, equals, value = part.partition("=")
            if not equals or name in fields:
                return "malformed"
            fields[name] = value
        if fields.get("v") != "2" or "kid" not in fields:
            return "malformed"
        secret = coerce_keys(keys).get(fields["kid"])
        if secret is None:
            return "unknown_key"
        if not hmac.compare_digest(_mac(secret, _SPENT_TAG, text.encode()), _b64decode(signature)):
            return "bad_signature"
        if not (
            hmac.compare_digest(fields.get("nonce", "").encode(), nonce.encode())
            and hmac.compare_digest(fields.get("aud", "").encode(), audience.encode())
        ):
            return "wrong_grant"
        values = {}
        for name in _SPENT_COUNTS:
            digits = fields[name]
            if not digits.isdigit() or len(digits) > 16:
                return "malformed"
            values[name] = int(digits)
    except (ValueError, KeyError, binascii.Error):
        return "malformed"
    if any(value > MAX_COUNT for value in values.values()):
        return "malformed"
    return Spent(**values)
