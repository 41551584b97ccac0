"""Retry amplification, uncontained and contained.

Three nested layers (agent -> tool -> model client) each retry three times when
the answer fails validation: one user action becomes (1 + 3) ** 3 = 64 model
calls. Each layer's retry budget looks reasonable; only the aggregate is wrong.
Under an ExecutionContext the retries of every layer draw on one chain-wide
budget, and the call that would cross a ceiling is never made.

Run: python examples/runaway_retries.py
"""

from __future__ import annotations

import contextlib
import time

from veronica_otel import (
    BudgetExceededError,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    RetryContainer,
    WrapOptions,
    current_context,
)

PRICE_PER_CALL = 0.01
CALL = WrapOptions(operation_name="chat", cost_estimate_hint=PRICE_PER_CALL)


class InvalidAnswer(Exception):
    """The model's answer did not validate, so the caller retries."""


class FakeModel:
    """Stands in for a model that keeps returning answers that fail validation."""

    def __init__(self) -> None:
        self.calls = 0

    def complete(self) -> str:
        self.calls += 1
        return "not json"


def ask(model: FakeModel) -> str:
    """One model call; contained when a chain is active."""
    ctx = current_context()
    if ctx is None:
        answer = model.complete()
    else:
        box: list[str] = []
        if ctx.wrap_llm_call(lambda: box.append(model.complete()), CALL) is Decision.HALT:
            raise BudgetExceededError(ctx.trip) if ctx.trip else RuntimeError("denied")
        answer = box[0]
    if not answer.startswith("{"):
        raise InvalidAnswer(answer)
    return answer


def layer(depth: int, model: FakeModel) -> str:
    retry = RetryContainer(max_retries=3, backoff_base=0.0, sleep=lambda _s: None)
    if depth == 3:
        return retry.execute(ask, model)
    return retry.execute(layer, depth + 1, model)


def run(config: ExecutionConfig | None) -> tuple[int, float, str, float]:
    model = FakeModel()
    started = time.perf_counter()
    outcome = "gave up (retries exhausted)"
    if config is None:
        with contextlib.suppress(InvalidAnswer):
            layer(1, model)
    else:
        with ExecutionContext(config, name="retry-amplification") as ctx:
            try:
                layer(1, model)
            except BudgetExceededError as exc:
                outcome = f"tripped: {exc.reason} (limit {exc.limit:g})"
            except InvalidAnswer:
                pass
            assert ctx.snapshot().steps == model.calls
    elapsed_ms = (time.perf_counter() - started) * 1000
    return model.calls, model.calls * PRICE_PER_CALL, outcome, elapsed_ms


def main() -> None:
    rows = [
        ("uncontained", None),
        ("max_retries_total=5", ExecutionConfig(max_retries_total=5)),
        ("max_cost_usd=0.10", ExecutionConfig(max_cost_usd=0.10)),
    ]
    print("Retry amplification: 3 nested layers x 3 retries, $0.01 per model call\n")
    print(f"{'run':<22}{'calls':>7}{'USD':>8}  {'time':>8}  outcome")
    baseline = None
    for label, config in rows:
        calls, usd, outcome, ms = run(config)
        baseline = baseline or calls
        cut = f" ({100 * (1 - calls / baseline):.0f}% fewer calls)" if config else ""
        print(f"{label:<22}{calls:>7}{usd:>8.2f}  {ms:>6.1f}ms  {outcome}{cut}")


if __name__ == "__main__":
    main()
