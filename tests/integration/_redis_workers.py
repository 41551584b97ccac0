"""Process bodies for the multi-process Redis tests (importable and light), and
the start method of their processes.

Each body takes a results queue and an index first and puts ``(index, result)``
on the queue when done; exceptions are put as text, so the parent can fail
with the worker's own traceback instead of waiting out a timeout.
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable
from multiprocessing.context import ForkServerContext
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier, Event
from typing import Any

from veronica_otel import (
    BudgetExceededError,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
)
from veronica_otel.distributed import LedgerUnavailableError, RedisCircuitBreaker, RedisLedger

# Imported once by the fork server, not by each process it starts.
_PRELOAD = [
    "tests.integration._redis_workers",
    "tests.integration._pool_workers",
    "tests.integration._agent_workers",
]


def process_context() -> ForkServerContext:
    """How the tests start their worker processes: forked from a fork server.

    Each is a process of its own, as a spawned one is, but the server (one per
    pytest process, single-threaded, never pytest itself) imported the bodies
    and the package once, where a spawned interpreter imports them again each
    time (~0.4 CPU-s, eight processes at a time in some tests).
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    return context


def _stub() -> None:
    return None


def run_body(queue: Queue[Any], index: int, body: Callable[..., Any], *args: Any) -> None:
    """Run ``body(*args)`` and report its result, or its traceback, on ``queue``."""
    try:
        queue.put((index, body(*args)))
    except BaseException:
        queue.put((index, "ERROR\n" + traceback.format_exc()))


def shared_chain_calls(
    url: str,
    prefix: str,
    chain_id: str,
    calls: int,
    hint_usd: float,
    max_cost_usd: float | None,
    max_steps: int | None,
    start: Barrier,
) -> int:
    """Make ``calls`` wrapped calls on one shared chain; return how many ran."""
    ledger = RedisLedger.from_url(url, key_prefix=prefix)
    config = ExecutionConfig(max_cost_usd=max_cost_usd, max_steps=max_steps)
    options = WrapOptions(operation_name="shared", cost_estimate_hint=hint_usd)
    ran = [0]

    def call() -> None:
        ran[0] += 1

    ledger.snapshot(chain_id)  # connected: the race starts with the first call
    start.wait(timeout=60)
    with ExecutionContext(config, chain_id=chain_id, ledger=ledger) as ctx:
        decisions = [ctx.wrap_llm_call(call, options) for _ in range(calls)]
    assert decisions.count(Decision.ALLOW) == ran[0]
    return ran[0]


def outage_calls(
    url: str,
    prefix: str,
    chain_id: str,
    hint_usd: float,
    max_cost_usd: float,
    ready: Event,
    saw_down: Event,
    saw_up: Event,
    stop: Event,
    max_attempts: int,
) -> dict[str, Any]:
    """Call until told to stop, through a server kill and restart.

    Sets ``ready`` after 10 calls ran, ``saw_down`` at the first call denied
    because the store was unreachable, ``saw_up`` at the first call that ran
    after that. Returns counts and the last unreachable-store message.
    """
    ledger = RedisLedger.from_url(url, key_prefix=prefix, socket_timeout=1.0)
    config = ExecutionConfig(max_cost_usd=max_cost_usd)
    options = WrapOptions(operation_name="outage", cost_estimate_hint=hint_usd)
    ran = unavailable = other = 0
    message = ""
    with ExecutionContext(config, chain_id=chain_id, ledger=ledger) as ctx:
        for _ in range(max_attempts):
            if stop.is_set():
                break
            try:
                call = ctx.begin_call("llm", options)
            except LedgerUnavailableError as exc:
                unavailable += 1
                message = str(exc)
                saw_down.set()
                continue
            except BudgetExceededError:
                other += 1
                continue
            _stub()
            ran += 1
            call.finish()  # never raises, even with the store gone
            if ran >= 10:
                ready.set()
            if saw_down.is_set():
                saw_up.set()
        left = ledger.pending
        for _ in range(50):  # bounded: the store is back, so this empties at once
            if ledger.flush() == 0:
                break
        trip = ctx.snapshot().trip
    return {
        "ran": ran,
        "unavailable": unavailable,
        "other": other,
        "message": message,
        "pending_at_end": left,
        "pending_after_flush": ledger.pending,
        "trip": None if trip is None else trip.reason,
    }


def race_probe(url: str, prefix: str, name: str, start: Barrier) -> bool:
    """Wait for every racer, then ask the half-open breaker once."""
    breaker = RedisCircuitBreaker.from_url(url, name, 1, 0.0, key_prefix=prefix, probe_ttl_s=600)
    assert breaker.state.value == "half_open"  # connected, script loaded: now only race
    start.wait(timeout=60)
    return breaker.check().allowed
