"""How an instrumented call's ending is read: sent or not, endpoint failure or not (G10)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx2
import openai
import pytest
from opentelemetry import trace

from tests._clock import FakeClock
from veronica_otel import CircuitBreaker, CircuitState, ExecutionConfig, ExecutionContext
from veronica_otel.instrumentors._admit import CallSpec, admit, input_bound
from veronica_otel.instrumentors._breakers import (
    classify_outcome,
    configure_endpoint_breakers,
    endpoint_breaker,
    never_connected,
    raised_within,
)
from veronica_otel.instrumentors._common import ContainedCall, token_count

MODEL = "gpt-4o-mini"
REQUEST = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")


@pytest.mark.parametrize(
    "error",
    [KeyboardInterrupt(), asyncio.CancelledError(), SystemExit(), GeneratorExit()],
    ids=repr,
)
def test_the_caller_stopping_a_call_is_no_endpoint_failure(error: BaseException) -> None:
    assert classify_outcome(error) == "neutral"


def test_provider_failures_are_endpoint_failures() -> None:
    assert classify_outcome(httpx2.ReadTimeout("slow")) == "failure"
    assert classify_outcome(openai.APITimeoutError(request=REQUEST)) == "failure"
    assert classify_outcome(ValueError("ours")) == "neutral"


def _raised_from(error: BaseException, cause: BaseException) -> BaseException:
    try:
        raise error from cause
    except BaseException as exc:
        return exc


@pytest.mark.parametrize(
    ("error", "unsent"),
    [
        (httpx2.ConnectError("refused"), True),
        (httpx2.ConnectTimeout("slow handshake"), True),
        (httpx2.PoolTimeout("no free connection"), True),
        (httpx2.ReadTimeout("sent, no reply"), False),
        (httpx2.RemoteProtocolError("dropped"), False),
        (httpx2.WriteError("half sent"), False),
        (_raised_from(openai.APIConnectionError(request=REQUEST), httpx2.ConnectError("x")), True),
        (_raised_from(openai.APITimeoutError(request=REQUEST), httpx2.ReadTimeout("x")), False),
        (ConnectionRefusedError("not a transport error of the SDKs"), False),
    ],
    ids=repr,
)
def test_only_a_connection_never_made_means_not_sent(error: BaseException, unsent: bool) -> None:
    assert never_connected(error) is unsent


def test_a_cause_chain_that_loops_ends() -> None:
    first, second = ValueError("a"), ValueError("b")
    first.__cause__, second.__cause__ = second, first
    assert not never_connected(first)


def _send_request() -> None:
    raise KeyboardInterrupt


def test_an_interrupt_is_placed_by_where_it_was_raised() -> None:
    with pytest.raises(KeyboardInterrupt) as inside:
        _send_request()
    assert raised_within(inside.value, frozenset(("_send_request",)))
    with pytest.raises(KeyboardInterrupt) as outside:
        raise KeyboardInterrupt
    assert not raised_within(outside.value, frozenset(("_send_request",)))


def test_an_error_raised_in_the_transport_is_placed_there_whatever_the_sdk_calls_it() -> None:
    with httpx2.Client() as client, pytest.raises(httpx2.UnsupportedProtocol) as info:
        client.send(httpx2.Request("POST", "ftp://127.0.0.1/"))
    assert raised_within(info.value, frozenset())


@pytest.mark.parametrize(
    ("value", "count"),
    [
        (7, 7),
        (0, 0),
        (10**26, 10**15),
        (1e26, 10**15),
        (float("inf"), 10**15),
        (2.5, 3),
        (-1, None),
        (-0.5, None),
        (float("nan"), None),
        (True, None),
        ("12", None),
        (None, None),
        ([3], None),
    ],
    ids=repr,
)
def test_token_counts_from_a_payload(value: object, count: int | None) -> None:
    assert token_count(value) == count


@pytest.fixture
def breaker_clock() -> Iterator[FakeClock]:
    fake = FakeClock()
    configure_endpoint_breakers(lambda p, m: CircuitBreaker(1, 30.0, clock=fake))
    yield fake
    configure_endpoint_breakers(None)


def _admit(ctx: ExecutionContext) -> ContainedCall:
    call, _, _ = admit(
        ctx,
        trace.INVALID_SPAN,
        False,
        CallSpec(
            "openai",
            "chat",
            MODEL,
            input_bound([[{"role": "user", "content": "hi"}]], 1),
            10,
            True,
        ),
    )
    return call


@pytest.mark.parametrize(
    ("error", "sent"),
    [(KeyboardInterrupt(), True), (asyncio.CancelledError(), True), (KeyboardInterrupt(), False)],
    ids=repr,
)
def test_a_stopped_half_open_probe_is_freed_and_not_a_failure(
    breaker_clock: FakeClock, error: BaseException, sent: bool
) -> None:
    breaker = endpoint_breaker("openai", MODEL)
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        failing = _admit(ctx)
        failing.finish(httpx2.ReadTimeout("slow"))
        assert breaker.state is CircuitState.OPEN
        breaker_clock.advance(30)
        probe = _admit(ctx)  # the half-open probe
        probe.finish(error, sent=sent)
        snap = ctx.snapshot()
        assert breaker.state is CircuitState.HALF_OPEN  # not reopened by the interrupt
        _admit(ctx).finish()  # the probe slot was freed: the next call may probe
    assert breaker.state is CircuitState.CLOSED
    assert snap.reserved_usd == 0
    assert snap.steps == (2 if sent else 1)  # a probe never sent gives its step back
