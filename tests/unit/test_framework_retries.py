"""A framework's retry loop is told that a denial is final.

smolagents and Strands tell a rate limit by its text (``"429"``, ``"rate"``)
and retry it after minutes of sleep; a denial's text may hold either, and the
framework may have wrapped the denial in its own error (``raise ... from``, or
raised while handling it). :func:`caused_by_denial` finds it in either case;
the frameworks' hooks ask it (``tests/e2e``: the same, end to end).
"""

from __future__ import annotations

import pytest

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext, ToolCall
from veronica_otel.instrumentors._framework import caused_by_denial


@pytest.fixture
def denial() -> BudgetExceededError:
    with ExecutionContext(ExecutionConfig(max_steps=1)) as ctx:
        with ToolCall("lookup", context=ctx):
            pass
        with pytest.raises(BudgetExceededError) as denied, ToolCall("lookup", context=ctx):
            pass
    return denied.value


def test_a_denial_is_found_where_a_framework_wrapped_it(denial: BudgetExceededError) -> None:
    assert caused_by_denial(denial)
    try:
        raise RuntimeError("rate limit? retry in 60 s") from denial
    except RuntimeError as wrapped:
        assert caused_by_denial(wrapped)
    try:
        try:
            raise denial
        except BudgetExceededError:
            raise ValueError("429") from None  # the cause hidden, the context kept
    except ValueError as handled:
        outer = KeyError("outer")
        outer.__cause__ = handled  # two layers of wrapping
        assert caused_by_denial(handled) and caused_by_denial(outer)


def test_other_errors_are_not_denials_and_a_cycle_ends() -> None:
    first, second = RuntimeError("429"), RuntimeError("rate limit")
    first.__context__, second.__context__ = second, first
    assert not caused_by_denial(first)
    assert not caused_by_denial(None)
