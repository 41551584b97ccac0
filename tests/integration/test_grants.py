"""Signed budget grants: what is trusted, what is ignored, and that each rejection counts.

The wire format is rebuilt here from its documentation (base64url JSON, a dot,
base64url HMAC-SHA256 over ``veronica-grant.v1.`` + payload), so a change to
it breaks these tests on purpose.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from veronica_otel._grants import (
    GRANT_KEY_ENV,
    Grant,
    NonceCache,
    Spent,
    grant_key_from_env,
    sign_grant,
    sign_spent,
    verify_grant,
    verify_spent,
)

KEY = b"grant-key-for-tests-0123456789ab"
NOW = 1_800_000_000.0


def make_grant(**overrides: Any) -> Grant:
    fields: dict[str, Any] = {
        "chain_id": "chain-a",
        "depth": 0,
        "nonce": "nonce-0001",
        "issued_at": int(NOW),
        "expires_at": int(NOW) + 60,
        "steps": 2,
        "cost_nano": 500_000_000,
    }
    fields.update(overrides)
    return Grant(**fields)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forge(payload: object, key: bytes = KEY) -> str:
    """A grant signed by the documented format, with any payload."""
    body = b64(json.dumps(payload).encode())
    mac = hmac.new(key, b"veronica-grant.v1." + body.encode(), hashlib.sha256).digest()
    return f"{body}.{b64(mac)}"


def rejected(reader: InMemoryMetricReader) -> dict[str, int]:
    """Cumulative ``veronica.grants.rejected`` counts by reason."""
    counts: dict[str, int] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "veronica.grants.rejected":
                    for point in metric.data.data_points:
                        reason = str(point.attributes["veronica.grant.reason"])
                        counts[reason] = counts.get(reason, 0) + int(point.value)
    return counts


@pytest.fixture
def cache() -> NonceCache:
    return NonceCache()


def rejections_since(reader: InMemoryMetricReader, before: dict[str, int]) -> dict[str, int]:
    after = rejected(reader)
    return {r: v - before.get(r, 0) for r, v in after.items() if v - before.get(r, 0)}


def test_a_signed_grant_verifies_once(cache: NonceCache) -> None:
    grant = make_grant(tokens=1000, retries=1, max_depth=3, deadline_ms=int(NOW * 1000) + 5000)
    raw = sign_grant(grant, KEY)
    assert raw.isascii() and len(raw) < 400
    assert verify_grant(raw, KEY, now=NOW, replay_cache=cache) == grant


def test_the_wire_format_is_as_documented(cache: NonceCache) -> None:
    raw = forge({"v": 1, "c": "chain-a", "d": 1, "n": "nonce-0002", "iat": 1, "exp": 2**40})
    grant = verify_grant(raw, KEY, now=NOW, replay_cache=cache)
    assert grant is not None
    assert (grant.chain_id, grant.depth, grant.steps, grant.cost_nano) == ("chain-a", 1, None, None)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        pytest.param(sign_grant(make_grant(), b"another-key-0123456789abcdef"), "bad_signature"),
        pytest.param(sign_grant(make_grant(), KEY).split(".")[0], "unsigned"),
        pytest.param("", "unsigned"),
        pytest.param(sign_grant(make_grant(expires_at=int(NOW) - 1), KEY), "expired"),
        pytest.param(
            sign_grant(make_grant(issued_at=int(NOW) + 3600, expires_at=int(NOW) + 3660), KEY),
            "not_yet_valid",
        ),
        pytest.param("a" * 5000, "oversized"),
        pytest.param("e30.not*base64", "malformed"),
        pytest.param(forge({"v": 2, "c": "a", "d": 0, "n": "nonce-0003"}), "malformed"),
        pytest.param(forge(["not", "an", "object"]), "malformed"),
        pytest.param(forge({"v": 1, "c": "bad id!", "d": 0, "n": "nonce-0004"}), "malformed"),
        pytest.param(
            forge({"v": 1, "c": "a", "d": 0, "n": "nonce-0005", "iat": 1, "exp": 2**40, "s": -1}),
            "malformed",
        ),
        pytest.param(
            forge({"v": 1, "c": "a", "d": 0, "n": "nonce-0006", "iat": 1, "exp": 2**40, "s": True}),
            "malformed",
        ),
        pytest.param(
            forge({"v": 1, "c": "a", "d": 0, "n": "nonce-0007", "iat": 1, "exp": 2**40, "tr": "x"}),
            "malformed",
        ),
    ],
)
def test_untrusted_grants_are_ignored_counted_and_logged(
    raw: str,
    reason: str,
    cache: NonceCache,
    metric_reader: InMemoryMetricReader,
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = rejected(metric_reader)
    with caplog.at_level(logging.WARNING, logger="veronica_otel.grants"):
        assert verify_grant(raw, KEY, now=NOW, max_bytes=2048, replay_cache=cache) is None
    assert rejections_since(metric_reader, before) == {reason: 1}
    assert f"budget grant rejected ({reason})" in caplog.text


def test_a_tampered_payload_fails_the_signature(
    cache: NonceCache, metric_reader: InMemoryMetricReader
) -> None:
    body, sig = sign_grant(make_grant(steps=1), KEY).split(".")
    richer = sign_grant(make_grant(steps=1_000_000), KEY).split(".")[0]
    before = rejected(metric_reader)
    assert verify_grant(f"{richer}.{sig}", KEY, now=NOW, replay_cache=cache) is None
    assert rejections_since(metric_reader, before) == {"bad_signature": 1}
    assert verify_grant(f"{body}.{sig}", KEY, now=NOW, replay_cache=cache) is not None


def test_a_replayed_grant_is_ignored(
    cache: NonceCache, metric_reader: InMemoryMetricReader
) -> None:
    raw = sign_grant(make_grant(), KEY)
    before = rejected(metric_reader)
    assert verify_grant(raw, KEY, now=NOW, replay_cache=cache) is not None
    assert verify_grant(raw, KEY, now=NOW + 1, replay_cache=cache) is None
    assert rejections_since(metric_reader, before) == {"replayed": 1}
    # The nonce is remembered per process (here: per cache).
    assert verify_grant(raw, KEY, now=NOW, replay_cache=NonceCache()) is not None


def test_no_key_means_no_grant_is_trusted(
    cache: NonceCache, metric_reader: InMemoryMetricReader
) -> None:
    before = rejected(metric_reader)
    assert verify_grant(sign_grant(make_grant(), KEY), None, now=NOW, replay_cache=cache) is None
    assert rejections_since(metric_reader, before) == {"no_key": 1}


def test_the_nonce_cache_is_bounded_and_forgets_expired_nonces_first() -> None:
    cache = NonceCache(capacity=3)
    assert cache.add("live-1", 100, now=10)
    assert cache.add("dead-1", 5, now=1)
    assert cache.add("live-2", 100, now=10)
    assert cache.add("live-3", 100, now=10)  # over capacity: the expired one goes
    assert len(cache) == 3
    assert not cache.add("live-1", 100, now=10)
    assert cache.add("dead-1", 100, now=10)  # forgotten, and expired anyway
    assert len(cache) == 3
    with pytest.raises(ValueError, match="capacity"):
        NonceCache(capacity=0)


def test_the_key_comes_from_the_environment_and_must_be_long_enough() -> None:
    assert grant_key_from_env({}) is None
    assert grant_key_from_env({GRANT_KEY_ENV: "k" * 16}) == b"k" * 16
    with pytest.raises(ValueError, match=GRANT_KEY_ENV):
        grant_key_from_env({GRANT_KEY_ENV: "short"})
    with pytest.raises(ValueError, match="grant_key"):
        sign_grant(make_grant(), b"short")


def test_the_spent_header_is_signed_and_bound_to_the_grant() -> None:
    used = Spent(cost_nano=1234, tokens=56, steps=2, retries=1)
    raw = sign_spent(used, "nonce-0001", KEY)
    assert raw.startswith(
        "cost_nano=1234;tokens=56;steps=2;retries=1;shared=0;nonce=nonce-0001;sig="
    )
    assert verify_spent(raw, KEY, "nonce-0001") == used
    assert verify_spent(raw, KEY, "nonce-0002") is None  # answers another grant
    assert verify_spent(raw, b"another-key-0123456789abcdef", "nonce-0001") is None
    assert verify_spent(raw.replace("steps=2", "steps=9"), KEY, "nonce-0001") is None
    assert verify_spent(raw.split(";sig=")[0], KEY, "nonce-0001") is None
    assert verify_spent("x" * 1000, KEY, "nonce-0001") is None
    shared = sign_spent(Spent(steps=1, shared=True), "nonce-0001", KEY)
    assert verify_spent(shared, KEY, "nonce-0001") == Spent(steps=1, shared=True)


_ids = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:",
    min_size=1,
    max_size=128,
)
_counts = st.none() | st.integers(min_value=0, max_value=10**15)


@settings(max_examples=200, deadline=None)
@given(
    chain_id=_ids,
    depth=st.integers(min_value=0, max_value=10_000),
    nonce=st.text(alphabet="abcdefXYZ0123456789-_", min_size=8, max_size=64),
    cost_nano=_counts,
    steps=_counts,
    retries=_counts,
    tokens=_counts,
    max_depth=_counts,
    trip_reason=st.none() | st.sampled_from(["cost", "steps", "timeout", "depth"]),
    shared=st.none() | st.tuples(_ids, st.lists(_ids, max_size=8)),
)
def test_round_trip_property(
    chain_id: str,
    depth: int,
    nonce: str,
    cost_nano: int | None,
    steps: int | None,
    retries: int | None,
    tokens: int | None,
    max_depth: int | None,
    trip_reason: str | None,
    shared: tuple[str, list[str]] | None,
) -> None:
    grant = Grant(
        chain_id=chain_id,
        depth=depth,
        nonce=nonce,
        issued_at=int(NOW),
        expires_at=int(NOW) + 60,
        cost_nano=cost_nano,
        steps=steps,
        retries=retries,
        tokens=tokens,
        max_depth=max_depth,
        deadline_ms=None,
        trip_reason=trip_reason,
        ledger_id=shared[0] if shared else None,
        ancestors=tuple(shared[1]) if shared else (),
    )
    raw = sign_grant(grant, KEY)
    assert verify_grant(raw, KEY, now=NOW, max_bytes=10_000, replay_cache=NonceCache()) == grant
    # Any single changed character of the signed text is refused.
    flipped = raw[:-1] + ("A" if raw[-1] != "A" else "B")
    assert verify_grant(flipped, KEY, now=NOW, max_bytes=10_000, replay_cache=NonceCache()) is None


def test_a_rejection_log_never_echoes_an_attackers_text(caplog: pytest.LogCaptureFixture) -> None:
    from veronica_otel._grants import record_rejection

    with caplog.at_level(logging.WARNING, logger="veronica_otel.grants"):
        record_rejection("unsigned", "chain-1\nERROR forged log line")
        record_rejection("unsigned", "chain-2")
    assert "forged" not in caplog.text
    assert "(unsigned); the request" in caplog.text
    assert "for chain chain-2" in caplog.text
