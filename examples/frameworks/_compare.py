"""The comparison each example prints: the framework's own cap, then ours.

The model is the in-process fake server playing a runaway model (every reply
asks for another tool call), so neither run ends on its own: the first stops
at the framework's own cap, the second at ``max_steps`` of our chain, before
the call that would exceed it is sent.
"""

from __future__ import annotations

from collections.abc import Callable

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel.testing import FakeLLMServer

STEPS = 3


def _ours(exc: BaseException) -> str | None:
    """Where our denial is in ``exc``: itself, or the framework's error's cause."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, BudgetExceededError):
            return "itself" if seen is exc else f"the __cause__ of {type(exc).__name__}"
        seen = seen.__cause__ or seen.__context__
    return None


def compare(
    framework: str,
    own_cap: str,
    run_agent: Callable[[], object],
    server: FakeLLMServer,
    ours: Callable[[], object] | None = None,
) -> None:
    """Run the agent under its own cap only, then in a chain of ``max_steps=STEPS``.

    ``ours``: the agent to run in our chain, when the first run needs a
    bound of its own around it (a framework with no cap).
    """
    server.reset()
    ended = "it returned"
    try:
        run_agent()
    except Exception as exc:
        ended = type(exc).__name__
    print(f"{framework} own cap ({own_cap}): {server.request_count} requests, then {ended}")
    server.reset()
    try:
        with ExecutionContext(ExecutionConfig(max_steps=STEPS)):
            (ours or run_agent)()
        ended = "it returned"
    except Exception as exc:
        where = _ours(exc)
        ended = f"BudgetExceededError as {where}" if where else type(exc).__name__
    print(f"{framework} ours (max_steps={STEPS}): {server.request_count} requests, then {ended}")
