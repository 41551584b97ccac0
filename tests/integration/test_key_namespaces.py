"""Chains, pools, agents and breakers never share a key, whatever the names.

The issue's repro: a chain named ``pools`` shared the store keys of the pool
records (``{pools}:rh``); after a holder of that chain was killed
mid-reservation, every pooled call of every tenant raised
``LedgerCorruptedError``. Pools now carry the tag ``{:pools}``, which no
chain tree's tag can be. A property test over generated hostile names checks
the key kinds are disjoint on the Redis ledger's key space and on the
in-process ledger; the repro runs on a real Valkey with the real SDK.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx2
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from veronica_otel import (
    BudgetPool,
    ExecutionConfig,
    ExecutionContext,
    LocalLedger,
    agent,
)
from veronica_otel._agent_limits import agent_level_id
from veronica_otel._ledger import Level, Limits
from veronica_otel.distributed import RedisLedger
from veronica_otel.distributed._keys import KeySpace
from veronica_otel.testing import FakeLLMServer

# What a user may give: chain ids and pool names as their constructors accept
# them, with the separators and the words our own keys use, and any agent name.
_WORDS = ["pools", ":pools", "p", "c", "s", "o", "rh", "rz", "ad", "agent", "breaker", "grant"]
_ID_TEXT = st.text(st.sampled_from("abcxyz019-_.:"), min_size=1, max_size=12) | st.sampled_from(
    _WORDS
)
chain_ids = (
    st.lists(_ID_TEXT, min_size=1, max_size=4)
    .map(":".join)
    .filter(lambda cid: cid[0] not in ".:" and len(cid) <= 128)
)
pool_names = (
    st.lists(
        _ID_TEXT | st.text(st.sampled_from("ab@/:.-"), min_size=1, max_size=6),
        min_size=1,
        max_size=3,
    )
    .map(":".join)
    .map(lambda name: name[:128])
)
agent_names = st.text(min_size=1, max_size=20).filter(
    lambda name: (
        name.strip()
        and not any(
            0xD800 <= ord(c) <= 0xDFFF or ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in name
        )
    )
) | st.sampled_from(["pools", "x/../y", "a:agent/b", "%2F", "/"])


def _valid_chain(cid: str) -> bool:
    return all(c.isalnum() or c in "-_.:" for c in cid) and cid.isascii()


@settings(max_examples=300, deadline=None)
@given(
    chains=st.lists(chain_ids.filter(_valid_chain), min_size=1, max_size=6),
    pools=st.lists(pool_names, max_size=4),
    agents=st.lists(agent_names, max_size=4),
)
def test_key_kinds_are_disjoint_for_any_names(
    chains: list[str], pools: list[str], agents: list[str]
) -> None:
    space = KeySpace("veronica:")
    kinds: dict[str, set[str]] = {"chain": set(), "agent": set(), "pool": set()}
    trees: dict[str, str] = {}  # a tree's shared records -> its tag
    for cid in chains:
        ExecutionContext(chain_id=cid, detached=True)  # accepted as a user's chain id
        keys = space.chain(cid)
        kinds["chain"] |= {keys.chain, keys.signatures, keys.recency}
        for shared in (keys.reservations, keys.expiries, keys.applied):
            trees[shared] = keys.base
        for name in agents:
            agent(name)  # accepted as an agent's name
            level = space.chain(agent_level_id(cid, name))
            assert level.base == keys.base  # one tree, one slot
            kinds["agent"] |= {level.chain, level.signatures, level.recency}
    for name in pools:
        BudgetPool(name)  # accepted as a pool's name
        kinds["pool"].add(f"veronica:{{:pools}}:p:{name}")
    pool_records = {f"veronica:{{:pools}}:{r}" for r in ("rh", "rz", "ad")}
    breaker = {f"veronica:breaker:{cid}" for cid in chains}
    groups = [*kinds.values(), pool_records, set(trees), breaker]
    for i, one in enumerate(groups):
        for other in groups[i + 1 :]:
            assert not one & other, one & other
    # In process: chains, agents and request chains joined under a grant are
    # kept by id (pools apart); no user-given chain id can be either of the others.
    agent_ids = {agent_level_id(c, n) for c in chains for n in agents}
    grant_ids = {_joined_id(c, n) for c in chains for n in ("a1B2c3D4e5F6", "pools")}
    for made in (*agent_ids, *grant_ids):
        with pytest.raises(ValueError, match="chain_id"):
            ExecutionContext(chain_id=made, detached=True)
    assert not (set(chains) & agent_ids or set(chains) & grant_ids or agent_ids & grant_ids)


def _joined_id(caller: str, nonce: str) -> str:
    from types import SimpleNamespace

    from veronica_otel._remote import child_chain_id

    return child_chain_id(SimpleNamespace(chain_id=caller, nonce=nonce))  # type: ignore[arg-type]


def test_a_chain_named_pools_cannot_touch_the_pool_records_in_process() -> None:
    ledger = LocalLedger()
    pool = BudgetPool("pools", max_steps=1, ledger=ledger)
    with ExecutionContext(ExecutionConfig(max_steps=5), chain_id="pools", ledger=ledger) as ctx:
        ctx.wrap_llm_call(lambda: None)
    with ExecutionContext(ledger=ledger, pools=[pool], detached=True) as tenant:
        tenant.wrap_llm_call(lambda: None)
    assert pool.snapshot().steps == 1
    assert ledger.snapshot("pools").steps == 1


@pytest.fixture
def store(redis_url: str) -> Iterator[RedisLedger]:
    made = RedisLedger.from_url(
        redis_url, key_prefix=f"ns{uuid.uuid4().hex[:10]}:", reservation_ttl_s=1.0
    )
    yield made
    made.close()
    made.client.close()


def test_a_killed_holder_of_a_chain_named_pools_does_not_break_pooled_calls(
    server: FakeLLMServer, client: openai.OpenAI, store: RedisLedger, redis_url: str
) -> None:
    holder = RedisLedger.from_url(redis_url, key_prefix=store._prefix, reservation_ttl_s=1.0)
    held = holder.reserve([Level("pools", Limits())], 1_000, 10)
    assert not isinstance(held, Exception)
    holder.close()  # "killed": its heartbeat stops, the reservation is never settled
    deadline = store.client.time()[0] + 3  # the server's clock passes the reservation's TTL
    while store.client.time()[0] < deadline:
        time.sleep(0.2)
    acme = BudgetPool("tenant:acme", max_steps=10, ledger=store)
    for _ in range(3):
        with ExecutionContext(ExecutionConfig(max_steps=5), ledger=store, pools=[acme]):
            client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=8
            )
    assert int(httpx2.get(server.base_url + "/stats").json()["total"]) == 3
    assert acme.snapshot().steps == 3
