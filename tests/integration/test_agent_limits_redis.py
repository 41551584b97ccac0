"""Per-agent limits on a shared ledger: a real Valkey (or Redis), and a Redis Cluster.

An agent's counters are one more chain-tree level in the store, keyed inside
the chain's hash tag: one script reserves chain and agent together, on a
single server or a cluster, and processes sharing a chain share its agents.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from redis.crc import key_slot

from tests.integration import _agent_workers as workers
from tests.integration._agent_calls import ask, sent_by
from tests.integration._redis_workers import process_context
from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext, agent
from veronica_otel._agent_limits import agent_level_id
from veronica_otel.distributed import RedisLedger
from veronica_otel.testing import FakeLLMServer, RedisClusterProcess

CHAT = "/v1/chat/completions"


@pytest.fixture
def open_ledger() -> Iterator[Callable[..., RedisLedger]]:
    """``RedisLedger.from_url``, closed after the test (heartbeat and connections).

    Left open, a ledger's sockets are found by the garbage collector in some
    later test, whose warning then fails it (``filterwarnings = error``).
    """
    made: list[RedisLedger] = []

    def make(url: str, **options: Any) -> RedisLedger:
        made.append(RedisLedger.from_url(url, **options))
        return made[-1]

    yield make
    for ledger in made:
        ledger.close()
        ledger.client.close()


def planner_critic(client: openai.OpenAI, ledger: RedisLedger, chain_id: str) -> int:
    """Researcher (max_steps=3) and critic rounds until the chain's 12 steps; the denials."""
    denied = 0
    with ExecutionContext(ExecutionConfig(max_steps=12), chain_id=chain_id, ledger=ledger):
        with pytest.raises(BudgetExceededError) as stop:
            for _ in range(50):
                with agent("researcher", config=ExecutionConfig(max_steps=3)):
                    try:
                        ask(client, "researcher")
                    except BudgetExceededError as exc:
                        if exc.agent is None:
                            raise
                        assert (exc.agent, exc.reason, exc.chain_id) == (
                            "researcher",
                            "steps",
                            chain_id,
                        )
                        denied += 1
                with agent("critic"):
                    ask(client, "critic")
        assert stop.value.agent is None and stop.value.limit == 12
    return denied


def test_planner_critic_on_valkey(
    client: openai.OpenAI,
    server: FakeLLMServer,
    redis_url: str,
    redis_prefix: str,
    open_ledger: Callable[..., RedisLedger],
) -> None:
    ledger = open_ledger(redis_url, key_prefix=redis_prefix, fail_open=False)
    denied = planner_critic(client, ledger, "task-1")
    assert (sent_by(server, "researcher"), sent_by(server, "critic")) == (3, 9)
    assert denied == 6
    # The agent's trip is kept on the agent's own level; the chain's is its own.
    researcher = ledger.snapshot(agent_level_id("task-1", "researcher"))
    assert researcher.steps == 3 and researcher.trip is not None
    assert researcher.trip.reason == "steps"
    chain = ledger.snapshot("task-1")
    assert chain.steps == 12 and chain.trip is not None and chain.trip.limit == 12
    assert ledger.snapshot(agent_level_id("task-1", "critic")).steps == 0  # no limits: no level


def test_a_second_client_of_the_chain_sees_the_agent_stopped(
    redis_url: str, redis_prefix: str, open_ledger: Callable[..., RedisLedger]
) -> None:
    first = open_ledger(redis_url, key_prefix=redis_prefix, fail_open=False)
    second = open_ledger(redis_url, key_prefix=redis_prefix, fail_open=False)
    limits = ExecutionConfig(max_steps=2)
    ran: list[str] = []
    with ExecutionContext(chain_id="shared-1", ledger=first) as a, agent("writer", limits):
        a.wrap_llm_call(lambda: ran.append("a"))
    with ExecutionContext(chain_id="shared-1", ledger=second) as b, agent("writer", limits):
        b.wrap_llm_call(lambda: ran.append("b"))
        b.wrap_llm_call(lambda: ran.append("b"))  # the writer's 3rd step: denied
        with pytest.raises(BudgetExceededError) as err:
            b.begin_call().finish()
        assert err.value.agent == "writer"
        assert b.trip is None
    with ExecutionContext(chain_id="shared-1", ledger=second) as b:
        b.wrap_llm_call(lambda: ran.append("chain"))  # the chain itself goes on
    assert ran == ["a", "b", "chain"]


def test_processes_share_an_agents_budget_exactly(
    redis_url: str, redis_prefix: str, open_ledger: Callable[..., RedisLedger]
) -> None:
    """3 processes x 6 rounds: the researcher gets exactly 5 steps in all, the critic 18."""
    ctx = process_context()
    results: Any = ctx.Queue()
    start = ctx.Barrier(3)
    processes = [
        ctx.Process(
            target=workers.researcher_and_critic,
            args=(results, i, redis_url, redis_prefix, "multi", 6, start),
        )
        for i in range(3)
    ]
    for process in processes:
        process.start()
    outcomes = []
    try:
        for _ in processes:
            try:
                index, result = results.get(timeout=120)
            except queue.Empty:
                pytest.fail("workers did not finish within 120 s")
            if isinstance(result, str):
                pytest.fail(f"worker {index} failed:\n{result}")
            outcomes.append(result)
    finally:
        for process in processes:
            process.join(timeout=15)
            if process.is_alive():
                process.kill()
                process.join()
    assert sum(r for r, _, _ in outcomes) == 5
    assert sum(c for _, c, _ in outcomes) == 18
    assert not any(tripped for _, _, tripped in outcomes)
    ledger = open_ledger(redis_url, key_prefix=redis_prefix)
    assert ledger.snapshot(agent_level_id("multi", "researcher")).steps == 5
    assert ledger.snapshot("multi").steps == 23 and ledger.snapshot("multi").trip is None


def test_agent_levels_share_the_chain_trees_slot_on_a_cluster(
    client: openai.OpenAI,
    server: FakeLLMServer,
    redis_cluster: RedisClusterProcess,
    redis_prefix: str,
    open_ledger: Callable[..., RedisLedger],
) -> None:
    ledger = open_ledger(redis_cluster.url, key_prefix=redis_prefix)
    name = "odd name {with} braces & spaces"  # percent-encoded into the key
    level = agent_level_id("clu", name)
    slots = {key_slot(ledger.key(c).encode()) for c in ("clu", "clu.1", level)}
    assert len(slots) == 1
    with ExecutionContext(ExecutionConfig(max_steps=10), chain_id="clu", ledger=ledger) as ctx:
        with agent(name, config=ExecutionConfig(max_steps=2)):
            ask(client, "x")
            with ctx.spawn_child() as child:  # a three-level path: root, child, agent
                ask(client, "x")
                with pytest.raises(BudgetExceededError) as err:
                    ask(client, "x")
        assert err.value.agent == name and child.trip is None
        ask(client, "y")
    assert server.count(CHAT) == 3
    assert ledger.snapshot(level).steps == 2
