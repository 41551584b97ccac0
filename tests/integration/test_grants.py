"""Signed budget grants: what is trusted, what is ignored, and that each rejection counts.

The wire format is rebuilt here from its documentation (key id, a dot,
base64url JSON, a dot, base64url HMAC-SHA256 over ``veronica-grant.v2.`` +
key id + ``.`` + payload), so a change to it breaks these tests on purpose.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import threading
import time
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from veronica_otel import (
    BudgetExceededError,
    BudgetPool,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    LocalLedger,
    WrapOptions,
)
from veronica_otel._grants import (
    GRANT_KEY_ENV,
    GRANT_KEYS_ENV,
    Grant,
    GrantKeys,
    NonceCache,
    Spent,
    grant_key_from_env,
    sign_grant,
    sign_spent,
    verify_grant,
    verify_spent,
)
from veronica_otel._ledger import Level, Limits
from veronica_otel._remote import MAX_CARVE_STEPS, GrantLimits, issue_grant, join_chain, settle
from veronica_otel.distributed import RedisLedger
from veronica_otel.distributed._keys import KeySpace, tree_tag

KEY = b"grant-key-for-tests-0123456789ab"
KID = GrantKeys.single(KEY).kid
AUD = "orders.internal:8001"
NOW = 1_800_000_000.0


def make_grant(**overrides: Any) -> Grant:
    fields: dict[str, Any] = {
        "chain_id": "chain-a",
        "depth": 0,
        "nonce": "nonce-0001",
        "issued_at": int(NOW),
        "expires_at": int(NOW) + 60,
        "audience": AUD,
        "steps": 2,
        "cost_nano": 500_000_000,
        "carved": True,
    }
    fields.update(overrides)
    return Grant(**fields)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forge(payload: object, key: bytes = KEY, kid: str = KID) -> str:
    """A grant signed by the documented format, with any payload."""
    body = b64(json.dumps(payload).encode())
    mac = hmac.new(key, f"veronica-grant.v2.{kid}.{body}".encode(), hashlib.sha256).digest()
    return f"{kid}.{body}.{b64(mac)}"


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
    assert verify_grant(raw, KEY, now=NOW, audience=AUD, replay_cache=cache) == grant


def test_the_wire_format_is_as_documented(cache: NonceCache) -> None:
    raw = forge(
        {"v": 2, "c": "chain-a", "d": 1, "n": "nonce-0002", "aud": AUD, "iat": 1, "exp": 2**40}
    )
    grant = verify_grant(raw, KEY, now=NOW, audience=AUD, replay_cache=cache)
    assert grant is not None
    assert (grant.chain_id, grant.depth, grant.steps, grant.cost_nano) == ("chain-a", 1, None, None)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        pytest.param(sign_grant(make_grant(), b"another-key-0123456789abcdef"), "unknown_key"),
        pytest.param(sign_grant(make_grant(), KEY).split(".")[0], "unsigned"),
        pytest.param("", "unsigned"),
        pytest.param(sign_grant(make_grant(expires_at=int(NOW) - 1), KEY), "expired"),
        pytest.param(
            sign_grant(make_grant(issued_at=int(NOW) + 3600, expires_at=int(NOW) + 3660), KEY),
            "not_yet_valid",
        ),
        pytest.param("a" * 5000, "oversized"),
        pytest.param(f"{KID}.e30.not*base64", "malformed"),
        pytest.param(forge({"v": 3, "c": "a", "d": 0, "n": "nonce-0003"}), "malformed"),
        pytest.param(
            forge({"v": 2, "c": "a", "d": 0, "n": "nonce-0008", "iat": 1, "exp": 2**40}),
            "malformed",  # no audience
        ),
        pytest.param(forge({"v": 2}, kid="someone-else"), "unknown_key"),
        pytest.param(forge({"v": 2}, key=b"x" * 32), "bad_signature"),
        pytest.param(sign_grant(make_grant(audience="billing.internal"), KEY), "wrong_audience"),
        pytest.param(forge(["not", "an", "object"]), "malformed"),
        pytest.param(forge({"v": 1, "c": "bad id!", "d": 0, "n": "nonce-0004"}), "malformed"),
        pytest.param(
            forge(
                {
                    "v": 2,
                    "c": "a",
                    "d": 0,
                    "n": "nonce-0005",
                    "aud": AUD,
                    "iat": 1,
                    "exp": 2**40,
                    "s": -1,
                }
            ),
            "malformed",
        ),
        pytest.param(
            forge(
                {
                    "v": 2,
                    "c": "a",
                    "d": 0,
                    "n": "nonce-0006",
                    "aud": AUD,
                    "iat": 1,
                    "exp": 2**40,
                    "s": True,
                }
            ),
            "malformed",
        ),
        pytest.param(
            forge(
                {
                    "v": 2,
                    "c": "a",
                    "d": 0,
                    "n": "nonce-0007",
                    "aud": AUD,
                    "iat": 1,
                    "exp": 2**40,
                    "tr": "x",
                }
            ),
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
        assert (
            verify_grant(raw, KEY, now=NOW, max_bytes=2048, audience=AUD, replay_cache=cache)
            is None
        )
    assert rejections_since(metric_reader, before) == {reason: 1}
    assert f"budget grant rejected ({reason})" in caplog.text


def test_a_tampered_payload_fails_the_signature(
    cache: NonceCache, metric_reader: InMemoryMetricReader
) -> None:
    kid, body, sig = sign_grant(make_grant(steps=1), KEY).split(".")
    richer = sign_grant(make_grant(steps=1_000_000), KEY).split(".")[1]
    before = rejected(metric_reader)
    tampered = f"{kid}.{richer}.{sig}"
    assert verify_grant(tampered, KEY, now=NOW, audience=AUD, replay_cache=cache) is None
    assert rejections_since(metric_reader, before) == {"bad_signature": 1}
    genuine = f"{kid}.{body}.{sig}"
    assert verify_grant(genuine, KEY, now=NOW, audience=AUD, replay_cache=cache) is not None


def test_a_replayed_grant_is_ignored(
    cache: NonceCache, metric_reader: InMemoryMetricReader
) -> None:
    raw = sign_grant(make_grant(), KEY)
    before = rejected(metric_reader)
    assert verify_grant(raw, KEY, now=NOW, audience=AUD, replay_cache=cache) is not None
    assert verify_grant(raw, KEY, now=NOW + 1, audience=AUD, replay_cache=cache) is None
    assert rejections_since(metric_reader, before) == {"replayed": 1}
    # The nonce is remembered per process (here: per cache).
    assert verify_grant(raw, KEY, now=NOW, audience=AUD, replay_cache=NonceCache()) is not None


def test_no_key_means_no_grant_is_trusted(
    cache: NonceCache, metric_reader: InMemoryMetricReader
) -> None:
    before = rejected(metric_reader)
    assert (
        verify_grant(sign_grant(make_grant(), KEY), None, now=NOW, audience=AUD, replay_cache=cache)
        is None
    )
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
    single = grant_key_from_env({GRANT_KEY_ENV: "k" * 16})
    assert single is not None and single.get(single.kid) == b"k" * 16
    assert single.kid == GrantKeys.single("k" * 16).kid  # derived: the same in every process
    with pytest.raises(ValueError, match=GRANT_KEY_ENV):
        grant_key_from_env({GRANT_KEY_ENV: "short"})
    with pytest.raises(ValueError, match="grant_key"):
        sign_grant(make_grant(), b"short")


@pytest.mark.parametrize(
    "value",
    [
        "no-colon-here-0123456789",
        "kid1:short",
        "bad kid:0123456789abcdef0123",
        "k1:0123456789abcdef0123,k1:fedcba9876543210fedc",  # a key id twice
        ":0123456789abcdef0123",
    ],
)
def test_every_malformed_key_list_names_its_variable(value: str) -> None:
    with pytest.raises(ValueError, match=GRANT_KEYS_ENV) as caught:
        grant_key_from_env({GRANT_KEYS_ENV: value})
    assert "0123456789abcdef" not in str(caught.value)  # never a secret in a message


def test_two_keys_rotate_the_first_signs_and_both_verify(cache: NonceCache) -> None:
    old_secret, new_secret = "old-secret-0123456789abcd", "new-secret-0123456789abcd"
    before = grant_key_from_env({GRANT_KEYS_ENV: f"k1:{old_secret}"})
    during = grant_key_from_env({GRANT_KEYS_ENV: f"k2:{new_secret}, k1:{old_secret}"})
    after = grant_key_from_env({GRANT_KEYS_ENV: f"k2:{new_secret}"})
    assert before is not None and during is not None and after is not None
    assert (during.kid, during.kids) == ("k2", ("k2", "k1"))
    # A service on the old key and one mid-rotation understand each other both ways.
    old_grant = sign_grant(make_grant(nonce="nonce-rot-1"), before)
    assert old_grant.startswith("k1.")
    assert verify_grant(old_grant, during, now=NOW, audience=AUD, replay_cache=cache) is not None
    new_grant = sign_grant(make_grant(nonce="nonce-rot-2"), during)
    assert new_grant.startswith("k2.")
    assert verify_grant(new_grant, after, now=NOW, audience=AUD, replay_cache=cache) is not None
    # Once k1 is retired, what it signs is refused.
    retired = sign_grant(make_grant(nonce="nonce-rot-3"), before)
    assert verify_grant(retired, after, now=NOW, audience=AUD, replay_cache=cache) is None
    assert "secret" not in repr(during)


def test_the_spent_header_is_signed_and_bound_to_the_grant_and_audience() -> None:
    used = Spent(cost_nano=1234, tokens=56, steps=2, retries=1)
    raw = sign_spent(used, "nonce-0001", AUD, KEY)
    assert raw.startswith(
        f"v=2;cost_nano=1234;tokens=56;steps=2;retries=1;nonce=nonce-0001;aud={AUD};kid={KID};sig="
    )
    text, sig = raw.split(";sig=")
    mac = hmac.new(KEY, f"veronica-spent.v2.{text}".encode(), hashlib.sha256).digest()
    assert sig == b64(mac)
    assert verify_spent(raw, KEY, "nonce-0001", AUD) == used
    assert verify_spent(raw, KEY, "nonce-0002", AUD) == "wrong_grant"  # replayed from another
    assert verify_spent(raw, KEY, "nonce-0001", "billing.internal") == "wrong_grant"
    assert verify_spent(None, KEY, "nonce-0001", AUD) == "missing"
    other = GrantKeys([(KID, b"another-key-0123456789abcdef")])
    assert verify_spent(raw, other, "nonce-0001", AUD) == "bad_signature"  # forged
    assert verify_spent(raw, {"k9": KEY}, "nonce-0001", AUD) == "unknown_key"
    inflated = raw.replace("cost_nano=1234", "cost_nano=1000000000000000")
    assert verify_spent(inflated, KEY, "nonce-0001", AUD) == "bad_signature"
    assert verify_spent(raw.split(";sig=")[0], KEY, "nonce-0001", AUD) == "malformed"
    assert verify_spent("x" * 1000, KEY, "nonce-0001", AUD) == "malformed"
    # Signed, but outside every bound: never read.
    huge = sign_spent(Spent(cost_nano=10**16), "nonce-0001", AUD, KEY)
    assert verify_spent(huge, KEY, "nonce-0001", AUD) == "malformed"
    # The old shared=1 field is gone: it is not a way to be counted as zero.
    old = "cost_nano=5;tokens=0;steps=1;retries=0;shared=1;nonce=nonce-0001;sig=AAAA"
    assert verify_spent(old, KEY, "nonce-0001", AUD) == "malformed"


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
    shared=st.none() | st.tuples(_ids, st.lists(_ids, min_size=0, max_size=7)),
    carved=st.booleans(),
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
    carved: bool,
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
        audience=AUD,
        carved=carved,
        ledger_id=shared[0] if shared else None,
        path=(
            *(Level(c, Limits(steps=i, cost_nano=cost_nano)) for i, c in enumerate(shared[1])),
            Level(chain_id, Limits(steps=steps, tokens=tokens, retries=retries)),
        )
        if shared
        else (),
    )
    raw = sign_grant(grant, KEY)
    assert (
        verify_grant(raw, KEY, now=NOW, max_bytes=10_000, audience=AUD, replay_cache=NonceCache())
        == grant
    )
    # Any single changed character of the signed text is refused.
    flipped = raw[:-1] + ("A" if raw[-1] != "A" else "B")
    assert (
        verify_grant(
            flipped, KEY, now=NOW, max_bytes=10_000, audience=AUD, replay_cache=NonceCache()
        )
        is None
    )


def test_a_rejection_log_never_echoes_an_attackers_text(caplog: pytest.LogCaptureFixture) -> None:
    from veronica_otel._grants import record_rejection

    with caplog.at_level(logging.WARNING, logger="veronica_otel.grants"):
        record_rejection("unsigned", "chain-1\nERROR forged log line")
        record_rejection("unsigned", "chain-2")
    assert "forged" not in caplog.text
    assert "(unsigned); the request" in caplog.text
    assert "for chain chain-2" in caplog.text


# -- carving a grant out of the caller's chain, and settling it -----------------------


class CountingLedger(LocalLedger):
    """A local ledger that counts the reserving and settling operations made on it."""

    def __init__(self) -> None:
        super().__init__()
        self.reserves = 0
        self.settles = 0

    def reserve(self, path: Any, cost_nano: int, tokens: int, **kwargs: Any) -> Any:
        self.reserves += 1
        return super().reserve(path, cost_nano, tokens, **kwargs)

    def commit(self, path: Any, reservation: Any, cost_nano: int, tokens: int, **kw: Any) -> Any:
        self.settles += 1
        return super().commit(path, reservation, cost_nano, tokens, **kw)

    def release(self, path: Any, reservation: Any) -> None:
        self.settles += 1
        super().release(path, reservation)


def caller(**limits: Any) -> ExecutionContext:
    return ExecutionContext(ExecutionConfig(**limits), ledger=CountingLedger())


def grant_all_at_once(ctx: ExecutionContext, n: int, caps: GrantLimits) -> list[Grant | str]:
    """``n`` threads issue a grant at the same moment."""
    barrier = threading.Barrier(n)
    results: list[Grant | str] = []

    def one() -> None:
        barrier.wait()
        try:
            results.append(issue_grant(ctx, audience=AUD, limits=caps)[0])
        except BudgetExceededError as exc:
            assert not exc.trip.sticky  # nothing left to grant does not stop the chain
            results.append(exc.reason)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return results


@pytest.mark.parametrize("n", [8, 32])
def test_concurrent_grants_never_carve_more_than_the_chain_has(n: int) -> None:
    ctx = caller(max_steps=4, max_cost_usd=1.0)
    results = grant_all_at_once(ctx, n, GrantLimits(steps=1, cost_nano=100_000_000))
    granted = [r for r in results if isinstance(r, Grant)]
    assert len(granted) == 4 and results.count("steps") == n - 4
    assert all((g.steps, g.cost_nano, g.carved) == (1, 100_000_000, True) for g in granted)
    snap = ctx.snapshot()
    assert (snap.steps, snap.reserved_usd, snap.aborted) == (4, pytest.approx(0.4), False)


def test_a_grant_carves_all_that_is_left_unless_capped() -> None:
    ctx = caller(max_steps=4, max_cost_usd=1.0, max_tokens=500)
    results = grant_all_at_once(ctx, 8, GrantLimits())
    granted = [r for r in results if isinstance(r, Grant)]
    assert len(granted) == 1  # the first takes everything; the others wait their turn
    assert (granted[0].steps, granted[0].cost_nano, granted[0].tokens) == (4, 10**9, 500)


def test_the_spend_back_settles_the_carve_and_the_rest_is_released() -> None:
    ctx = caller(max_steps=5, max_cost_usd=1.0)
    grant, carve = issue_grant(ctx, audience=AUD, limits=GrantLimits(steps=3, cost_nano=3 * 10**8))
    assert carve is not None and (grant.steps, ctx.snapshot().steps) == (3, 3)
    settle(carve, Spent(cost_nano=10**8, tokens=7, steps=1))
    snap = ctx.snapshot()
    assert (snap.steps, snap.cost_usd, snap.tokens, snap.reserved_usd) == (1, 0.1, 7, 0)
    settle(carve, Spent(steps=3))  # settles once: a second answer changes nothing
    assert ctx.snapshot().steps == 1


def test_a_missing_spend_back_commits_the_whole_carve() -> None:
    ctx = caller(max_steps=5, max_cost_usd=1.0)
    _, carve = issue_grant(ctx, audience=AUD, limits=GrantLimits(steps=3, cost_nano=3 * 10**8))
    assert carve is not None
    settle(carve, None)
    snap = ctx.snapshot()
    assert (snap.steps, snap.cost_usd, snap.reserved_usd) == (3, 0.3, 0)


def test_an_inflated_spend_back_is_capped_at_the_carve_in_two_ledger_operations(
    metric_reader: InMemoryMetricReader,
) -> None:
    ctx = caller(max_steps=100, max_cost_usd=1.0)
    ledger = ctx._state.ledger
    assert isinstance(ledger, CountingLedger)
    caps = GrantLimits(steps=MAX_CARVE_STEPS, cost_nano=2 * 10**8)
    grant, carve = issue_grant(ctx, audience=AUD, limits=caps)
    assert carve is not None and (grant.steps, ctx.snapshot().steps) == (MAX_CARVE_STEPS, 32)
    settle(carve, Spent(cost_nano=10**15, tokens=10**15, steps=100_000, retries=100_000))
    snap = ctx.snapshot()
    assert (snap.steps, snap.cost_usd, snap.aborted) == (MAX_CARVE_STEPS, 0.2, False)
    # One reserve carves all 32 steps, one commit settles them: never one per step.
    assert (ledger.reserves, ledger.settles) == (1, 1)
    assert spent_rejections(metric_reader).get("over_carve", 0) >= 1


@pytest.mark.parametrize(("used", "counted"), [(0, 0), (1, 1), (7, 7), (32, 32)])
def test_settling_gives_back_the_unused_carved_steps_in_one_operation(
    used: int, counted: int
) -> None:
    ctx = caller(max_steps=40)
    ledger = ctx._state.ledger
    assert isinstance(ledger, CountingLedger)
    _, carve = issue_grant(ctx, audience=AUD, limits=GrantLimits(steps=MAX_CARVE_STEPS))
    assert carve is not None and ctx.snapshot().steps == MAX_CARVE_STEPS
    settle(carve, Spent(steps=used))
    assert (ctx.snapshot().steps, ledger.reserves, ledger.settles) == (counted, 1, 1)


def test_nothing_is_granted_from_a_stopped_chain() -> None:
    ctx = caller(max_steps=1)
    ctx.begin_call("tool").finish()
    with pytest.raises(BudgetExceededError) as caught:
        issue_grant(ctx, audience=AUD)
    assert caught.value.reason == "steps"


def spent_rejections(reader: InMemoryMetricReader) -> dict[str, int]:
    counts: dict[str, int] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "veronica.grants.spent_rejected":
                    for point in metric.data.data_points:
                        reason = str(point.attributes["veronica.grant.reason"])
                        counts[reason] = counts.get(reason, 0) + int(point.value)
    return counts


# -- shared Redis ledger: ids and hash tags ---------------------------------------------


def test_a_request_chain_is_in_its_callers_tree_and_slot() -> None:
    space = KeySpace("veronica:")
    path = [
        Level("job-42", Limits()),
        Level("job-42.1", Limits()),
        Level("job-42.1:Ab3-x_9", Limits()),
    ]
    keys = space.tree(path)  # one tree: no ValueError
    assert {k.chain.split("}")[0] for k in keys} == {"veronica:{job-42"}
    assert tree_tag("job-42:nonce:other") == tree_tag("job-42.3") == "job-42"
    with pytest.raises(ValueError, match="':'"):
        space.chain(":no-root")


def test_a_redis_ledger_has_a_shared_id() -> None:
    client = redis.Redis(host="127.0.0.1", port=1)  # never contacted
    one = RedisLedger(client)
    assert one.shared_id == RedisLedger(redis.Redis(host="127.0.0.1", port=1)).shared_id
    assert one.shared_id != RedisLedger(client, key_prefix="other:").shared_id
    assert one.shared_id is not None and one.shared_id.startswith("redis:")
    assert RedisLedger(client, shared_id="ledger-eu-1").shared_id == "ledger-eu-1"
    with pytest.raises(ValueError, match="shared_id"):
        RedisLedger(client, shared_id="")


def test_per_grant_caps_come_from_arguments_or_the_environment() -> None:
    from veronica_otel.instrumentors._outbound import Propagation

    env = {"VERONICA_GRANT_MAX_STEPS": "2", "VERONICA_GRANT_MAX_COST_USD": "0.25"}
    limits = Propagation(environ=env).limits
    assert (limits.steps, limits.cost_nano, limits.tokens) == (2, 250_000_000, None)
    assert Propagation(grant_max_steps=1, environ=env).limits.steps == 1
    for var, value in (
        ("VERONICA_GRANT_MAX_STEPS", "two"),
        ("VERONICA_GRANT_MAX_STEPS", "-1"),
        ("VERONICA_GRANT_MAX_COST_USD", "nan"),
        ("VERONICA_GRANT_MAX_TOKENS", "1.5"),
    ):
        with pytest.raises(ValueError, match=var):
            Propagation(environ={var: value})
    with pytest.raises(ValueError, match="grant_max_steps"):
        Propagation(grant_max_steps=-1)


# -- shared Redis ledger: the caller's budget pools travel with the grant --------------


def test_on_a_shared_ledger_the_service_charges_the_callers_pools(
    redis_url: str, redis_prefix: str, cache: NonceCache
) -> None:
    """Nothing is carved on a shared ledger, so the grant names the caller's pools:
    the service's calls for the request are reserved in them, exactly."""
    ledger = RedisLedger(redis.Redis.from_url(redis_url), key_prefix=redis_prefix)
    tenant = BudgetPool("tenant:acme", max_steps=3, window="1h", ledger=ledger)
    hint = WrapOptions(cost_estimate_hint=0.001)
    with ExecutionContext(ExecutionConfig(max_steps=50), ledger=ledger, pools=[tenant]) as ctx:
        ctx.wrap_llm_call(lambda: None, hint)  # the caller's own call: 1 of the pool's 3
        grant, carve = issue_grant(ctx, audience=AUD)
    assert carve is None and [pool.name for pool in grant.pools] == ["tenant:acme"]
    # Over the wire and back, as service B reads it.
    received = verify_grant(sign_grant(grant, KEY), KEY, audience=AUD, replay_cache=cache)
    assert received is not None and received.pools == grant.pools
    request = join_chain(
        ExecutionConfig(), received, ledger=ledger, pipeline=None, now=time.time(), shared=True
    )
    decisions = [request.wrap_llm_call(lambda: None, hint) for _ in range(4)]
    assert decisions.count(Decision.ALLOW) == 2  # the pool's 3 steps, caller's included
    denial = request.trip
    assert denial is not None and denial.pool == "tenant:acme"
    assert tenant.snapshot().steps == 3
    ledger.close()


@pytest.mark.parametrize(
    "pools",
    [
        "tenant:acme",
        [["tenant acme", None, 3, None, None]],  # a name no pool may have
        [["t", -1, None, None, None]],
        [["t", None, True, None, None]],
        [["t", None, None, None, 0.5]],  # a window under a second
        [["t", None, None, None, "1h"]],
        [["t", None, 1, None, None]] * 2,
        [["t" + str(i), None, 1, None, None] for i in range(17)],
    ],
)
def test_a_grant_with_malformed_pools_is_not_trusted(pools: object, cache: NonceCache) -> None:
    payload = {
        "v": 2,
        "c": "chain-a",
        "d": 0,
        "n": "nonce-pools",
        "aud": AUD,
        "iat": int(NOW),
        "exp": int(NOW) + 60,
        "l": "ledger-1",
        "a": [["chain-a", None, 5, None, None]],
        "p": pools,
    }
    assert verify_grant(forge(payload), KEY, now=NOW, audience=AUD, replay_cache=cache) is None
