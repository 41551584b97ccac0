"""_describe (the adapters' general way) asks an adapter's call_span only when it can answer."""

from __future__ import annotations

from typing import Any

from veronica_otel import ExecutionConfig, ExecutionContext


def test_call_span_is_asked_only_when_the_sdks_span_argument_is_set() -> None:
    # ProviderAdapter.span_kwarg: an SDK with its tracing off passes None for
    # its span, and _describe then asks nothing (our own span, or none).
    from veronica_otel.instrumentors._adapter import ProviderAdapter, Request, _describe

    asked: list[object] = []

    class _Adapter(ProviderAdapter):
        provider = "openai"
        span_kwarg = "call"

        def read_request(self, instance: Any, args: Any, kwargs: Any, method: str) -> Request:
            return Request("chat", "gpt-4o-mini", "hi", cap=5)

        def call_span(self, *args: Any) -> Any:
            asked.append(args[2]["call"])
            return None

    with ExecutionContext(ExecutionConfig(max_steps=5)):
        for sdk_span in (None, "the SDK's span"):
            assert _describe(_Adapter(), None, (), {"call": sdk_span}, "m") is not None
    assert asked == ["the SDK's span"]
