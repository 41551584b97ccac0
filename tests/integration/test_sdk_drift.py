"""SDK drift: a hook renamed, removed or re-signed, or a version outside the tested range.

The failure is injected into the real SDK class (the hook deleted or replaced
by a function of another shape) before instrumenting. Nothing is wrapped,
``instrument()`` raises naming the version and the hook, and every call made
through that SDK in a chain is refused before it is sent: the fake server's
own request count is the truth. Double instrumentation and other
instrumentations' wrappers are checked on the real classes too.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import wrapt

from tests._zero_code import UNCHANGED_AGENT, environment, start_runs
from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel.instrumentors import InstrumentationError
from veronica_otel.instrumentors import _hooks as hooks_module
from veronica_otel.instrumentors._hooks import GuardedInstrumentor, SDKHooks
from veronica_otel.instrumentors._unwrap import is_ours, unwrap_ours
from veronica_otel.instrumentors.anthropic import AnthropicInstrumentor
from veronica_otel.instrumentors.groq import GroqInstrumentor
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.testing import FakeLLMServer

DRIFT_SHIM = Path(__file__).parent / "apps" / "drift_shim.py"
LIMITED = ExecutionConfig(max_steps=5)


@dataclass(frozen=True)
class Sdk:
    """One SDK under test: its instrumentor, base-client module and one call.

    The SDK is imported when a test uses it, not when the module is collected
    (each pytest-xdist worker collects every module).
    """

    name: str
    instrumentor: type[GuardedInstrumentor]
    sync_hook: str  # a private per-attempt hook to remove
    path: str  # the server path of the call

    @property
    def base(self) -> Any:
        return importlib.import_module(f"{self.name}._base_client")

    @property
    def hooks(self) -> SDKHooks:
        return self.instrumentor._hooks

    def client(self, server: FakeLLMServer) -> Any:
        if self.name == "openai":
            import openai

            return openai.OpenAI(base_url=server.openai_base_url, api_key="t", max_retries=0)
        if self.name == "groq":
            import groq

            return groq.Groq(base_url=server.base_url, api_key="t", max_retries=0)
        import anthropic

        return anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="t", max_retries=0)

    def aclient(self, server: FakeLLMServer) -> Any:
        if self.name == "openai":
            import openai

            return openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="t", max_retries=0)
        if self.name == "groq":
            import groq

            return groq.AsyncGroq(base_url=server.base_url, api_key="t", max_retries=0)
        import anthropic

        return anthropic.AsyncAnthropic(
            base_url=server.anthropic_base_url, api_key="t", max_retries=0
        )

    def call(self, client: Any) -> Any:
        messages = [{"role": "user", "content": "hello"}]
        if self.name == "openai":
            return client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        if self.name == "groq":
            return client.chat.completions.create(model="llama-3.1-8b-instant", messages=messages)
        return client.messages.create(
            model="claude-3-5-haiku-latest", max_tokens=50, messages=messages
        )


OPENAI = Sdk("openai", OpenAIInstrumentor, "_sleep_for_retry", "/v1/chat/completions")
ANTHROPIC = Sdk("anthropic", AnthropicInstrumentor, "_attempt_request", "/v1/messages")
GROQ = Sdk("groq", GroqInstrumentor, "_sleep_for_retry", "/openai/v1/chat/completions")


@pytest.fixture(params=[OPENAI, ANTHROPIC, GROQ], ids=lambda sdk: sdk.name)
def sdk(request: pytest.FixtureRequest) -> Iterator[Sdk]:
    sdk: Sdk = request.param
    instrumentor = sdk.instrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()
    yield sdk
    # Whatever the test left (a refusal, wrappers, a reset flag, the threads an
    # instrumentor holds): none of ours stays. Not instrumented as far as its
    # flag says, uninstrument() still lifts a refusal and lets the threads go.
    sdk.hooks.remove()
    instrumentor._is_instrumented_by_opentelemetry = False
    instrumentor.uninstrument()


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(output_tokens=5) as fake:
        yield fake


def _ours_anywhere(sdk: Sdk) -> list[str]:
    return [
        hook.name
        for hook in sdk.hooks.hooks
        if is_ours(getattr(sdk.base, hook.owner), hook.method, hook.wrapper)
    ]


def _remove_hook(sdk: Sdk, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(sdk.base.SyncAPIClient, sdk.sync_hook)


def _resign_hook(sdk: Sdk, monkeypatch: pytest.MonkeyPatch) -> None:
    """A release that still works but no longer takes ``retries_taken`` by keyword."""
    original = sdk.base.SyncAPIClient.__dict__[sdk.sync_hook]

    def drifted(self: Any, *args: Any, **kwargs: Any) -> Any:
        return original(self, *args, **kwargs)

    monkeypatch.setattr(sdk.base.SyncAPIClient, sdk.sync_hook, drifted)


# -- a hook removed or re-signed: nothing wrapped, a loud error -------------------------


def test_a_removed_hook_wraps_nothing_and_raises_naming_the_version_and_hook(
    sdk: Sdk, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _remove_hook(sdk, monkeypatch)
    with caplog.at_level(logging.ERROR), pytest.raises(InstrumentationError) as raised:
        sdk.instrumentor().instrument()
    message = str(raised.value)
    assert f"{sdk.name} {version(sdk.name)}" in message
    assert f"{sdk.name}._base_client.SyncAPIClient.{sdk.sync_hook} is missing" in message
    assert _ours_anywhere(sdk) == []  # all or nothing: not even the hooks that fit
    assert not sdk.instrumentor().is_instrumented_by_opentelemetry
    assert any(message in record.getMessage() for record in caplog.records)


def test_a_hook_with_another_signature_is_refused(
    sdk: Sdk, monkeypatch: pytest.MonkeyPatch
) -> None:
    def moved(self: Any, options: Any, retries: int = 0) -> Any:  # retries_taken renamed
        raise AssertionError("never called")

    monkeypatch.setattr(sdk.base.SyncAPIClient, sdk.sync_hook, moved)
    with pytest.raises(InstrumentationError, match="has no keyword-only 'retries_taken'"):
        sdk.instrumentor().instrument()
    assert _ours_anywhere(sdk) == []


def test_an_async_hook_that_became_sync_is_refused(
    sdk: Sdk, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = sdk.base.AsyncAPIClient.__dict__[sdk.sync_hook]

    def now_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        return original(self, *args, **kwargs)

    monkeypatch.setattr(sdk.base.AsyncAPIClient, sdk.sync_hook, now_sync)
    with pytest.raises(InstrumentationError, match=f"AsyncAPIClient.{sdk.sync_hook} is no longer"):
        sdk.instrumentor().instrument()


def test_a_version_outside_the_tested_range_is_refused_not_skipped(
    sdk: Sdk, monkeypatch: pytest.MonkeyPatch
) -> None:
    next_major = f"{int(version(sdk.name).split('.')[0]) + 1}.0.0"
    real_version = hooks_module.version
    monkeypatch.setattr(
        hooks_module, "version", lambda name: next_major if name == sdk.name else real_version(name)
    )
    # The dependency check (no skip_dep_check) must not skip it quietly either.
    from opentelemetry.instrumentation import dependencies

    monkeypatch.setattr(
        dependencies, "version", lambda name: next_major if name == sdk.name else real_version(name)
    )
    with pytest.raises(InstrumentationError, match=f"{sdk.name} {next_major}: the version"):
        sdk.instrumentor().instrument()
    assert _ours_anywhere(sdk) == []


# -- fail closed: a call in a chain is refused before it is sent -------------------------


def test_a_call_in_a_chain_is_refused_and_never_sent(
    sdk: Sdk, monkeypatch: pytest.MonkeyPatch, server: FakeLLMServer
) -> None:
    _remove_hook(sdk, monkeypatch)
    with pytest.raises(InstrumentationError):
        sdk.instrumentor().instrument()
    with (
        sdk.client(server) as client,
        ExecutionContext(LIMITED),
        pytest.raises(InstrumentationError, match=f"SyncAPIClient.{sdk.sync_hook}"),
    ):
        sdk.call(client)
    assert server.request_count == 0


def test_an_async_call_in_a_chain_is_refused_and_never_sent(
    sdk: Sdk, monkeypatch: pytest.MonkeyPatch, server: FakeLLMServer
) -> None:
    _remove_hook(sdk, monkeypatch)
    with pytest.raises(InstrumentationError):
        sdk.instrumentor().instrument()

    async def main() -> None:
        async with sdk.aclient(server) as client:
            with ExecutionContext(LIMITED), pytest.raises(InstrumentationError, match="is missing"):
                await sdk.call(client)

    asyncio.run(main())
    assert server.request_count == 0


def test_a_call_outside_any_chain_passes(
    sdk: Sdk, monkeypatch: pytest.MonkeyPatch, server: FakeLLMServer
) -> None:
    _resign_hook(sdk, monkeypatch)
    with pytest.raises(InstrumentationError):
        sdk.instrumentor().instrument()
    with sdk.client(server) as client:
        sdk.call(client)  # nothing to contain: no chain
    assert server.count(sdk.path) == 1


def test_fail_open_lets_the_call_through_with_a_warning(
    sdk: Sdk,
    monkeypatch: pytest.MonkeyPatch,
    server: FakeLLMServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _resign_hook(sdk, monkeypatch)
    with pytest.raises(InstrumentationError):
        sdk.instrumentor().instrument()
    monkeypatch.setenv("VERONICA_FAIL_OPEN", "true")
    with (
        caplog.at_level(logging.WARNING),
        sdk.client(server) as client,
        ExecutionContext(ExecutionConfig(max_steps=1)),
    ):
        sdk.call(client)
        sdk.call(client)  # uncontained: the step limit cannot be enforced
    assert server.count(sdk.path) == 2
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"{sdk.name} calls are NOT contained" in warnings[0].getMessage()


def test_a_malformed_fail_open_value_stays_closed(
    sdk: Sdk, monkeypatch: pytest.MonkeyPatch, server: FakeLLMServer
) -> None:
    _remove_hook(sdk, monkeypatch)
    with pytest.raises(InstrumentationError):
        sdk.instrumentor().instrument()
    monkeypatch.setenv("VERONICA_FAIL_OPEN", "sure")
    with (
        sdk.client(server) as client,
        ExecutionContext(LIMITED),
        pytest.raises(ValueError, match="VERONICA_FAIL_OPEN='sure'"),
    ):
        sdk.call(client)
    assert server.request_count == 0


def test_the_refusal_lifts_once_the_hooks_fit_again(
    sdk: Sdk, monkeypatch: pytest.MonkeyPatch, server: FakeLLMServer
) -> None:
    _remove_hook(sdk, monkeypatch)
    with pytest.raises(InstrumentationError):
        sdk.instrumentor().instrument()
    monkeypatch.undo()  # the SDK is whole again
    sdk.instrumentor().instrument()
    with sdk.client(server) as client, ExecutionContext(ExecutionConfig(max_steps=1)):
        sdk.call(client)
        with pytest.raises(BudgetExceededError):  # contained again, not refused
            sdk.call(client)
    assert server.count(sdk.path) == 1


def test_uninstrument_after_a_failure_lifts_the_refusal(
    sdk: Sdk, monkeypatch: pytest.MonkeyPatch, server: FakeLLMServer
) -> None:
    _resign_hook(sdk, monkeypatch)
    with pytest.raises(InstrumentationError):
        sdk.instrumentor().instrument()
    sdk.instrumentor().uninstrument()  # the user gives up on containment explicitly
    with sdk.client(server) as client, ExecutionContext(LIMITED):
        sdk.call(client)
    assert server.count(sdk.path) == 1


# -- one wrapper, only ours removed -------------------------------------------------------


def _depth(owner: type, method: str) -> int:
    # Layers over the SDK's method: wrapt wrappers and our plain hooks (marked).
    depth, current = 0, owner.__dict__[method]
    while isinstance(current, wrapt.FunctionWrapper) or hasattr(current, "veronica_hook"):
        depth, current = depth + 1, current.__wrapped__
    return depth


def test_instrumenting_twice_never_wraps_twice(sdk: Sdk) -> None:
    instrumentor = sdk.instrumentor()
    instrumentor.instrument()
    # As a partial failure would leave it: wrappers in place, the flag False.
    instrumentor._is_instrumented_by_opentelemetry = False
    instrumentor.instrument()
    for hook in sdk.hooks.hooks:
        assert _depth(getattr(sdk.base, hook.owner), hook.method) == 1, hook.name


def _foreign(calls: list[str]) -> Callable[..., Any]:
    def foreign(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        calls.append("foreign")
        return wrapped(*args, **kwargs)

    return foreign


def test_a_foreign_wrapper_over_ours_is_not_doubled_and_survives_uninstrument(
    sdk: Sdk, server: FakeLLMServer
) -> None:
    instrumentor = sdk.instrumentor()
    instrumentor.instrument()
    calls: list[str] = []
    foreign = _foreign(calls)
    # Another GenAI instrumentor wrapping the per-call hook we wrap.
    owner, method = sdk.base.SyncAPIClient, ("_request" if sdk.name == "anthropic" else "request")
    wrapt.wrap_function_wrapper(owner, method, foreign)
    try:
        instrumentor._is_instrumented_by_opentelemetry = False
        instrumentor.instrument()  # ours is under theirs: found, not wrapped again
        assert _depth(owner, method) == 2
        instrumentor.uninstrument()
        assert _ours_anywhere(sdk) == []
        assert owner.__dict__[method]._self_wrapper is foreign
        with sdk.client(server) as client, ExecutionContext(ExecutionConfig(max_steps=1)):
            sdk.call(client)
            sdk.call(client)  # ours is gone: no step limit
        assert calls == ["foreign", "foreign"]
        assert server.count(sdk.path) == 2
    finally:
        unwrap_ours(owner, method, foreign)
    assert not isinstance(owner.__dict__[method], wrapt.FunctionWrapper)


# -- a base client that changed shape: the release names the hooks it takes ------------------


def _anthropic_release(monkeypatch: pytest.MonkeyPatch, release: str) -> None:
    real_version = hooks_module.version
    monkeypatch.setattr(
        hooks_module, "version", lambda name: release if name == "anthropic" else real_version(name)
    )


@pytest.fixture
def anthropic_hooks() -> Iterator[SDKHooks]:
    hooks = AnthropicInstrumentor._hooks
    yield hooks
    AnthropicInstrumentor().uninstrument()  # whatever shape was wrapped: ours goes from all
    hooks._chosen = None


@pytest.mark.parametrize(
    ("release", "taken"),
    [
        (None, ("_request", "_attempt_request")),  # its own spans (the installed 2.x)
        ("0.125.0", ("request", "_attempt_request")),  # per-attempt, no spans
        # The retry-loop shape (0.70 to mid 0.x) needs a real release of it: the
        # 2.x client cannot run without _attempt_request (tests/e2e/test_stainless_majors).
    ],
)
def test_each_anthropic_release_gets_the_hooks_of_its_shape_and_stays_contained(
    anthropic_hooks: SDKHooks,
    server: FakeLLMServer,
    monkeypatch: pytest.MonkeyPatch,
    release: str | None,
    taken: tuple[str, ...],
) -> None:
    if release is not None:
        _anthropic_release(monkeypatch, release)
    AnthropicInstrumentor().instrument()
    names = {hook.name for hook in anthropic_hooks.hooks}
    assert {f"SyncAPIClient.{method}" for method in taken} <= names
    assert all(
        is_ours(ANTHROPIC.base.SyncAPIClient, m, _wrapper(anthropic_hooks, m)) for m in taken
    )
    with ANTHROPIC.client(server) as client, ExecutionContext(LIMITED) as ctx:
        for _ in range(LIMITED.max_steps or 0):
            ANTHROPIC.call(client)
        with pytest.raises(BudgetExceededError):
            ANTHROPIC.call(client)
    assert server.count(ANTHROPIC.path) == LIMITED.max_steps == ctx.snapshot().steps


def _wrapper(hooks: SDKHooks, method: str) -> Any:
    return next(h.wrapper for h in hooks.hooks if h.name == f"SyncAPIClient.{method}")


def test_an_anthropic_release_below_the_tested_range_is_refused(
    anthropic_hooks: SDKHooks, server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    _anthropic_release(monkeypatch, "0.69.0")
    with pytest.raises(InstrumentationError, match=r"anthropic 0\.69\.0: the version is outside"):
        AnthropicInstrumentor().instrument()
    with (
        ANTHROPIC.client(server) as client,
        ExecutionContext(LIMITED),
        pytest.raises(InstrumentationError),
    ):
        ANTHROPIC.call(client)
    assert server.count(ANTHROPIC.path) == 0
    AnthropicInstrumentor().uninstrument()


# -- zero code: the unchanged app, a hook removed before instrumentation ------------------

REMOVED = "openai._base_client:SyncAPIClient._sleep_for_retry"
# Each run: the unchanged app under zero code, openai's retry hook removed as it loads.
DRIFTED = {
    "refused": {"VERONICA_MAX_STEPS": "3"},
    # VERONICA_FAIL_OPEN lets the SDK's calls through its refused adapter; with
    # the vendor guard off nothing else contains them.
    "fail-open-unguarded": {
        "VERONICA_MAX_STEPS": "3",
        "VERONICA_FAIL_OPEN": "true",
        "VERONICA_VENDOR_GUARD": "off",
    },
    # The adapter cannot be installed and VERONICA_FAIL_OPEN lets its calls
    # pass it, but the HTTP vendor guard under it still contains them.
    "fail-open-guarded": {"VERONICA_MAX_STEPS": "3", "VERONICA_FAIL_OPEN": "true"},
}
Drifted = dict[str, tuple[subprocess.CompletedProcess[str], FakeLLMServer]]


@pytest.fixture(scope="module")
def drifted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Drifted]:
    """Each run of :data:`DRIFTED`, a process of its own started as zero code starts
    (:func:`tests._zero_code.start_runs`); openai is imported by the app, after
    start-up, so the shim removes the hook before any instrumentor sees it."""
    with ExitStack() as stack:
        servers = {name: stack.enter_context(FakeLLMServer(output_tokens=10)) for name in DRIFTED}
        env = {"DRIFT_REMOVE": REMOVED, "DRIFT_APP": str(UNCHANGED_AGENT)}
        done = start_runs(
            Path(sys.executable),
            {
                name: ((DRIFT_SHIM,), {"OPENAI_BASE_URL": servers[name].openai_base_url, **extra})
                for name, extra in DRIFTED.items()
            },
            tmp_path_factory.mktemp("drifted"),
            environment(None, **env),
            leave=("openai",),
        )
        yield {name: (done[name], servers[name]) for name in DRIFTED}


def test_zero_code_refuses_the_apps_calls_naming_the_hook(drifted: Drifted) -> None:
    result, server = drifted["refused"]
    assert result.returncode != 0
    assert "InstrumentationError" in result.stderr
    assert "SyncAPIClient._sleep_for_retry is missing" in result.stderr
    assert result.stdout == ""
    assert server.request_count == 0


def test_zero_code_fail_open_runs_the_app_uncontained(drifted: Drifted) -> None:
    result, server = drifted["fail-open-unguarded"]
    assert result.returncode == 0, result.stderr
    assert "SyncAPIClient._sleep_for_retry is missing" in result.stderr
    assert server.count("/v1/chat/completions") == 5


def test_zero_code_fail_open_still_meets_the_vendor_guard(drifted: Drifted) -> None:
    result, server = drifted["fail-open-guarded"]
    assert result.returncode != 0
    assert "steps limit reached (limit 3" in result.stderr
    assert server.count("/v1/chat/completions") == 3


# -- tool instrumentors: the same probe, the same refusal ---------------------------------


def test_a_re_signed_langchain_tool_hook_refuses_tool_runs_in_a_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from langchain_core.tools import BaseTool, tool

    from veronica_otel.instrumentors.langchain import LangChainInstrumentor

    ran: list[int] = []

    @tool
    def count(n: int) -> int:
        """Count to n."""
        ran.append(n)
        return n

    original = BaseTool.__dict__["run"]

    def drifted(self: Any, *args: Any, **kwargs: Any) -> Any:  # tool_input no longer named
        return original(self, *args, **kwargs)

    monkeypatch.setattr(BaseTool, "run", drifted)
    instrumentor = LangChainInstrumentor()
    try:
        with pytest.raises(
            InstrumentationError, match=r"BaseTool\.run no longer takes 'tool_input'"
        ):
            instrumentor.instrument()
        with ExecutionContext(LIMITED), pytest.raises(InstrumentationError):
            count.invoke({"n": 1})
        assert ran == []
        count.invoke({"n": 2})  # no chain: nothing to contain
        assert ran == [2]
    finally:
        instrumentor.uninstrument()  # lifts the refusal and gives back its hold on threads


# -- zero code: any failure of our instrumentor refuses, never runs uncontained -------------


def test_the_distro_refuses_calls_when_an_instrumentor_fails_otherwise(
    server: FakeLLMServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from veronica_otel.startup.distro import _fail_closed

    instrumentor = OpenAIInstrumentor()
    try:
        _fail_closed(instrumentor, "OpenAIInstrumentor", RuntimeError("boom"))
        assert "could not install OpenAIInstrumentor (RuntimeError('boom'))" in (
            capsys.readouterr().err
        )
        with (
            OPENAI.client(server) as client,
            ExecutionContext(LIMITED),
            pytest.raises(InstrumentationError, match="openai calls made in a chain"),
        ):
            OPENAI.call(client)
        assert server.request_count == 0
    finally:
        instrumentor._hooks.remove()


def test_the_distro_says_when_calls_are_not_contained(capsys: pytest.CaptureFixture[str]) -> None:
    from veronica_otel.startup.distro import _fail_closed

    _fail_closed(None, "OpenAIInstrumentor", ImportError("no module"))
    assert "calls through it are NOT contained" in capsys.readouterr().err
