"""The runaway scenarios of the VERONICA paper, run through the real ``openai`` SDK.

Each scenario is a small agent program written the way frameworks write them
(retries per layer, tools that call the model, agents that argue). It knows
nothing about containment: the same function runs uncontained and inside an
:class:`ExecutionContext`, and the embedded fake LLM server counts what was
actually sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from veronica_otel._agents import agent
from veronica_otel._config import ExecutionConfig
from veronica_otel._context import ExecutionContext
from veronica_otel._errors import BudgetExceededError
from veronica_otel._ledger import LocalLedger
from veronica_otel._pools import BudgetPool
from veronica_otel._retry import RetryContainer

__all__ = [
    "SCENARIOS",
    "InvalidAnswer",
    "Scenario",
    "TenantRun",
    "WebSocketSession",
    "planner_critic",
    "recursive_tools",
    "retry_amplification",
    "tenant_pools",
    "websocket_conversation",
    "websocket_runaway",
]

MODEL = "gpt-4o"
# Loops that would run "for days" are stopped by the demo itself after this
# many rounds when uncontained, so the demo ends; the table says so.
DEMO_ROUND_CAP = 40
PLANNER_ROUNDS = 30  # the planner/critic loop ends by itself, as in the example
# Two tenants on one service, each with a daily budget pool.
TENANT_DAILY_USD = 0.01
RUNAWAY_AGENTS = 4  # acme's agents, each looping until stopped (DEMO_ROUND_CAP)
STEADY_CALLS = 10  # bob's agent: an ordinary task


class InvalidAnswer(Exception):
    """The model's answer failed the caller's validation, so the caller retries."""


def _ask(client: Any, prompt: str) -> str:
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=60
    )
    return str(reply.choices[0].message.content or "")


def _retry_container(max_retries: int) -> Any:
    return RetryContainer(max_retries=max_retries, backoff_base=0.0, sleep=lambda _s: None)


def retry_amplification(
    client: Any,
    *,
    layers: int = 3,
    retries: int = 3,
    retrier: Callable[[int], Any] = _retry_container,
) -> None:
    """Nested layers (agent, tool, client) each retry ``retries`` times: (1+r)^L calls.

    The default (3 layers x 3 retries) makes 64 calls when every answer is
    invalid. ``retrier(max_retries)`` builds each layer's retry loop (anything
    with ``execute(fn, *args)``), so the benchmarks can run the same layers
    on another library's retry container.
    """

    def model_call() -> str:
        answer = _ask(client, "Return the invoice total as JSON.")
        if not answer.startswith("{"):
            raise InvalidAnswer(answer[:40])
        return answer

    def layer(depth: int) -> str:
        retry = retrier(retries)
        if depth == layers:
            return str(retry.execute(model_call))
        return str(retry.execute(layer, depth + 1))

    with contextlib.suppress(InvalidAnswer):  # every layer gave up: the uncontained end
        layer(1)


def recursive_tools(client: Any, *, rounds: int = DEMO_ROUND_CAP) -> None:
    """A tool whose output makes the agent call the same tool again, forever.

    Each call of the tool asks the model once; ``rounds`` stops it uncontained.
    """

    def search(query: str, depth: int) -> str:
        if depth >= rounds:
            return "demo cap"
        answer = _ask(client, f"search: {query}")
        # The model "decides" it needs to search the same thing once more.
        return search(query, depth + 1) if answer else answer

    search("latest quarterly revenue", 0)


def _agent_turn(client: Any, name: str, prompt: str) -> str:
    # What an agent-framework adapter does: each turn runs as its agent, so the
    # graph shows who called whom and max_handoffs counts the back and forth.
    with agent(name):
        return _ask(client, prompt)


def planner_critic(client: Any, *, rounds: int = PLANNER_ROUNDS) -> None:
    """A planner and a critic that never agree (each round is two model calls).

    The same loop as ``examples/planner_critic.py``: 30 rounds, 60 calls
    uncontained; the demo stops it as the example does, with ``max_handoffs=8``
    (9 calls, trip ``loop``). The benchmark runs it under ``max_steps=8`` (8
    calls, trip ``steps``) to match the paper's step guard.
    """
    for _round in range(rounds):
        plan = _agent_turn(client, "planner", "Planner: propose a plan for the migration.")
        verdict = _agent_turn(client, "critic", f"Critic: review this plan: {plan[:80]}")
        if "APPROVED" in verdict:  # the fake model never approves
            return


def websocket_runaway(client: Any, config: ExecutionConfig | None) -> str:
    """A WebSocket session that streams model output to the client without end.

    The ASGI app is driven in-process; contained, it sits behind
    :class:`VeronicaASGIMiddleware`, where every message sent is a step.
    Returns how the session ended.
    """
    base_url = str(client.base_url)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        await _stream_forever(base_url, send)
        await send({"type": "websocket.close", "code": 1000})

    return asyncio.run(_drive_session(_contain(app, config), WebSocketSession())).ended


def websocket_conversation(
    client: Any,
    wrap: Callable[[Any], Any] | None = None,
    *,
    turns: int = DEMO_ROUND_CAP,
) -> WebSocketSession:
    """A chat session: the user sends ``turns`` messages; the app asks the model
    once per message and sends the answer back (a receive and a send per turn).

    ``wrap(app)`` puts containment (ASGI middleware) around the app; ``None``
    runs it bare. The model is asked through ``client`` (a sync client, so
    the call runs in the session's context). Returns what the session did.
    """
    session = WebSocketSession(user_messages=turns)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        while True:
            message = await receive()
            if message.get("type") != "websocket.receive":
                return  # the user left, or the middleware ended the session
            session.note_op(received=True)
            answer = _ask(client, f"User says: {message.get('text', '')}")
            await send({"type": "websocket.send", "text": answer})

    asgi = app if wrap is None else wrap(app)
    return asyncio.run(_drive_session(asgi, session))


@dataclass
class WebSocketSession:
    """What one driven WebSocket session did.

    Attributes:
        user_messages: Messages the user sends after connecting (then leaves).
        received: ``websocket.receive`` messages the app got.
        sent: ``websocket.send`` messages that reached the user.
        closes: Close codes the user got.
        ended: How it ended: ``"-"``, a trip reason, plus ``", ws 1008"``
            when the session was closed for a policy violation.
        last_op_at: ``time.perf_counter()`` of the last data message either way.
    """

    user_messages: int = 0
    received: int = 0
    sent: int = 0
    closes: list[int] = field(default_factory=list)
    ended: str = "-"
    last_op_at: float = 0.0

    @property
    def ops(self) -> int:
        """Data messages that went through, both ways."""
        return self.received + self.sent

    def note_op(self, *, received: bool) -> None:
        if received:
            self.received += 1
        else:
            self.sent += 1
        self.last_op_at = time.perf_counter()


def _contain(app: Any, config: ExecutionConfig | None) -> Any:
    from veronica_otel.middleware import VeronicaASGIMiddleware

    return app if config is None else VeronicaASGIMiddleware(cast(Any, app), config)


async def _stream_forever(base_url: str, send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    import openai

    aclient = openai.AsyncOpenAI(base_url=base_url, api_key="demo", max_retries=0)
    try:
        for turn in range(DEMO_ROUND_CAP):
            stream = await aclient.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"Keep talking (turn {turn})."}],
                max_tokens=20,
                stream=True,
            )
            # Closed however the turn ends: a denial raised from ``send`` leaves the
            # loop mid-stream, and an abandoned stream is left to the event loop's
            # shutdown, which complains about it.
            async with stream:
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        text = chunk.choices[0].delta.content
                        await send({"type": "websocket.send", "text": text})
    finally:
        await aclient.close()


async def _drive_session(asgi: Any, session: WebSocketSession) -> WebSocketSession:
    """Run one WebSocket session of ``asgi`` in-process, as its user."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await inbox.put({"type": "websocket.connect"})
    for turn in range(session.user_messages):
        await inbox.put({"type": "websocket.receive", "text": f"message {turn}"})
    if session.user_messages:
        await inbox.put({"type": "websocket.disconnect", "code": 1000})

    async def receive() -> dict[str, Any]:
        return await inbox.get()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "websocket.close":
            session.closes.append(int(message.get("code", 1000)))
        elif message["type"] == "websocket.send":
            session.note_op(received=False)

    scope = {
        "type": "websocket",
        "asgi": {"version": "3.0"},
        "path": "/session",
        "raw_path": b"/session",
        "query_string": b"",
        "headers": [(b"host", b"demo.local")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
        "subprotocols": [],
    }
    try:
        await asgi(scope, receive, send)
    except BudgetExceededError as exc:
        session.ended = f"{exc.reason}, ws 1008" if 1008 in session.closes else exc.reason
        return session
    if 1008 in session.closes:
        session.ended = "steps, ws 1008"  # the middleware closed the session: policy violation
    return session


@dataclass
class TenantRun:
    """What the two tenants' agents got done (``str()``: how it ended, for the table).

    Attributes:
        acme_calls: Calls acme's runaway agents made (answered by the model).
        bob_calls: Calls bob's agent made, of ``STEADY_CALLS``.
        acme_stopped: acme's agents that a denial stopped.
        acme_spent_usd: What acme's pool counted today (0 uncontained: no pool).
        retry_after_s: When acme's window frees room, from the last denial.
    """

    acme_calls: int = 0
    bob_calls: int = 0
    acme_stopped: int = 0
    acme_spent_usd: float = 0.0
    retry_after_s: float | None = None

    def __str__(self) -> str:
        if not self.acme_stopped:
            return "-"
        return f"acme pool, bob {self.bob_calls}/{STEADY_CALLS}"


def tenant_pools(client: Any, config: ExecutionConfig | None) -> TenantRun:
    """Tenant acme starts four agents that loop without end; tenant bob runs one
    ordinary task. Each agent task is a sub-chain of its tenant's chain, with a
    per-task ceiling (``config``) that the runaway never reaches; contained,
    every call of a tenant also spends from the tenant's daily pool
    (``TENANT_DAILY_USD``, a rolling day), which stops acme's agents while
    bob's task completes.
    Uncontained (``config`` None), nothing stops acme before the demo's cap.
    """
    ledger = LocalLedger()  # this run's own pools: a second demo run starts afresh
    pools: dict[str, list[BudgetPool]] = {
        tenant: (
            [
                BudgetPool(
                    f"tenant:{tenant}", max_cost_usd=TENANT_DAILY_USD, window="1d", ledger=ledger
                )
            ]
            if config is not None
            else []
        )
        for tenant in ("acme", "bob")
    }
    run = TenantRun()

    def task(tenant: ExecutionContext, name: str, calls: int) -> int:
        made = 0
        with tenant.spawn_child(config, name=name):  # the tenant's pools come along
            try:
                for turn in range(calls):
                    _ask(client, f"{name}: step {turn}, keep going.")
                    made += 1
            except BudgetExceededError as exc:
                if exc.pool == "tenant:acme":
                    run.acme_stopped += 1
                    run.retry_after_s = exc.retry_after_s
        return made

    mode = "uncontained" if config is None else "contained"
    # One chain per tenant (one graph each); every agent task is a sub-chain of it.
    with ExecutionContext(None, ledger=ledger, pools=pools["acme"], name=f"acme-{mode}") as acme:
        for i in range(RUNAWAY_AGENTS):
            run.acme_calls += task(acme, f"acme-agent-{i + 1}", DEMO_ROUND_CAP)
    with ExecutionContext(None, ledger=ledger, pools=pools["bob"], name=f"bob-{mode}") as bob:
        run.bob_calls = task(bob, "bob-agent", STEADY_CALLS)
    if pools["acme"]:
        run.acme_spent_usd = pools["acme"][0].snapshot().cost_usd
    return run


@dataclass(frozen=True)
class Scenario:
    """One runaway pattern and the ceiling that contains it.

    ``run(client)`` runs inside a chain opened by the demo; a scenario with
    ``serves`` runs as ``run(client, config)`` and applies the containment
    itself (middleware), returning how it ended.
    """

    key: str
    title: str
    run: Callable[..., Any]
    config: ExecutionConfig
    uncontained_note: str
    serves: bool = False


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "retries",
        "Retry amplification (3 layers x 3 retries)",
        retry_amplification,
        ExecutionConfig(max_retries_total=5, max_cost_usd=0.50),
        "every layer retried: (1+3)^3 calls",
    ),
    Scenario(
        "recursive-tools",
        "Recursive tool calls",
        recursive_tools,
        ExecutionConfig(max_repeats=3, max_steps=50, max_cost_usd=0.50),
        f"stopped by the demo after {DEMO_ROUND_CAP} calls",
    ),
    Scenario(
        "planner-critic",
        "Planner/critic loop that never converges",
        planner_critic,
        ExecutionConfig(max_handoffs=8, max_cost_usd=0.50),
        f"{PLANNER_ROUNDS} rounds, every plan rejected",
    ),
    Scenario(
        "websocket",
        "WebSocket session streaming without end",
        websocket_runaway,
        ExecutionConfig(max_steps=30, max_cost_usd=0.50),
        f"stopped by the demo after {DEMO_ROUND_CAP} turns",
        serves=True,
    ),
    Scenario(
        "tenants",
        "Tenant acme's agents run away, bob works",
        tenant_pools,
        ExecutionConfig(max_cost_usd=0.50),  # per task; the tenant's pool is the day's
        f"acme's {RUNAWAY_AGENTS} agents: {DEMO_ROUND_CAP} calls each, bob's task done",
        serves=True,
    ),
)
