"""Containment for ``litellm`` (1.110).

Usage::

    from veronica_otel.instrumentors.litellm import LiteLLMInstrumentor

    LiteLLMInstrumentor().instrument()
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=10)):
        litellm.completion(model="anthropic/claude-3-5-haiku-latest", messages=[...])
        # raises BudgetExceededError (itself, not a litellm error) when over

Configuration: limits come from the active :class:`ExecutionContext`, else the
process default chain (zero-code: ``VERONICA_*`` variables). With neither,
calls pass through untouched.

Why a litellm adapter: litellm calls Anthropic, Gemini / Vertex, Bedrock and
most others through its own HTTP handlers (``httpx``; ``aiohttp`` under its
async ``httpx`` client), not their SDKs, and wraps every exception in its own
types, so neither the SDK adapters nor a plain ``except BudgetExceededError``
would see those calls.

Where it hooks (above litellm's ``@client`` decorator and its exception
mapping, so a denial reaches the caller as :class:`BudgetExceededError` and
nothing is sent):

- the public functions, where callers look them up: ``litellm.completion`` /
  ``acompletion`` (re-exported from ``litellm.chat_completions.dispatch``,
  which calls the ``@client`` functions of ``litellm.main``), ``embedding`` /
  ``aembedding``, ``responses`` / ``aresponses``, ``text_completion`` /
  ``atext_completion``, ``image_generation`` / ``aimage_generation``, in
  ``litellm`` and in the module that defines each (``litellm.main``,
  ``litellm.*.dispatch``, ``litellm.images.main``). One call is admitted once,
  whichever of them the others call (``acompletion`` runs ``completion`` in a
  thread; ``num_retries`` re-enters ``completion``): the inner ones find it
  marked admitted (:data:`~._adapter.ADMITTED`) and pass through, and so do
  the ``openai`` / ``anthropic`` SDK adapters under it (G13). The provider is
  the one litellm resolves (``get_llm_provider``, as ``gen_ai.provider.name``:
  ``openai``, ``anthropic``, ``gcp.gemini``, ``aws.bedrock``, ...), the model
  priced without its ``provider/`` prefix. ``max_tokens`` /
  ``max_completion_tokens`` / ``max_output_tokens`` are clamped when unset.
- billable functions not priced per token (``image_generation``,
  ``image_edit``, ``transcription``, ``speech``, ``rerank``, ``ocr`` (sent
  from litellm's native code), ``video_generation``, ``anthropic_messages``,
  ``agenerate_content``): refused under a cost ceiling (reason ``cost``,
  naming the endpoint), each a step without one.
- ``Router`` (``litellm.router_rust.core.RustCore``, which the ``Router``
  facade serves every call from): ``completion``, ``acompletion``,
  ``text_completion``, ``atext_completion``, ``embedding``, ``aembedding``,
  ``image_generation``, ``aimage_generation``, ``aresponses``. The router
  picks a deployment and calls the public function above for each attempt,
  so each attempt is admitted on its own: a step, reserved at the price of the
  deployment it goes to. Every attempt after the first of one router call (its
  ``num_retries`` retries and its fallbacks) is also drawn from
  ``max_retries_total`` before it is sent, so a router never retries past the
  chain's retry budget; the router's final error is re-raised as our denial
  when one caused it.

Each HTTP attempt under an admitted call is reported by the transport hooks
(:mod:`._attempts`: ``httpx`` for litellm's handlers and the ``openai`` SDK it
uses for OpenAI models, ``aiohttp`` for its async handler): litellm's own
``num_retries`` and the SDK's ``max_retries`` are drawn from
``max_retries_total`` before each resend; an HTTP error reply costs nothing
(the step counts); an attempt lost unanswered costs the reservation (G10).

Usage is read from litellm's OpenAI-shaped replies for every provider
(``ModelResponse.usage``; streams: the chunk that carries ``usage``, which
litellm sends with ``stream_options={"include_usage": True}``; a stream that
ends without one is settled at its reservation).
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Callable, Collection
from typing import Any

from veronica_otel._propagation import default_context

from ._adapter import ADMITTED, denial_in, wrapper
from ._hooks import GuardedInstrumentor, Hook, SDKHooks
from ._litellm_adapter import OPERATIONS, LiteLLMAdapter

__all__ = ["LiteLLMInstrumentor"]

_instruments = ("litellm >= 1.110, < 1.111",)


class _RouterCall:
    """One ``Router`` call in progress: how many attempts it has made."""

    __slots__ = ("attempts",)

    def __init__(self) -> None:
        self.attempts = 0


_ROUTED: contextvars.ContextVar[_RouterCall | None] = contextvars.ContextVar(
    "veronica_litellm_router_call", default=None
)


def _draw(routed: _RouterCall | None) -> None:
    """A router's attempt after its first is a retry: drawn before it is admitted."""
    if routed is None or ADMITTED.get() is not None:
        return
    if routed.attempts:
        ctx = default_context()
        if ctx is not None:
            ctx.consume_retry()
    routed.attempts += 1


async def _adraw(routed: _RouterCall | None) -> None:
    if routed is None or ADMITTED.get() is not None:
        return
    if routed.attempts:
        ctx = default_context()
        if ctx is not None:
            await ctx.aconsume_retry()
    routed.attempts += 1


async def _awaited(wrapped: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    result = wrapped(*args, **kwargs)
    return await result if inspect.isawaitable(result) else result


def _contained(name: str, is_async: bool) -> Callable[..., Any]:
    """The wrapper of the public function ``name`` (one adapter per function).

    The hooked function goes to the adapter as ``instance`` (module functions
    have none) so positional arguments read through its signature.
    """
    adapter = LiteLLMAdapter(OPERATIONS[name])
    acontained = wrapper(adapter, name, True)
    if is_async:

        async def acontain(
            wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> Any:
            await _adraw(_ROUTED.get())
            return await acontained(wrapped, wrapped, args, kwargs)

        return acontain

    contained = wrapper(adapter, name, False)
    flag = adapter.operation.async_flag

    def contain(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if flag and kwargs.get(flag) is True:
            # The sync function returns something to await: contain it as the
            # async call it is (a coroutine of ours, admitted when awaited).
            async def call(*a: Any, **k: Any) -> Any:
                await _adraw(_ROUTED.get())
                return await _awaited(wrapped, *a, **k)

            return acontained(call, wrapped, args, kwargs)
        _draw(_ROUTED.get())
        return contained(wrapped, wrapped, args, kwargs)

    return contain


def _route(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    token = _ROUTED.set(_RouterCall()) if _ROUTED.get() is None else None
    try:
        return wrapped(*args, **kwargs)
    except Exception as exc:
        denial = denial_in(exc)
        if denial is None or denial is exc:
            raise
        raise denial from exc  # the router's error for an attempt we refused
    finally:
        if token is not None:
            _ROUTED.reset(token)


async def _aroute(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    token = _ROUTED.set(_RouterCall()) if _ROUTED.get() is None else None
    try:
        return await wrapped(*args, **kwargs)
    except Exception as exc:
        denial = denial_in(exc)
        if denial is None or denial is exc:
            raise
        raise denial from exc
    finally:
        if token is not None:
            _ROUTED.reset(token)


# Where each public function is looked up (litellm re-exports the function
# its dispatch module defines; litellm.main's own are what the others call).
_HOMES: dict[str, tuple[str, ...]] = {
    "completion": ("", "chat_completions.dispatch", "main"),
    "acompletion": ("", "chat_completions.dispatch", "main"),
    "text_completion": ("", "main"),
    "atext_completion": ("", "main"),
    "embedding": ("", "embeddings.dispatch", "main"),
    "aembedding": ("", "embeddings.dispatch", "main"),
    "responses": ("", "responses.dispatch", "responses.main"),
    "aresponses": ("", "responses.dispatch", "responses.main"),
    "image_generation": ("", "images.main"),
    "aimage_generation": ("", "images.main"),
    "image_edit": ("", "images.main"),
    "aimage_edit": ("", "images.main"),
    "transcription": ("", "main"),
    "atranscription": ("", "main"),
    "speech": ("", "main"),
    "aspeech": ("", "main"),
    "rerank": ("", "rerank_api.main"),
    "arerank": ("", "rerank_api.main"),
    "ocr": ("", "ocr.dispatch"),
    "aocr": ("", "ocr.dispatch"),
    "video_generation": ("", "videos.main"),
    "avideo_generation": ("", "videos.main"),
    "anthropic_messages": ("",),
    "agenerate_content": ("", "google_genai.main"),
}
_ASYNC = frozenset(name for name in _HOMES if name.startswith("a") and name[1:] in _HOMES) | {
    "anthropic_messages",
    "agenerate_content",
}
_LEADING = {"completion": ("model", "messages"), "acompletion": ("model", "messages")}
_WRAPPERS = {name: _contained(name, name in _ASYNC) for name in _HOMES}
_ROUTER = "router_rust.core.RustCore"
_ROUTER_METHODS = (
    ("completion", False),
    ("acompletion", True),
    ("text_completion", False),
    ("atext_completion", True),
    ("embedding", False),
    ("aembedding", True),
    ("image_generation", False),
    ("aimage_generation", True),
    ("aresponses", True),
)
_PATCHES = tuple(
    Hook(home, name, _WRAPPERS[name], _LEADING.get(name, ()), (), name in _ASYNC)
    for name, homes in _HOMES.items()
    for home in homes
) + tuple(
    Hook(_ROUTER, method, _aroute if is_async else _route, (), (), is_async)
    for method, is_async in _ROUTER_METHODS
)
# Where calls are refused when the hooks do not fit: every public function.
_GUARDS = tuple(("", (name,)) for name in _HOMES)
_HOOKS = SDKHooks(_instruments[0], "litellm", _PATCHES, _GUARDS)


class LiteLLMInstrumentor(GuardedInstrumentor):
    """Contains every billable call made through ``litellm`` (and its ``Router``).

    ``instrument()`` raises :class:`~veronica_otel.instrumentors.InstrumentationError`
    when the installed ``litellm`` is outside the tested range or a hook changed;
    nothing is patched and calls in a chain are refused (fail closed).
    """

    _hooks = _HOOKS
    reports_attempts = True

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments
