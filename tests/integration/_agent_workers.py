"""Process body for the multi-process agent-limit test (spawned, so importable and light)."""

from __future__ import annotations

import traceback
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from typing import Any

from veronica_otel import ExecutionConfig, ExecutionContext, agent
from veronica_otel.distributed import RedisLedger


def researcher_and_critic(
    queue: Queue[Any], index: int, url: str, prefix: str, chain_id: str, rounds: int, start: Barrier
) -> None:
    """``rounds`` of one researcher call (max_steps=5 per chain) and one critic
    call on a shared chain; puts ``(index, (researcher_ran, critic_ran, tripped))``."""
    try:
        ledger = RedisLedger.from_url(url, key_prefix=prefix)
        ledger.snapshot(chain_id)  # connected: the race starts with the first call
        ran = {"researcher": 0, "critic": 0}

        def call(who: str) -> None:
            ran[who] += 1

        start.wait(timeout=60)
        with ExecutionContext(
            ExecutionConfig(max_steps=100), chain_id=chain_id, ledger=ledger
        ) as ctx:
            for _ in range(rounds):
                with agent("researcher", config=ExecutionConfig(max_steps=5)):
                    ctx.wrap_llm_call(lambda: call("researcher"))
                with agent("critic"):
                    ctx.wrap_llm_call(lambda: call("critic"))
            queue.put((index, (ran["researcher"], ran["critic"], ctx.trip is not None)))
    except BaseException:
        queue.put((index, "ERROR\n" + traceback.format_exc()))
