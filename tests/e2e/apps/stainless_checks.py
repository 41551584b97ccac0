"""Containment checks for whichever Stainless SDKs this venv has (openai, anthropic).

Run by tests/e2e/test_stainless_majors.py in a venv built with other majors
than the project's own (openai 2.x, anthropic 0.x / 1.x). The LLM is a
:class:`FakeLLMServer` in this process; every number reported about what was
sent is the server's own count. Prints one JSON object:
``{"versions": {...}, "<sdk>": {"<check>": {...}}}``; the test asserts on it.
A check that raises is reported as ``{"error": "..."}``, never hidden.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import sys
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from typing import Any

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel._pricing import default_price_table
from veronica_otel._units import nano_to_usd
from veronica_otel.instrumentors._admit import input_bound
from veronica_otel.testing import FakeLLMServer

CAP = 50  # every call sets its output cap: its reservation is known
N = 3  # max_steps of the step checks
CALLS = 5  # calls made against it


class Sdk:
    """One SDK: how a client is made, a call made, and what its errors are called."""

    def __init__(self, name: str, path: str, model: str) -> None:
        self.name, self.path, self.model = name, path, model
        self.module: Any = importlib.import_module(name)
        self.messages = [{"role": "user", "content": "Say hello."}]

    def base_url(self, server: FakeLLMServer) -> str:
        return server.openai_base_url if self.name == "openai" else server.anthropic_base_url

    def client(self, server: FakeLLMServer, *, is_async: bool = False, **options: Any) -> Any:
        options.setdefault("max_retries", 0)
        kind = ("Async" if is_async else "") + ("OpenAI" if self.name == "openai" else "Anthropic")
        return getattr(self.module, kind)(base_url=self.base_url(server), api_key="k", **options)

    def params(self, stream: bool) -> dict[str, Any]:
        params: dict[str, Any] = {"model": self.model, "messages": self.messages, "stream": stream}
        params["max_completion_tokens" if self.name == "openai" else "max_tokens"] = CAP
        return params

    def call(self, client: Any, stream: bool = False) -> Any:
        if self.name == "openai":
            return client.chat.completions.create(**self.params(stream))
        return client.messages.create(**self.params(stream))

    async def acall(self, client: Any) -> Any:
        if self.name == "openai":
            return await client.chat.completions.create(**self.params(False))
        return await client.messages.create(**self.params(False))

    def prices(self) -> Any:
        found = default_price_table().lookup(self.name, self.model)
        assert found is not None, self.model
        return found

    def reservation_usd(self) -> float:
        # No block is marked for caching: input is reserved at the input price,
        # not the cache-write price (an anthropic request could only write a
        # cache where it marks one).
        bound = input_bound([self.messages], 1)
        return nano_to_usd(self.prices().max_cost_nano(bound, CAP, cache_writes=False))

    def billed_usd(self, server: FakeLLMServer) -> float:
        prices = self.prices()
        nano = sum(
            prices.cost_nano(b.input_tokens, b.output_tokens, b.cached_tokens, b.reasoning_tokens)
            for b in server.billed
        )
        return nano_to_usd(nano)


def _http_library(http_client: Any) -> str:
    """``httpx`` or ``httpx2``: the library of the SDK's HTTP client (its base class)."""
    roots = (cls.__module__.split(".", 1)[0] for cls in type(http_client).__mro__)
    return next((root for root in roots if root in ("httpx", "httpx2")), "unknown")


def _outcome(run: Callable[[], Any]) -> str:
    try:
        run()
    except BudgetExceededError as exc:
        return f"denied:{exc.reason}"
    return "sent"


def _snap(ctx: ExecutionContext) -> dict[str, Any]:
    snap = ctx.snapshot()
    return {
        "cost": snap.cost_usd,
        "reserved": snap.reserved_usd,
        "steps": snap.steps,
        "retries": snap.retries,
    }


# -- the checks: each gets the SDK and a fresh server --------------------------------


def steps_sync(sdk: Sdk, server: FakeLLMServer) -> dict[str, Any]:
    with sdk.client(server) as client, ExecutionContext(ExecutionConfig(max_steps=N)) as ctx:
        outcomes = [_outcome(lambda: sdk.call(client)) for _ in range(CALLS)]
        http = _http_library(client._client)
    return {"outcomes": outcomes, "http": http, "at_server": server.count(sdk.path), **_snap(ctx)}


def steps_async(sdk: Sdk, server: FakeLLMServer) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        async with (
            sdk.client(server, is_async=True) as client,
            ExecutionContext(ExecutionConfig(max_steps=N)) as ctx,
        ):
            results = await asyncio.gather(
                *(sdk.acall(client) for _ in range(CALLS)), return_exceptions=True
            )
        outcomes = [
            f"denied:{r.reason}"
            if isinstance(r, BudgetExceededError)
            else "sent"
            if not isinstance(r, BaseException)
            else f"error:{type(r).__name__}"
            for r in results
        ]
        return {"outcomes": sorted(outcomes), "at_server": server.count(sdk.path), **_snap(ctx)}

    return asyncio.run(main())


def steps_threads(sdk: Sdk, server: FakeLLMServer) -> dict[str, Any]:
    with (
        sdk.client(server) as client,
        ExecutionContext(ExecutionConfig(max_steps=N)) as ctx,
        ThreadPoolExecutor(4) as pool,
    ):
        futures = [pool.submit(_outcome, lambda: sdk.call(client)) for _ in range(CALLS)]
        outcomes = sorted(f.result() for f in futures)
    return {"outcomes": outcomes, "at_server": server.count(sdk.path), **_snap(ctx)}


def cost_ceiling(sdk: Sdk, server: FakeLLMServer) -> dict[str, Any]:
    ceiling = 2.5 * sdk.reservation_usd()  # two calls' worst case fit, never a third
    outcomes: list[str] = []
    with (
        sdk.client(server) as client,
        ExecutionContext(ExecutionConfig(max_cost_usd=ceiling)) as ctx,
    ):
        while not outcomes or outcomes[-1] == "sent":
            outcomes.append(_outcome(lambda: sdk.call(client)))
    return {
        "outcomes": outcomes,
        "ceiling": ceiling,
        "billed": sdk.billed_usd(server),
        "at_server": server.count(sdk.path),
        **_snap(ctx),
    }


def stream_cut(sdk: Sdk, server: FakeLLMServer) -> dict[str, Any]:
    with sdk.client(server) as client, ExecutionContext(ExecutionConfig(max_steps=2)) as ctx:
        stream = sdk.call(client, stream=True)
        iterator = iter(stream)
        next(iterator)
        sdk.call(client)  # step 2
        tripping = _outcome(lambda: sdk.call(client))  # step 3: trips the chain
        try:
            for _ in iterator:
                pass
            cut = "not cut"
        except BudgetExceededError as exc:
            cut = f"denied:{exc.reason}"
    return {
        "tripping": tripping,
        "cut": cut,
        "closed": stream.response.is_closed,
        "at_server": server.count(sdk.path),
        **_snap(ctx),
    }


def retry_after_500(sdk: Sdk, server: FakeLLMServer) -> dict[str, Any]:
    server.fail_next(1, status=500, retry_after_ms=1)
    with (
        sdk.client(server, max_retries=2) as client,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        outcome = _outcome(lambda: sdk.call(client))
    return {
        "outcome": outcome,
        "billed": sdk.billed_usd(server),
        "at_server": server.count(sdk.path),
        **_snap(ctx),
    }


def retry_refused(sdk: Sdk, server: FakeLLMServer) -> dict[str, Any]:
    server.fail_next(2, status=500, retry_after_ms=1)
    config = ExecutionConfig(max_cost_usd=1.0, max_retries_total=0)
    with sdk.client(server, max_retries=2) as client, ExecutionContext(config) as ctx:
        outcome = _outcome(lambda: sdk.call(client))
    return {"outcome": outcome, "at_server": server.count(sdk.path), **_snap(ctx)}


def status_error(sdk: Sdk, server: FakeLLMServer) -> dict[str, Any]:
    server.fail_next(1, status=500)
    with sdk.client(server) as client, ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        try:
            sdk.call(client)
            raised = "nothing"
        except sdk.module.APIStatusError as exc:
            raised = f"{type(exc).__name__}:{exc.status_code}"
    return {"raised": raised, "at_server": server.count(sdk.path), **_snap(ctx)}


def timeout_after_send(sdk: Sdk, server: FakeLLMServer) -> dict[str, Any]:
    server.set_latency(2.0)
    with (
        sdk.client(server, timeout=0.2) as client,
        ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
    ):
        try:
            sdk.call(client)
            raised = "nothing"
        except sdk.module.APITimeoutError as exc:
            raised = type(exc).__name__
    return {
        "raised": raised,
        "reservation": sdk.reservation_usd(),
        "at_server": server.count(sdk.path),
        **_snap(ctx),
    }


def cancelled_after_send(sdk: Sdk, server: FakeLLMServer) -> dict[str, Any]:
    server.set_latency(2.0)

    async def main() -> dict[str, Any]:
        async with (
            sdk.client(server, is_async=True) as client,
            ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx,
        ):
            try:
                await asyncio.wait_for(sdk.acall(client), 0.3)  # cancelled while it waits
                raised = "nothing"
            except TimeoutError:
                raised = "cancelled"
        return {
            "raised": raised,
            "reservation": sdk.reservation_usd(),
            "at_server": server.count(sdk.path),
            **_snap(ctx),
        }

    return asyncio.run(main())


CHECKS = (
    steps_sync,
    steps_async,
    steps_threads,
    cost_ceiling,
    stream_cut,
    retry_after_500,
    retry_refused,
    status_error,
    timeout_after_send,
    cancelled_after_send,
)


def _run(sdk: Sdk) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for check in CHECKS:
        with FakeLLMServer(output_tokens=10) as server:
            try:
                results[check.__name__] = check(sdk, server)
            except Exception as exc:
                results[check.__name__] = {
                    "error": f"{type(exc).__name__}: {exc}",
                    "trace": traceback.format_exc(),
                }
    return results


def main() -> None:
    from veronica_otel.instrumentors.anthropic import AnthropicInstrumentor
    from veronica_otel.instrumentors.openai import OpenAIInstrumentor

    report: dict[str, Any] = {"versions": {}, "hooks": {}}
    for name in ("openai", "httpx", "httpx2", "anthropic"):
        if importlib.util.find_spec(name) is not None:
            report["versions"][name] = version(name)
    sdks = []
    if "openai" in report["versions"]:
        instrumentor: Any = OpenAIInstrumentor()
        instrumentor.instrument()
        report["hooks"]["openai"] = [hook.name for hook in instrumentor._hooks.hooks]
        sdks.append(Sdk("openai", "/v1/chat/completions", "gpt-4o-mini"))
    if "anthropic" in report["versions"]:
        instrumentor = AnthropicInstrumentor()
        instrumentor.instrument()
        report["hooks"]["anthropic"] = [hook.name for hook in instrumentor._hooks.hooks]
        sdks.append(Sdk("anthropic", "/v1/messages", "claude-haiku-4-5"))
    for sdk in sdks:
        report[sdk.name] = _run(sdk)
    report["httpx2_imported"] = "httpx2" in sys.modules
    print(json.dumps(report))


if __name__ == "__main__":
    main()
