"""The shared adapter machinery (``instrumentors/_adapter.py``, ``_attempts.py``).

A small SDK written here the way vendor SDKs are (its own retry loop, its
own error type wrapping everything, lazy streams) sends real HTTP through
``httpx2`` and ``requests`` to the fake server; an adapter built on
``_adapter.wrapper`` contains it. What reached the server is counted there.
Each provider's adapter has its own tests with its real SDK; these pin what
they all inherit: the step and retry counts, the G10 table, our denial seen
as itself through an SDK's error wrapping, lazy streams, and G13.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import pytest
import requests
import wrapt

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel.instrumentors._adapter import (
    ADMITTED,
    ProviderAdapter,
    Request,
    wrapper,
)
from veronica_otel.instrumentors._attempts import _async_hook, _sync_hook, ensure_attempt_hooks
from veronica_otel.instrumentors._common import ContainedCall
from veronica_otel.instrumentors._guard_transports import TRANSPORTS
from veronica_otel.instrumentors._unwrap import is_ours, unwrap_ours
from veronica_otel.testing import FakeLLMServer

MODEL = "gpt-4o-mini"
MESSAGES = [{"role": "user", "content": "hello"}]


class SDKError(Exception):
    """The stand-in SDK's one error type: it wraps whatever went wrong."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class MiniSDK:
    """An OpenAI-compatible client with its own retries, as vendor SDKs have."""

    def __init__(self, base_url: str, transport: str = "httpx2", retries: int = 2) -> None:
        self.base_url = base_url
        self.transport = transport
        self.retries = retries
        self.timeout = 5.0

    def _post(self, body: dict[str, Any]) -> tuple[int, Any]:
        url = self.base_url + "/chat/completions"
        if self.transport == "requests":
            reply = requests.post(url, json=body, timeout=self.timeout)
            return reply.status_code, reply.json()
        answer = httpx2.post(url, json=body, timeout=self.timeout)
        return answer.status_code, answer.json()

    def chat(self, model: str, messages: list[Any], max_tokens: int | None = None) -> Any:
        body = {"model": model, "messages": messages, "max_tokens": max_tokens}
        try:
            for attempt in range(self.retries + 1):
                status, payload = self._post(body)
                if status < 500 or attempt == self.retries:
                    break
        except Exception as exc:  # as SDKs do: every failure becomes their own type
            raise SDKError(f"request failed: {exc}") from exc
        if status >= 400:
            raise SDKError(f"HTTP {status}", status_code=status)
        return payload

    def stream(self, model: str, messages: list[Any], max_tokens: int | None = None) -> Any:
        body = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": True}
        body["stream_options"] = {"include_usage": True}

        def events() -> Iterator[Any]:  # sends on the first next(), as generators do
            with httpx2.stream("POST", self.base_url + "/chat/completions", json=body) as reply:
                for line in reply.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        yield json.loads(line[6:])

        return events()

    async def achat(self, model: str, messages: list[Any], max_tokens: int | None = None) -> Any:
        body = {"model": model, "messages": messages, "max_tokens": max_tokens}
        async with httpx2.AsyncClient(timeout=self.timeout) as client:
            try:
                for attempt in range(self.retries + 1):
                    reply = await client.post(self.base_url + "/chat/completions", json=body)
                    if reply.status_code < 500 or attempt == self.retries:
                        break
            except Exception as exc:
                raise SDKError(f"request failed: {exc}") from exc
        if reply.status_code >= 400:
            raise SDKError(f"HTTP {reply.status_code}", status_code=reply.status_code)
        return reply.json()

    async def astream(self, model: str, messages: list[Any]) -> AsyncIterator[Any]:
        body = {"model": model, "messages": messages, "stream": True, "max_tokens": 50}
        body["stream_options"] = {"include_usage": True}
        async with (
            httpx2.AsyncClient() as client,
            client.stream("POST", self.base_url + "/chat/completions", json=body) as reply,
        ):
            async for line in reply.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    yield json.loads(line[6:])


class MiniAdapter(ProviderAdapter):
    provider = "openai"

    def read_request(
        self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], method: str
    ) -> Request:
        messages = kwargs.get("messages", [])
        return Request(
            "chat",
            kwargs.get("model", "unknown"),
            messages,
            len(messages),
            kwargs.get("max_tokens"),
            clampable=True,
            stream=method in ("stream", "astream"),
        )

    def rewrite(
        self,
        instance: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        cap: int | None,
        model: str | None,
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        changed = dict(kwargs)
        if cap is not None:
            changed["max_tokens"] = cap
        if model is not None:
            changed["model"] = model
        return args, changed

    def read_reply(self, call: ContainedCall, reply: Any) -> None:
        usage = reply["usage"]
        call.set_usage(usage["prompt_tokens"], usage["completion_tokens"])

    def read_item(self, call: ContainedCall, item: Any) -> None:
        for choice in item.get("choices") or ():
            call.add_text((choice.get("delta") or {}).get("content") or "")
        usage = item.get("usage")
        if usage:
            call.set_usage(usage["prompt_tokens"], usage["completion_tokens"])


_ADAPTER = MiniAdapter()
_METHODS = (("chat", False), ("stream", False), ("achat", True), ("astream", False))


@pytest.fixture(autouse=True)
def contained_sdk() -> Iterator[None]:
    ensure_attempt_hooks()
    wrappers = {name: wrapper(_ADAPTER, name, is_async) for name, is_async in _METHODS}
    for name, hook in wrappers.items():
        wrapt.wrap_function_wrapper(MiniSDK, name, hook)
    yield
    for name, hook in wrappers.items():
        unwrap_ours(MiniSDK, name, hook)


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=4) as fake:
        yield fake


def _sdk(server: FakeLLMServer, **options: Any) -> MiniSDK:
    return MiniSDK(server.openai_base_url, **options)


@pytest.mark.parametrize("transport", ["httpx2", "requests"])
def test_steps_stop_at_the_limit_counted_at_the_server(
    server: FakeLLMServer, transport: str
) -> None:
    sdk = _sdk(server, transport=transport)
    with ExecutionContext(ExecutionConfig(max_steps=3)) as ctx:
        for _ in range(3):
            sdk.chat(model=MODEL, messages=MESSAGES, max_tokens=10)
        with pytest.raises(BudgetExceededError) as denied:
            sdk.chat(model=MODEL, messages=MESSAGES, max_tokens=10)
    assert denied.value.reason == "steps"
    assert server.request_count == 3
    assert ctx.snapshot().steps == 3


@pytest.mark.parametrize("transport", ["httpx2", "requests"])
def test_the_sdks_own_retries_are_drawn_and_a_denied_one_is_not_sent(
    server: FakeLLMServer, transport: str
) -> None:
    sdk = _sdk(server, transport=transport, retries=5)
    with ExecutionContext(ExecutionConfig(max_retries_total=2, max_cost_usd=1.0)) as ctx:
        server.fail_next(2, status=500)
        sdk.chat(model=MODEL, messages=MESSAGES, max_tokens=10)
        assert ctx.snapshot().retries == 2
        assert server.request_count == 3
        server.fail_next(1, status=503)
        # The SDK wraps every failure in its own error; the caller sees ours.
        with pytest.raises(BudgetExceededError) as denied:
            sdk.chat(model=MODEL, messages=MESSAGES, max_tokens=10)
    assert denied.value.reason == "retries"
    assert isinstance(denied.value.__cause__, SDKError)
    assert server.request_count == 4  # the refused retry never left


def test_connection_refused_costs_nothing() -> None:
    sdk = MiniSDK("http://127.0.0.1:9/v1", retries=0)
    with ExecutionContext(ExecutionConfig(max_steps=5, max_cost_usd=1.0)) as ctx:
        with pytest.raises(SDKError):
            sdk.chat(model=MODEL, messages=MESSAGES, max_tokens=10)
        snap = ctx.snapshot()
    assert (snap.steps, snap.cost_usd, snap.tokens) == (0, 0.0, 0)


def test_an_http_error_reply_costs_nothing_but_its_step(server: FakeLLMServer) -> None:
    sdk = _sdk(server, retries=0)
    with ExecutionContext(ExecutionConfig(max_steps=5, max_cost_usd=1.0)) as ctx:
        server.fail_next(1, status=400)
        with pytest.raises(SDKError):
            sdk.chat(model=MODEL, messages=MESSAGES, max_tokens=10)
        snap = ctx.snapshot()
    assert snap.steps == 1
    assert snap.cost_usd == 0.0


def test_a_timeout_after_sending_costs_the_reservation(server: FakeLLMServer) -> None:
    sdk = _sdk(server, retries=0)
    sdk.timeout = 0.2
    server.set_latency(1.0)
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        with pytest.raises(SDKError):
            sdk.chat(model=MODEL, messages=MESSAGES, max_tokens=100)
        snap = ctx.snapshot()
    server.set_latency(0)
    assert server.request_count == 1
    assert snap.steps == 1
    # The worst case reserved: input bound plus 100 output tokens, all charged.
    assert snap.tokens > 100
    assert snap.cost_usd > 0


def test_a_lost_attempt_then_a_reply_costs_the_usage_and_one_reservation(
    server: FakeLLMServer,
) -> None:
    sdk = _sdk(server, retries=0)
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        sdk.chat(model=MODEL, messages=MESSAGES, max_tokens=100)
        one_reply = ctx.snapshot().tokens
    server.set_latency(0.0)
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0)) as ctx:
        sdk.timeout = 0.2
        server.set_latency(1.0)
        with pytest.raises(SDKError):
            sdk.chat(model=MODEL, messages=MESSAGES, max_tokens=100)
        server.set_latency(0.0)
        lost = ctx.snapshot().tokens
    assert lost > one_reply  # the reservation's bound, not the few tokens a reply would use


def test_a_lazy_stream_is_counted_once_committed_from_its_usage_and_cut_on_trip(
    server: FakeLLMServer,
) -> None:
    sdk = _sdk(server)
    with ExecutionContext(ExecutionConfig(max_steps=2, max_cost_usd=1.0)) as ctx:
        items = list(sdk.stream(model=MODEL, messages=MESSAGES, max_tokens=20))
        assert items and ctx.snapshot().steps == 1
        assert server.request_count == 1
        committed = ctx.snapshot()
        assert committed.tokens == items[-1]["usage"]["total_tokens"]
        stream = sdk.stream(model=MODEL, messages=MESSAGES, max_tokens=20)
        next(stream)
        ctx.cancel()  # a trip reaches the stream at its next item
        with pytest.raises(BudgetExceededError):
            next(stream)
    assert server.request_count == 2


def test_threads_share_the_step_limit(server: FakeLLMServer) -> None:
    sdk = _sdk(server)
    denied: list[BaseException] = []

    def work() -> None:
        for _ in range(3):
            try:
                sdk.chat(model=MODEL, messages=MESSAGES, max_tokens=5)
            except BudgetExceededError as exc:
                denied.append(exc)

    with ExecutionContext(ExecutionConfig(max_steps=5)):
        threads = [
            threading.Thread(target=contextvars.copy_context().run, args=(work,)) for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert server.request_count == 5
    assert len(denied) == 7


def test_async_calls_and_streams(server: FakeLLMServer) -> None:
    sdk = _sdk(server, retries=3)

    async def main() -> tuple[int, int]:
        with ExecutionContext(ExecutionConfig(max_steps=4, max_retries_total=1)) as ctx:
            server.fail_next(1, status=500)
            await sdk.achat(model=MODEL, messages=MESSAGES, max_tokens=5)
            await asyncio.gather(*(sdk.achat(model=MODEL, messages=MESSAGES) for _ in range(2)))
            items = [item async for item in sdk.astream(model=MODEL, messages=MESSAGES)]
            assert items
            with pytest.raises(BudgetExceededError):
                await sdk.achat(model=MODEL, messages=MESSAGES)
            snap = ctx.snapshot()
            return snap.steps, snap.retries

    steps, retries = asyncio.run(main())
    assert (steps, retries) == (4, 1)
    assert server.request_count == 5  # 4 calls, one of them retried once


def test_an_uncapped_call_is_clamped_to_what_the_budget_buys(server: FakeLLMServer) -> None:
    sdk = _sdk(server)
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.0001)):
        sdk.chat(model=MODEL, messages=MESSAGES)
    sent = server.requests[-1].body
    assert isinstance(sent, dict)
    assert isinstance(sent["max_tokens"], int)
    assert 0 < sent["max_tokens"] < 1000


class _LibraryAdapter(ProviderAdapter):
    """A wrapper library's adapter (litellm's shape) over the contained SDK."""

    provider = "openai"

    def read_request(
        self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], method: str
    ) -> Request:
        return Request("chat", MODEL, MESSAGES, 1, 5)

    def read_reply(self, call: ContainedCall, reply: Any) -> None:
        usage = reply["usage"]
        call.set_usage(usage["prompt_tokens"], usage["completion_tokens"])


def test_a_call_under_an_admitted_one_is_counted_once(server: FakeLLMServer) -> None:
    sdk = _sdk(server)
    marks: list[object] = []

    def library_call() -> Any:
        marks.append(ADMITTED.get())
        return sdk.chat(model=MODEL, messages=MESSAGES, max_tokens=5)

    contained_library_call = wrapper(_LibraryAdapter(), "library_call")
    with ExecutionContext(ExecutionConfig(max_steps=2, max_cost_usd=1.0)) as ctx:
        for _ in range(2):
            contained_library_call(library_call, None, (), {})
        with pytest.raises(BudgetExceededError):
            contained_library_call(library_call, None, (), {})
        snap = ctx.snapshot()
    assert server.request_count == 2
    assert snap.steps == 2
    assert len(marks) == 2
    assert all(isinstance(mark, ContainedCall) for mark in marks)


def test_a_wrapper_under_the_attempt_hook_is_still_spliced_out() -> None:
    # The sync attempt hooks are plain functions over the transport's method, not
    # wrapt proxies: a wrapper installed before them (another instrumentation's)
    # is still found through them and removed, and the hook then calls what it
    # wrapped.
    class Transport:
        def handle_request(self, request: object) -> tuple[str, object]:
            return "sent", request

    original = Transport.__dict__["handle_request"]

    def theirs(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> tuple[str, object]:
        return "theirs", wrapped(*args, **kwargs)

    wrapt.wrap_function_wrapper(Transport, "handle_request", theirs)
    transport = type(TRANSPORTS["httpx"])()  # its own guard: off
    hooked = _sync_hook(transport, inspect.getattr_static(Transport, "handle_request"))
    Transport.handle_request = hooked  # type: ignore[method-assign]
    assert is_ours(Transport, "handle_request", transport)
    assert Transport().handle_request(1) == ("theirs", ("sent", 1))
    unwrap_ours(Transport, "handle_request", theirs)
    assert Transport.__dict__["handle_request"] is hooked
    assert hooked.__wrapped__ is original  # type: ignore[attr-defined]
    assert Transport().handle_request(2) == ("sent", 2)
    assert is_ours(Transport, "handle_request", transport)
    assert not is_ours(Transport, "handle_request", theirs)


def test_a_wrapper_under_the_async_attempt_hook_is_still_spliced_out() -> None:
    # The async attempt hooks are plain coroutine functions too: the same splice.
    class Transport:
        async def handle_async_request(self, request: object) -> tuple[str, object]:
            return "sent", request

    original = Transport.__dict__["handle_async_request"]

    async def theirs(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> tuple[str, object]:
        return "theirs", await wrapped(*args, **kwargs)

    wrapt.wrap_function_wrapper(Transport, "handle_async_request", theirs)
    transport = type(TRANSPORTS["httpx"])()  # its own guard: off
    hooked = _async_hook(transport, inspect.getattr_static(Transport, "handle_async_request"))
    Transport.handle_async_request = hooked  # type: ignore[method-assign]
    assert inspect.iscoroutinefunction(Transport.handle_async_request)
    assert is_ours(Transport, "handle_async_request", transport)
    assert asyncio.run(Transport().handle_async_request(1)) == ("theirs", ("sent", 1))
    unwrap_ours(Transport, "handle_async_request", theirs)
    assert Transport.__dict__["handle_async_request"] is hooked
    assert hooked.__wrapped__ is original  # type: ignore[attr-defined]
    assert asyncio.run(Transport().handle_async_request(2)) == ("sent", 2)
    assert not is_ours(Transport, "handle_async_request", theirs)
    unwrap_ours(Transport, "handle_async_request", transport)  # ours out: the method again
    assert Transport.__dict__["handle_async_request"] is original


def test_every_transport_hook_is_a_plain_function_marked_ours() -> None:
    # No wrapt proxy on the attempt path, sync or async (httpx2's transports here).
    ensure_attempt_hooks()
    for owner, method in (
        (httpx2.HTTPTransport, "handle_request"),
        (httpx2.AsyncHTTPTransport, "handle_async_request"),
    ):
        hook = owner.__dict__[method]
        assert not isinstance(hook, wrapt.FunctionWrapper)
        assert is_ours(owner, method, TRANSPORTS["httpx"])
    assert inspect.iscoroutinefunction(httpx2.AsyncHTTPTransport.handle_async_request)
