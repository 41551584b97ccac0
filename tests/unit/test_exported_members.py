"""The public API is exactly what DESIGN.md lists (plus a few documented extras)."""

from __future__ import annotations

import veronica_otel

DESIGN_NAMES = {
    "ExecutionConfig",
    "ExecutionContext",
    "WrapOptions",
    "Decision",
    "PolicyPipeline",
    "PolicyContext",
    "PolicyDecision",
    "RuntimePolicy",
    "BudgetEnforcer",
    "AgentStepGuard",
    "CircuitBreaker",
    "RetryContainer",
    "LoopGuard",
    "BudgetExceededError",
    "TripEvent",
    "ChainSnapshot",
    "current_context",
    "contained_tool",
    "BudgetPool",
}
EXTRAS = {
    "CallHandle",
    "CircuitState",
    "Ledger",
    "LocalLedger",
    "PoolSnapshot",
    "PriceTable",
    "ToolCall",
    "UnitPrices",
    "set_tool_prices",
    "__version__",
    "agent",
}


def test_exported_members() -> None:
    assert set(veronica_otel.__all__) == DESIGN_NAMES | EXTRAS
    assert len(veronica_otel.__all__) < 40
    for name in veronica_otel.__all__:
        assert getattr(veronica_otel, name) is not None
        if not name.startswith("_"):
            assert getattr(veronica_otel, name).__module__.startswith("veronica_otel")


def test_kernel_imports_no_client_library_or_sdk() -> None:
    import subprocess
    import sys

    code = (
        "import sys, veronica_otel\n"
        "bad = [m for m in ('openai', 'anthropic', 'httpx2', 'redis', 'opentelemetry.sdk') "
        "if m in sys.modules]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
