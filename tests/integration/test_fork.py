"""os.fork: a child never gets a second copy of a chain's budget.

Real ``os.fork`` (and multiprocessing's fork start method), the real
``openai`` SDK against the fake server (its request count is the truth of
what was sent), and a real Valkey for the shared ledger. Each child sends its
result back through a pipe; the parent waits for it with ``os.waitpid``.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from veronica_otel import (
    BudgetExceededError,
    ExecutionConfig,
    ExecutionContext,
    LocalLedger,
    WrapOptions,
    _pricing,
    _propagation,
    _tools,
)
from veronica_otel.instrumentors import _breakers
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.policy_file import PolicyFile, install_default_chain
from veronica_otel.testing import FakeLLMServer

HALF = WrapOptions(operation_name="step", cost_estimate_hint=0.5)
CHAT = "/v1/chat/completions"
# A child that deadlocks (an inherited lock nobody will release) is killed.
CHILD_ALARM_S = 20


def in_child(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a forked child; return its result or raise what it raised (as text)."""
    read_end, write_end = os.pipe()
    # The pytest process's objects frozen out of the garbage collector first: a
    # full collection in the child would walk (and copy, page by page) the whole
    # heap of a worker that ran hundreds of tests: seconds of CPU, past the alarm
    # under load.
    gc.freeze()
    try:
        pid = os.fork()
    except BaseException:
        gc.unfreeze()
        raise
    if pid != 0:
        gc.unfreeze()
    if pid == 0:  # the child: never return into pytest
        status = 0
        try:
            os.close(read_end)
            signal.alarm(CHILD_ALARM_S)
            try:
                payload = ("ok", fn())
            except BaseException as exc:
                payload = ("raised", f"{type(exc).__name__}: {exc}")
            data = pickle.dumps(payload)
            while data:
                data = data[os.write(write_end, data) :]
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    os.close(write_end)
    chunks = []
    with os.fdopen(read_end, "rb") as pipe:
        while chunk := pipe.read(65536):
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child died (deadlock?)"
    kind, value = pickle.loads(b"".join(chunks))
    if kind == "raised":
        raise AssertionError(f"child raised {value}")
    return value


def spend(
    ctx: ExecutionContext, options: WrapOptions = HALF, *, tool: bool = False
) -> tuple[str, str | None]:
    """One wrapped call in ``ctx``: its decision and the chain's trip message."""
    wrap = ctx.wrap_tool_call if tool else ctx.wrap_llm_call
    decision = wrap(lambda: None, options)
    trip = ctx.trip
    return decision.name, None if trip is None else trip.message


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=5) as fake:
        yield fake


@pytest.fixture
def instrumented() -> Iterator[None]:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    yield
    instrumentor.uninstrument()


@pytest.fixture
def default_chain() -> Iterator[None]:
    yield
    _propagation.set_default_context(None)


def test_forked_children_cannot_spend_the_parents_in_process_chain() -> None:
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0))
    assert spend(ctx) == ("ALLOW", None)

    results = [in_child(lambda: spend(ctx)) for _ in range(3)]

    for decision, message in results:
        assert decision == "HALT"
        assert message is not None
        assert "inherited across os.fork()" in message
        assert "RedisLedger" in message
    # The parent is unaffected: its own half is still there, exactly once.
    assert ctx.snapshot().cost_usd == pytest.approx(0.5)
    assert spend(ctx) == ("ALLOW", None)
    assert spend(ctx)[0] == "HALT"


def test_the_trip_in_the_child_is_sticky_and_covers_child_chains() -> None:
    parent = ExecutionContext(ExecutionConfig(max_cost_usd=1.0))
    child_chain = parent.spawn_child(ExecutionConfig(max_cost_usd=0.75))

    def in_the_fork() -> list[Any]:
        out: list[Any] = [spend(child_chain)[0], spend(parent)[0], spend(parent)[0]]
        trip = parent.trip
        assert trip is not None
        out.append((trip.reason, parent.snapshot().aborted))
        return out

    assert in_child(in_the_fork) == ["HALT", "HALT", "HALT", ("cost", True)]
    assert parent.trip is None and child_chain.trip is None


def test_an_instrumented_call_in_the_child_is_never_sent(
    server: FakeLLMServer, instrumented: None
) -> None:
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=10))

    def call() -> str:
        client = openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
        with client, ctx:
            try:
                client.chat.completions.create(
                    model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
                )
            except BudgetExceededError as exc:
                return str(exc)
        return "sent"

    message = in_child(call)
    assert "inherited across os.fork()" in message
    assert server.count(CHAT) == 0
    # The same call from the parent goes out.
    assert call() == "sent"
    assert server.count(CHAT) == 1


def test_the_process_default_chain_is_per_process(default_chain: None) -> None:
    _propagation.set_default_context(ExecutionContext(ExecutionConfig(max_steps=2)))
    parent_default = _propagation.default_context()
    assert parent_default is not None
    one = WrapOptions(operation_name="step")
    assert spend(parent_default, one)[0] == "ALLOW"

    def child() -> tuple[str, bool, list[str], int | None]:
        mine = _propagation.default_context()
        assert mine is not None
        decisions = [spend(mine, one)[0] for _ in range(3)]
        return mine.chain_id, mine is parent_default, decisions, mine.config.max_steps

    chain_id, same, decisions, max_steps = in_child(child)
    # A budget of its own: the same limits, a new chain, two steps then stopped.
    assert chain_id != parent_default.chain_id and not same
    assert max_steps == 2
    assert decisions == ["ALLOW", "ALLOW", "HALT"]
    assert parent_default.snapshot().steps == 1
    assert _propagation.default_context() is parent_default


def _mp_target(ctx: ExecutionContext, conn: Any) -> None:
    conn.send(spend(ctx))
    conn.close()


def test_multiprocessing_fork_children_cannot_spend_the_inherited_chain() -> None:
    mp = multiprocessing.get_context("fork")
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0))
    assert spend(ctx)[0] == "ALLOW"
    results = []
    for _ in range(3):
        receive, send = mp.Pipe(duplex=False)
        process = mp.Process(target=_mp_target, args=(ctx, send))
        process.start()
        send.close()
        results.append(receive.recv())
        process.join()
        assert process.exitcode == 0
    assert [decision for decision, _ in results] == ["HALT"] * 3
    assert ctx.snapshot().cost_usd == pytest.approx(0.5)


def test_a_lock_held_by_a_parent_thread_at_fork_does_not_deadlock_the_child() -> None:
    ledger = LocalLedger()
    ctx = ExecutionContext(ExecutionConfig(max_steps=5), ledger=ledger)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with ledger._lock:
            holding.set()
            release.wait()

    thread = threading.Thread(target=hold)
    thread.start()
    holding.wait()
    try:

        def child() -> tuple[str, str]:
            fresh = ExecutionContext(ExecutionConfig(max_steps=5), ledger=ledger)
            one = WrapOptions(operation_name="step")
            return spend(fresh, one)[0], spend(ctx, one)[0]

        assert in_child(child) == ("ALLOW", "HALT")
    finally:
        release.set()
        thread.join()


def test_a_shared_redis_chain_keeps_working_across_fork(redis_url: str, redis_prefix: str) -> None:
    from veronica_otel.distributed import RedisLedger

    ledger = RedisLedger.from_url(redis_url, key_prefix=redis_prefix)
    ctx = ExecutionContext(ExecutionConfig(max_steps=4), chain_id="forked-job", ledger=ledger)
    one = WrapOptions(operation_name="step")
    assert spend(ctx, one)[0] == "ALLOW"

    results = [in_child(lambda: spend(ctx, one)[0]) for _ in range(3)]

    assert results == ["ALLOW"] * 3  # counted by the store, once each
    assert ctx.snapshot().steps == 4
    assert spend(ctx, one)[0] == "HALT"


LOCK_USERS: dict[str, tuple[Callable[[], Any], Callable[[], object]]] = {
    "endpoint breakers": (
        lambda: _breakers._lock,
        lambda: _breakers.endpoint_breaker("openai", "fork-test").state,
    ),
    "tool prices": (lambda: _tools._prices_lock, lambda: _tools.set_tool_prices(None)),
    "price data": (lambda: _pricing._module_lock, lambda: _pricing._bundled_snapshot()),
}


@pytest.mark.parametrize("which", sorted(LOCK_USERS))
def test_module_locks_held_at_fork_are_made_anew_in_the_child(which: str) -> None:
    lock_of, use = LOCK_USERS[which]
    made = type(use()).__name__  # imports and loads done here: the child's only wait is the lock
    lock = lock_of()
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            holding.set()
            release.wait()

    thread = threading.Thread(target=hold)
    thread.start()
    holding.wait()
    try:
        assert in_child(lambda: type(use()).__name__) == made
    finally:
        release.set()
        thread.join()


def test_a_policy_file_default_chain_is_per_process(tmp_path: Path, default_chain: None) -> None:
    path = tmp_path / "policy.toml"
    path.write_text('[limits]\nmax_steps = 2\n[tools."search"]\nmax_calls = 1\n')
    parent_default = install_default_chain(PolicyFile(path), {})
    search = WrapOptions(operation_name="search")
    assert spend(parent_default, search, tool=True)[0] == "ALLOW"
    assert spend(parent_default, search, tool=True)[0] == "HALT"  # the file's max_calls

    def child() -> tuple[bool, list[str], str | None]:
        mine = _propagation.default_context()
        assert mine is not None
        decisions = [spend(mine, search, tool=True)[0], spend(mine, search, tool=True)[0]]
        trip = mine.trip
        return mine is parent_default, decisions, None if trip is None else trip.message

    same, decisions, message = in_child(child)
    assert not same
    # The file's rules hold in the child's own chain: one search, then denied by the file.
    assert decisions == ["ALLOW", "HALT"]
    assert message is None or "inherited" not in message
    assert _propagation.default_context() is parent_default


def test_a_default_chain_on_the_shared_ledger_is_one_budget_across_fork(
    redis_url: str, redis_prefix: str, default_chain: None
) -> None:
    from veronica_otel.distributed import RedisLedger

    ledger = RedisLedger.from_url(redis_url, key_prefix=redis_prefix)
    _propagation.set_default_context(
        ExecutionContext(ExecutionConfig(max_steps=3), ledger=ledger, name="default")
    )
    parent_default = _propagation.default_context()
    assert parent_default is not None
    one = WrapOptions(operation_name="step")

    def child() -> tuple[str, str]:
        mine = _propagation.default_context()
        assert mine is not None
        return mine.chain_id, spend(mine, one)[0]

    assert [in_child(child) for _ in range(4)] == [(parent_default.chain_id, "ALLOW")] * 3 + [
        (parent_default.chain_id, "HALT")
    ]
    assert parent_default.snapshot().steps == 3


def test_the_childs_default_chain_deadline_is_on_the_childs_timer(default_chain: None) -> None:
    from veronica_otel import _timer

    _propagation.set_default_context(ExecutionContext(ExecutionConfig(timeout_ms=3_600_000)))

    def child() -> bool:
        mine = _propagation.default_context()
        assert mine is not None
        # The timer thread of the parent is gone; the new chain's deadline must be
        # on the child's own timer, or a stream would never be cut at it.
        return any(handle is mine._state.timer for _, _, handle in _timer._TIMER._heap)

    assert in_child(child) is True


def test_the_shared_ledgers_own_locks_are_made_anew_in_the_child(
    redis_url: str, redis_prefix: str
) -> None:
    from veronica_otel.distributed import RedisCircuitBreaker, RedisLedger

    ledger = RedisLedger.from_url(redis_url, key_prefix=redis_prefix)
    breaker = RedisCircuitBreaker.from_url(redis_url, "fork-breaker", key_prefix=redis_prefix)
    held = (ledger._link.pending_lock, ledger._link.state_lock, breaker._lock)
    for lock in held:
        lock.acquire()  # as a parent thread in the middle of a commit would
    try:

        def child() -> list[bool]:
            return [
                ledger._link.pending_lock.locked(),
                ledger._link.state_lock.locked(),
                breaker._lock.locked(),
            ]

        assert in_child(child) == [False, False, False]
    finally:
        for lock in held:
            lock.release()
