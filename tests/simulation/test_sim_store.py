"""The in-memory store runs the ledger's scripts exactly as a real Valkey does.

The same seeded sequence of ledger operations (two-level paths, signatures
and repeat limits, overruns that trip, overrides, corrupted fields) runs on a
real ``valkey-server`` and on :class:`SimStore`: every reply, every snapshot
and the final keys must be equal. Plus the emulation's own edges: TTLs follow
the simulated clock, and a command it lacks fails loudly.
"""

from __future__ import annotations

import random
import time
from dataclasses import astuple, replace
from typing import Any

import pytest
import redis

from tests.simulation._sim_ledger import _deterministic_ids
from tests.simulation._sim_store import NotEmulatedError, SimClient, SimStore
from veronica_otel._errors import TripEvent
from veronica_otel._ledger import LedgerState, Level, Limits, Reservation
from veronica_otel.distributed import LedgerCorruptedError, RedisLedger
from veronica_otel.testing import RedisServerProcess

ROOT = Level("fid", Limits(cost_nano=6000, steps=60, retries=6, tokens=30000, repeats=3))
CHILD = Level("fid.1", Limits(cost_nano=3500, steps=35, tokens=None, repeats=2))


def _shown(value: Any) -> Any:
    if isinstance(value, TripEvent):
        return ("trip", value.reason, value.limit, value.observed, value.chain_id, value.message)
    if isinstance(value, Reservation):
        return ("rsv", value.id, value.cost_nano, value.tokens, value.step, value.retry)
    if isinstance(value, LedgerState):
        return (*astuple(replace(value, trip=None)), _shown(value.trip))
    return value


def _scenario(client: Any, prefix: str, ttl: float) -> list[Any]:
    """A seeded mix of every ledger operation; what each returned, in order."""
    rng = random.Random(20261201)
    ledger = RedisLedger(client, key_prefix=prefix, fail_open=False, reservation_ttl_s=ttl)
    out: list[Any] = []
    held: list[tuple[list[Level], Reservation]] = []
    for i in range(160):
        path = [ROOT, CHILD] if rng.random() < 0.6 else [ROOT]
        roll = rng.random()
        try:
            if i in (70, 71):  # a foreign value in a counter, then repaired
                value = "x1" if i == 70 else "0"
                client.execute_command("HSET", ledger.key(ROOT.chain_id), "rt", value)
                got: Any = ledger.reserve([ROOT, CHILD], 1, 1)
            elif roll < 0.45 or not held:
                got = ledger.reserve(
                    path,
                    rng.randint(0, 900),
                    rng.randint(0, 4000),
                    step=rng.random() < 0.9,
                    retry=rng.random() < 0.2,
                    signature=rng.choice([None, "a", "b", "c"]),
                )
                if isinstance(got, Reservation):
                    held.append((path, got))
            elif roll < 0.75:
                p, rsv = held.pop(rng.randrange(len(held)))
                over = rng.random() < 0.15  # usage above the reservation can trip
                cost = rng.randint(0, rsv.cost_nano * (3 if over else 1))
                got = ledger.commit(p, rsv, cost, rng.randint(0, rsv.tokens + 10))
            elif roll < 0.88:
                p, rsv = held.pop(rng.randrange(len(held)))
                got = ledger.release(p, rsv)
            elif roll < 0.93:
                got = ledger.override(
                    "fid", expires_at=time.time() + 3600, add_cost_nano=2000, add_steps=5
                )
            else:
                got = ledger.clear_trip(rng.choice(["fid", "fid.1"]))
        except LedgerCorruptedError as exc:
            got = ("corrupt", exc.key, exc.field, exc.value)
        out.append(_shown(got))
        out.append([_snapshot(ledger, c) for c in ("fid", "fid.1")])
    return out


def _snapshot(ledger: RedisLedger, chain_id: str) -> Any:
    try:
        return _shown(ledger.snapshot(chain_id))
    except LedgerCorruptedError as exc:
        return ("corrupt", exc.key, exc.field, exc.value)


def _keys(client: Any, prefix: str) -> dict[str, Any]:
    """Every key the ledger wrote: hashes in full (trip times cut), zset members."""
    found: dict[str, Any] = {}
    tree = prefix + "{fid}:"
    for suffix in ("c:fid", "c:fid.1", "s:fid", "s:fid.1", "rh"):
        flat = client.execute_command("HGETALL", tree + suffix)
        pairs = dict(zip(flat[::2], flat[1::2], strict=True)) if isinstance(flat, list) else flat
        pairs = {_text(k): _text(v) for k, v in pairs.items()}
        if "trip" in pairs:  # its time is the server's
            pairs["trip"] = pairs["trip"].split(',"time"')[0]
        pairs.pop("oe", None)  # the override's end, on the server's clock
        found[suffix] = pairs
    for suffix in ("o:fid", "o:fid.1", "rz"):
        scored = client.execute_command("ZRANGE", tree + suffix, 0, -1, "WITHSCORES")
        if scored and not isinstance(scored[0], (list, tuple)):  # flat, as Redis sends it
            scored = list(zip(scored[::2], scored[1::2], strict=True))
        pairs = [(_text(m), float(sc)) for m, sc in scored]
        # Expiry scores are server time: only the members can be compared.
        found[suffix] = [m for m, _ in pairs] if suffix == "rz" else pairs
    for suffix in ("c:fid", "rh", "rz"):
        found[suffix + " ttl"] = client.execute_command("PTTL", tree + suffix) > 0
    return found


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# With a reservation TTL of 0 every reservation is due at the next reserve on
# both stores (Valkey's clock moves, the emulation's stands still): the reaper
# and the late-commit markers run on every step.
@pytest.mark.parametrize("ttl", [600.0, 0.0])
def test_the_ledger_scripts_behave_on_the_emulation_exactly_as_on_valkey(
    redis_server: RedisServerProcess, redis_prefix: str, ttl: float
) -> None:
    real = redis.Redis.from_url(redis_server.url, decode_responses=True)
    sim = SimClient(SimStore(now_us=time.time_ns() // 1000))
    try:
        with _deterministic_ids(1):
            on_valkey = _scenario(real, redis_prefix, ttl)
        with _deterministic_ids(1):
            on_sim = _scenario(sim, redis_prefix, ttl)
        for i, (a, b) in enumerate(zip(on_valkey, on_sim, strict=True)):
            assert a == b, f"step {i // 2}: valkey {a!r} != emulation {b!r}"
        assert _keys(real, redis_prefix) == _keys(sim, redis_prefix)
        # The scenario reaches the interesting paths on both.
        kinds = {r[0] for r in on_sim[::2] if isinstance(r, tuple)}
        assert {"rsv", "trip", "corrupt"} <= kinds
    finally:
        real.close()


def test_keys_expire_on_the_simulated_clock() -> None:
    store = SimStore()
    client = SimClient(store)
    client.execute_command("HSET", "h", "f", "1")
    assert client.execute_command("PEXPIRE", "h", 1500) == 1
    store.advance(1_499_999)
    assert client.execute_command("HGET", "h", "f") == "1"
    assert client.execute_command("PTTL", "h") == 1
    store.advance(1)
    assert client.execute_command("HGET", "h", "f") is None
    assert client.execute_command("EXISTS", "h") == 0
    assert client.execute_command("TIME") == ["1700000001", "500000"]


def test_the_store_down_or_wiped_is_what_a_client_sees() -> None:
    store = SimStore()
    client = SimClient(store)
    client.execute_command("SET", "k", "v")
    store.up = False
    with pytest.raises(redis.ConnectionError):
        client.execute_command("GET", "k")
    store.up = True
    assert client.execute_command("GET", "k") == "v"
    store.wipe()
    assert client.execute_command("GET", "k") is None


def test_script_errors_and_wrong_types_reply_as_redis_does() -> None:
    client = SimClient(SimStore())
    client.execute_command("SET", "s", "x")
    with pytest.raises(redis.ResponseError, match=r"^WRONGTYPE"):
        client.execute_command("HGET", "s", "f")
    script = client.register_script(
        "local r = redis.pcall('HGET', KEYS[1], 'f')\n"
        "if type(r) == 'table' and r.err then return {1, r.err} end\n"
        "error({err = 'MINE\\tfailed'})"
    )
    assert script(["s"], []) == [
        1,
        "WRONGTYPE Operation against a key holding the wrong kind of value",
    ]
    with pytest.raises(redis.ResponseError, match=r"^MINE\tfailed$"):
        script(["h"], [])
    assert client.register_script("return {1, false, 'a', 2.9, true}")() == [1, None, "a", 2, 1]
    assert client.register_script("return cjson.encode(ARGV[1])")([], ['a"b']) == '"a\\"b"'


def test_a_command_the_emulation_lacks_fails_loudly() -> None:
    client = SimClient(SimStore())
    script = client.register_script("return redis.pcall('XADD', KEYS[1], '*', 'f', 'v')")
    with pytest.raises(NotEmulatedError, match="XADD"):
        script(["stream"], [])
    with pytest.raises(NotEmulatedError, match="XADD"):
        client.execute_command("XADD", "stream", "*", "f", "v")
