"""Hostile and careless input: every limit, option and report is validated by name.

NaN, infinities, negatives, bools and strings posing as numbers, absurd
magnitudes, malformed environment variables, coroutine functions handed to the
sync wrappers and malformed chain ids are all refused, and a refused input
leaves the chain's ledger exactly as it was.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from veronica_otel import (
    AgentStepGuard,
    BudgetEnforcer,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    LocalLedger,
    PolicyPipeline,
    WrapOptions,
)
from veronica_otel._config import ENV_LIMITS
from veronica_otel._ledger import LedgerState

NAN, INF = math.nan, math.inf

CONFIG_FIELDS = [f.name for f in dataclasses.fields(ExecutionConfig)]
SECONDS_FIELDS = ["reservation_wait_s"]  # a float number of seconds
COUNT_FIELDS = [n for n in CONFIG_FIELDS if n != "max_cost_usd" and n not in SECONDS_FIELDS]

# (id, value) of inputs that no limit, hint or count may accept.
BAD_NUMBERS: list[tuple[str, object]] = [
    ("nan", NAN),
    ("+inf", INF),
    ("-inf", -INF),
    ("negative-int", -1),
    ("negative-float", -0.5),
    ("bool-true", True),
    ("bool-false", False),
    ("str", "1.0"),
    ("absurd-float", 1e300),
    ("absurd-int", 10**300),
    ("none-ish-str", "None"),
    ("list", [1]),
]
# The same, for integer counts (where a fractional float is also wrong).
BAD_COUNTS: list[tuple[str, object]] = [*BAD_NUMBERS, ("fraction", 2.5), ("whole-float", 3.0)]


def _bad(values: list[tuple[str, object]]) -> list[Any]:
    return [pytest.param(value, id=name) for name, value in values]


@pytest.fixture
def ledger() -> LocalLedger:
    return LocalLedger()


@pytest.fixture
def ctx(ledger: LocalLedger) -> Iterator[ExecutionContext]:
    """A chain with some history, so that "unchanged" means something."""
    config = ExecutionConfig(max_cost_usd=5.0, max_steps=50, max_tokens=100_000)
    with ExecutionContext(config, ledger=ledger) as context:

        def used() -> None:
            context.record_usage(cost_usd=0.25, input_tokens=100, output_tokens=20)

        assert context.wrap_llm_call(used) is Decision.ALLOW
        snap = ledger.snapshot(context.chain_id)
        assert (snap.steps, snap.tokens, snap.cost_nano) == (1, 120, 250_000_000)
        yield context


def _ledger_state(ledger: LocalLedger, ctx: ExecutionContext) -> LedgerState:
    return ledger.snapshot(ctx.chain_id)


# -- ExecutionConfig ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        *[
            pytest.param(field, value, id=f"{field}-{name}")
            for field in COUNT_FIELDS
            for name, value in BAD_COUNTS
        ],
        *[
            pytest.param(field, value, id=f"{field}-{name}")
            for field in ("max_cost_usd", *SECONDS_FIELDS)
            for name, value in BAD_NUMBERS
        ],
    ],
)
def test_config_rejects_bad_values_by_name(field: str, value: object) -> None:
    with pytest.raises((ValueError, TypeError), match=field):
        ExecutionConfig(**{field: value})


def _design_marks(field: str, value: object) -> list[pytest.MarkDecorator]:
    """DESIGN: NaN, inf and bools-as-numbers are a ValueError at construction."""
    return []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param(field, value, id=f"{field}-{name}", marks=_design_marks(field, value))
        for field in CONFIG_FIELDS
        for name, value in [
            ("nan", NAN),
            ("+inf", INF),
            ("-inf", -INF),
            ("negative", -1),
            ("bool", True),
        ]
    ],
)
def test_config_raises_value_error_as_design_says(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        ExecutionConfig(**{field: value})


@pytest.mark.parametrize("field", COUNT_FIELDS)
def test_config_replace_is_validated_too(field: str) -> None:
    good = ExecutionConfig(**{field: 3})
    with pytest.raises((ValueError, TypeError), match=field):
        dataclasses.replace(good, **{field: -3})
    with pytest.raises(dataclasses.FrozenInstanceError):
        good.max_steps = 5  # type: ignore[misc]


def test_config_max_repeats_zero_is_rejected() -> None:
    with pytest.raises(ValueError, match="max_repeats"):
        ExecutionConfig(max_repeats=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_cost_usd": 0},
        {"max_cost_usd": 0.0},
        {"max_cost_usd": 1e9},
        {"max_steps": 0},
        {"max_steps": 10**15},
        {"max_retries_total": 0},
        {"timeout_ms": 0},
        {"max_tokens": 0},
        {"max_repeats": 1},
        {"max_depth": 0},
    ],
    ids=repr,
)
def test_config_accepts_edge_values(kwargs: dict[str, object]) -> None:
    config = ExecutionConfig(**kwargs)  # type: ignore[arg-type]
    for name, value in kwargs.items():
        assert getattr(config, name) == value


# -- ExecutionConfig.from_env ----------------------------------------------------------

INT_GARBAGE = ["nan", "inf", "-1", "1e999", "ten", "1.5", "true", "1e3", "--5", "0x10", "5 6"]
USD_GARBAGE = ["nan", "inf", "-inf", "-1", "1e999", "1e300", "ten", "true", "$1", "1,5"]
SECONDS_GARBAGE = ["nan", "inf", "-1", "1e999", "1e4", "ten", "true", "5s", "--5", "5 6"]


@pytest.mark.parametrize(
    ("var", "raw"),
    [
        *[
            pytest.param(var, raw, id=f"{var}={raw}")
            for field, var in ENV_LIMITS.items()
            if field != "max_cost_usd" and field not in SECONDS_FIELDS
            for raw in INT_GARBAGE
        ],
        *[
            pytest.param(ENV_LIMITS[field], raw, id=f"{ENV_LIMITS[field]}={raw}")
            for field in SECONDS_FIELDS
            for raw in SECONDS_GARBAGE
        ],
        *[
            pytest.param(ENV_LIMITS["max_cost_usd"], raw, id=f"VERONICA_MAX_COST_USD={raw}")
            for raw in USD_GARBAGE
        ],
        pytest.param("VERONICA_MAX_STEPS", "abc", id="VERONICA_MAX_STEPS=abc"),
        pytest.param("VERONICA_MAX_REPEATS", "0", id="VERONICA_MAX_REPEATS=0"),
    ],
)
def test_from_env_names_the_variable_and_the_value(var: str, raw: str) -> None:
    environ = {"VERONICA_MAX_DEPTH": "3", var: raw}
    with pytest.raises(ValueError) as raised:
        ExecutionConfig.from_env(environ)
    message = str(raised.value)
    assert var in message
    assert repr(raw) in message


def test_from_env_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ENV_LIMITS.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("VERONICA_MAX_TOKENS", "ten")
    with pytest.raises(ValueError, match="VERONICA_MAX_TOKENS='ten'"):
        ExecutionConfig.from_env()


def test_from_env_good_values() -> None:
    environ = {
        "VERONICA_MAX_COST_USD": " 1.25 ",
        "VERONICA_MAX_STEPS": "1_000",
        "VERONICA_MAX_RETRIES_TOTAL": "0",
        "VERONICA_TIMEOUT_MS": "30000",
        "VERONICA_MAX_TOKENS": "+5",
        "VERONICA_MAX_REPEATS": "3",
        "VERONICA_MAX_DEPTH": "",
    }
    assert ExecutionConfig.from_env(environ) == ExecutionConfig(
        max_cost_usd=1.25,
        max_steps=1000,
        max_retries_total=0,
        timeout_ms=30_000,
        max_tokens=5,
        max_repeats=3,
        max_depth=None,
    )
    assert ExecutionConfig.from_env({}) == ExecutionConfig()


# -- WrapOptions ------------------------------------------------------------------------


@pytest.mark.parametrize("value", _bad(BAD_NUMBERS))
def test_wrap_options_cost_hint_rejected(
    ctx: ExecutionContext, ledger: LocalLedger, value: object
) -> None:
    before = _ledger_state(ledger, ctx)
    with pytest.raises((ValueError, TypeError), match="cost_estimate_hint"):
        WrapOptions(cost_estimate_hint=value)  # type: ignore[arg-type]
    assert _ledger_state(ledger, ctx) == before


@pytest.mark.parametrize("field", ["input_tokens", "max_tokens"])
@pytest.mark.parametrize("value", _bad(BAD_COUNTS))
def test_wrap_options_token_counts_rejected(
    ctx: ExecutionContext, ledger: LocalLedger, field: str, value: object
) -> None:
    before = _ledger_state(ledger, ctx)
    with pytest.raises((ValueError, TypeError), match=field):
        WrapOptions(**{field: value})
    assert _ledger_state(ledger, ctx) == before


@pytest.mark.parametrize("value", [1, "yes", None])
def test_wrap_options_retry_must_be_bool(value: object) -> None:
    with pytest.raises(TypeError, match="retry"):
        WrapOptions(retry=value)  # type: ignore[arg-type]


# -- ExecutionContext.record_usage -------------------------------------------------------


@pytest.mark.parametrize("value", _bad(BAD_NUMBERS))
def test_record_usage_rejects_bad_cost(
    ctx: ExecutionContext, ledger: LocalLedger, value: object
) -> None:
    before = _ledger_state(ledger, ctx)
    with pytest.raises((ValueError, TypeError), match="cost_usd"):
        ctx.record_usage(cost_usd=value)  # type: ignore[arg-type]
    assert _ledger_state(ledger, ctx) == before


@pytest.mark.parametrize(
    "field", ["input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens"]
)
@pytest.mark.parametrize("value", _bad(BAD_COUNTS))
def test_record_usage_rejects_bad_token_counts(
    ctx: ExecutionContext, ledger: LocalLedger, field: str, value: object
) -> None:
    before = _ledger_state(ledger, ctx)
    with pytest.raises((ValueError, TypeError), match=field):
        ctx.record_usage(cost_usd=0.01, **{field: value})
    assert _ledger_state(ledger, ctx) == before


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"input_tokens": 10, "cached_input_tokens": 11}, "cached_input_tokens"),
        ({"input_tokens": 0, "cached_input_tokens": 1}, "cached_input_tokens"),
        ({"output_tokens": 5, "reasoning_tokens": 6}, "reasoning_tokens"),
    ],
    ids=repr,
)
def test_record_usage_rejects_impossible_breakdowns(
    ctx: ExecutionContext, ledger: LocalLedger, kwargs: dict[str, int], match: str
) -> None:
    before = _ledger_state(ledger, ctx)
    with pytest.raises(ValueError, match=match):
        ctx.record_usage(cost_usd=0.5, **kwargs)
    assert _ledger_state(ledger, ctx) == before


def test_rejected_report_inside_a_call_adds_no_usage(
    ctx: ExecutionContext, ledger: LocalLedger
) -> None:
    before = _ledger_state(ledger, ctx)
    rejected: list[Exception] = []

    def call() -> None:
        for bad in ({"cost_usd": NAN}, {"cost_usd": 1.0, "input_tokens": -5}):
            try:
                ctx.record_usage(**bad)  # type: ignore[arg-type]
            except (ValueError, TypeError) as exc:
                rejected.append(exc)

    hint = WrapOptions(cost_estimate_hint=0.125, input_tokens=7)
    assert ctx.wrap_llm_call(call, hint) is Decision.ALLOW
    assert len(rejected) == 2
    after = _ledger_state(ledger, ctx)
    # With no valid report the call commits what it reserved, nothing more.
    assert after.cost_nano - before.cost_nano == 125_000_000
    assert after.tokens - before.tokens == 7
    assert after.steps == before.steps + 1
    assert (after.reserved_nano, after.reserved_tokens) == (0, 0)


# -- BudgetEnforcer ------------------------------------------------------------------------


@pytest.mark.parametrize("value", _bad(BAD_NUMBERS))
def test_budget_enforcer_rejects_bad_limit(value: object) -> None:
    with pytest.raises((ValueError, TypeError), match="limit_usd"):
        BudgetEnforcer(limit_usd=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", _bad(BAD_NUMBERS))
def test_budget_enforcer_spend_rejects_bad_amount(value: object) -> None:
    budget = BudgetEnforcer(limit_usd=1.0)
    assert budget.spend(0.5)
    with pytest.raises((ValueError, TypeError), match="amount_usd"):
        budget.spend(value)  # type: ignore[arg-type]
    assert budget.spent_usd == 0.5
    assert not budget.exceeded
    assert budget.spend(0.5)


# -- coroutine functions handed to the sync wrappers ------------------------------------------


async def _async_call() -> str:
    return "never run"


class _AsyncCallable:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        return "never run"


def _async_callables() -> list[Any]:
    return [
        pytest.param(lambda: _async_call, id="coroutine-function"),
        pytest.param(_AsyncCallable, id="async-callable-object"),
        pytest.param(lambda: functools.partial(_async_call), id="partial-of-coroutine-function"),
    ]


@pytest.mark.parametrize("wrapper", ["wrap_llm_call", "wrap_tool_call"])
@pytest.mark.parametrize("make", _async_callables())
def test_sync_wrappers_refuse_coroutine_functions(
    ledger: LocalLedger, wrapper: str, make: Callable[[], Callable[[], Any]]
) -> None:
    steps = AgentStepGuard(max_steps=10)
    config = ExecutionConfig(max_cost_usd=1.0, max_steps=10)
    with ExecutionContext(config, PolicyPipeline([steps]), ledger=ledger) as ctx:
        fn = make()
        with pytest.raises(TypeError, match=f"a{wrapper}"):
            getattr(ctx, wrapper)(fn, WrapOptions(cost_estimate_hint=0.5))
        snap = ctx.snapshot()
    assert snap.steps == 0
    assert snap.cost_usd == 0.0
    assert snap.reserved_usd == 0.0
    assert not snap.aborted
    assert steps.current_step == 0
    if isinstance(fn, _AsyncCallable):
        assert fn.calls == 0


@pytest.mark.parametrize("wrapper", ["wrap_llm_call", "wrap_tool_call"])
def test_sync_wrapper_refuses_a_returned_coroutine_without_charging_cost(
    ledger: LocalLedger, wrapper: str
) -> None:
    steps = AgentStepGuard(max_steps=10)
    with ExecutionContext(
        ExecutionConfig(max_cost_usd=1.0), PolicyPipeline([steps]), ledger=ledger
    ) as ctx:
        # A plain lambda returning a coroutine: only detectable after it ran.
        with pytest.raises(TypeError, match=f"a{wrapper}"):
            getattr(ctx, wrapper)(lambda: _async_call(), WrapOptions(cost_estimate_hint=0.5))
        snap = ctx.snapshot()
    assert snap.cost_usd == 0.0
    assert snap.reserved_usd == 0.0
    assert steps.current_step == 0  # the pipeline was told the call was not sent


def test_sync_wrapper_refusing_a_returned_coroutine_charges_no_step(
    ledger: LocalLedger,
) -> None:
    with ExecutionContext(ExecutionConfig(max_steps=10), ledger=ledger) as ctx:
        with pytest.raises(TypeError):
            ctx.wrap_llm_call(lambda: _async_call())
        assert ctx.snapshot().steps == 0


@pytest.mark.parametrize("fn", [None, 42, "not callable"], ids=repr)
def test_sync_wrappers_refuse_non_callables(ctx: ExecutionContext, fn: object) -> None:
    before = ctx.snapshot().steps
    with pytest.raises(TypeError, match="callable"):
        ctx.wrap_llm_call(fn)  # type: ignore[arg-type]
    assert ctx.snapshot().steps == before


# -- chain ids and constructor types -------------------------------------------------------------


@pytest.mark.parametrize(
    "chain_id",
    [
        "",
        "x" * 129,
        "has space",
        " leading",
        "tab\tchar",
        "new\nline",
        "naïve",
        "\uff46\uff55\uff4c\uff4c",  # full-width "full"
        "emoji-\U0001f600",
        "slash/id",
        "semi;colon",
        "quote'id",
        "nul\x00byte",
        123,
        b"bytes",
    ],
    ids=repr,
)
def test_chain_id_validation(ledger: LocalLedger, chain_id: object) -> None:
    with pytest.raises((ValueError, TypeError), match="chain_id"):
        ExecutionContext(chain_id=chain_id, ledger=ledger)  # type: ignore[arg-type]
    assert len(ledger) == 0  # a refused context holds nothing in the ledger


@pytest.mark.parametrize("chain_id", ["a", "x" * 128, "A-b_c.d:9", "run:2024-01-01.1"], ids=repr)
def test_chain_id_accepted(ledger: LocalLedger, chain_id: str) -> None:
    ctx = ExecutionContext(chain_id=chain_id, ledger=ledger)
    assert ctx.chain_id == chain_id
    assert ctx.snapshot().chain_id == chain_id


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"config": {"max_steps": 1}}, "config"),
        ({"config": 5}, "config"),
        ({"pipeline": []}, "pipeline"),
    ],
    ids=repr,
)
def test_context_rejects_wrong_types(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(TypeError, match=match):
        ExecutionContext(**kwargs)  # type: ignore[arg-type]
