"""The active chain (and the whole OpenTelemetry context) follows into threads.

Usage::

    from veronica_otel.instrumentors.threading import ThreadingInstrumentor

    ThreadingInstrumentor().instrument()
    with ExecutionContext(ExecutionConfig(max_steps=10)):
        pool.submit(agent_step)                    # runs in the chain
        threading.Thread(target=agent_step).start()  # so does this

Without it, a thread starts with an empty context: calls made there would
fall back to the process default chain (or none) and escape the chain's
limits. ``opentelemetry-instrumentation-threading`` does the same job, but
its releases pin the exact ``opentelemetry-instrumentation`` version of
their own release train (0.66b1 pins ``==0.66b1``), which conflicts with the
one installed alongside ``opentelemetry-instrumentation-httpx``; so this
small equivalent ships here.

Where it hooks:

- ``threading.Thread.start``: captures the caller's context and runs the
  thread's ``run`` inside it -- subclasses that override ``run`` included
  (``threading.Timer`` too).
- ``concurrent.futures.ThreadPoolExecutor.submit``: each task runs in the
  context of the code that submitted it (``map`` goes through ``submit``).
- ``multiprocessing.pool.ThreadPool`` (``multiprocessing.dummy.Pool``):
  ``apply_async``, ``_map_async`` (behind ``apply``, ``map``, ``map_async``,
  ``starmap``, ``starmap_async``), ``imap`` and ``imap_unordered`` run each
  task, and its callbacks, in the context of the code that submitted it.
  Process pools are left alone (their tasks are pickled to other processes).

A pool's worker and handler threads, and veronica-otel's own timer thread,
keep no context of their own: they outlive the chain that happened to start
them (a ``ThreadPool`` made inside chain A serves chain B's tasks in B).

On by default: instrumenting any of our LLM or tool instrumentors (openai,
anthropic, mcp, langchain, ag2) also turns this on, so an app that fans out
to threads cannot escape its chain without a word. Opt out with
``VERONICA_THREADS=false`` (a value other than true/false/1/0/yes/no/on/off
makes ``instrument()`` fail with an error naming the variable) or
``instrument(propagate_threads=False)``; calls in threads then start with an
empty context and use the process default chain, if any.

Each holder counts (:func:`hold_threads` / :func:`release_threads`): the
patches stay while any of them -- an LLM instrumentor or this instrumentor,
instrumented directly -- is instrumented, so uninstrumenting one never takes
propagation away from another that is still on. ``ThreadingInstrumentor()``'s
own ``is_instrumented_by_opentelemetry`` says only whether it was
instrumented directly.

``multiprocessing`` (and ``os.fork``) children are separate chains: a
process has its own memory, so a chain's in-process ledger is not shared
with its children, whatever their context says. To give several processes
one budget, put the chain on the shared ledger (``VERONICA_REDIS_URL`` and
``VERONICA_CHAIN_ID``, or ``ExecutionContext(..., ledger=RedisLedger(...),
chain_id=...)`` in each process).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from concurrent import futures
from concurrent.futures import thread as _pool_thread  # a submodule: not loaded by the package
from multiprocessing import pool as _mp_pool
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)
from wrapt import wrap_function_wrapper

from ._unwrap import is_ours, unwrap_ours

__all__ = ["ThreadingInstrumentor", "hold_threads", "release_threads"]

_POOL_WORKER = getattr(_pool_thread, "_worker", None)


def _in_context(ctx: otel_context.Context, fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        token = otel_context.attach(ctx)
        try:
            return fn(*args, **kwargs)
        finally:
            otel_context.detach(token)

    return run


def _skip(thread: Any) -> bool:
    # Pool workers and handlers outlive any one task (each task brings its own
    # context), and our own timer thread serves every chain: none keeps a context.
    target = getattr(thread, "_target", None)
    return (
        target is _POOL_WORKER
        or getattr(target, "__module__", None) == _mp_pool.__name__
        or str(getattr(thread, "name", "")).startswith("veronica-otel-")
    )


def _start(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if _skip(instance):
        return wrapped(*args, **kwargs)
    run = instance.run
    ctx = otel_context.get_current()

    def run_in_context() -> None:
        token = otel_context.attach(ctx)
        try:
            run()
        finally:
            otel_context.detach(token)
            instance.__dict__.pop("run", None)  # no cycle once the thread is done

    try:
        instance.run = run_in_context
    except AttributeError:  # a Thread subclass without a __dict__: leave it be
        return wrapped(*args, **kwargs)
    try:
        return wrapped(*args, **kwargs)
    except BaseException:
        instance.__dict__.pop("run", None)
        raise


def _submit(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not args:
        return wrapped(*args, **kwargs)
    fn, *rest = args
    return wrapped(_in_context(otel_context.get_current(), fn), *rest, **kwargs)


def _pooled(callback_at: int | None) -> Callable[..., Any]:
    """A wrapper for a ``multiprocessing.pool.Pool`` method whose first argument is the
    task: in a ``ThreadPool`` the task, and the ``callback`` / ``error_callback``
    (positional from ``callback_at``, or by name), run in the submitter's context."""
    callbacks = (
        ()
        if callback_at is None
        else ((callback_at, "callback"), (callback_at + 1, "error_callback"))
    )

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not args or not isinstance(instance, _mp_pool.ThreadPool):
            return wrapped(*args, **kwargs)
        ctx = otel_context.get_current()
        carried = [_in_context(ctx, args[0]), *args[1:]]
        for position, name in callbacks:
            if position < len(carried):
                if carried[position] is not None:
                    carried[position] = _in_context(ctx, carried[position])
            elif kwargs.get(name) is not None:
                kwargs[name] = _in_context(ctx, kwargs[name])
        return wrapped(*carried, **kwargs)

    return wrapper


_PATCHES: tuple[tuple[type, str, Callable[..., Any]], ...] = (
    (threading.Thread, "start", _start),
    (futures.ThreadPoolExecutor, "submit", _submit),
    # Every ThreadPool entry point ends in one of these four (apply -> apply_async;
    # map, map_async, starmap, starmap_async -> _map_async).
    (_mp_pool.Pool, "apply_async", _pooled(3)),
    (_mp_pool.Pool, "_map_async", _pooled(4)),
    (_mp_pool.Pool, "imap", _pooled(None)),
    (_mp_pool.Pool, "imap_unordered", _pooled(None)),
)


_holders: set[str] = set()
_holders_lock = threading.Lock()


def hold_threads(holder: str) -> None:
    """Carry the context into threads for as long as ``holder`` wants it (idempotent)."""
    with _holders_lock:
        _holders.add(holder)
        for owner, method, wrapper in _PATCHES:
            if not is_ours(owner, method, wrapper):  # never twice
                wrap_function_wrapper(owner, method, wrapper)


def release_threads(holder: str) -> None:
    """``holder`` no longer needs propagation; the last one out removes the patches."""
    with _holders_lock:
        _holders.discard(holder)
        if _holders:
            return
        for owner, method, wrapper in _PATCHES:
            unwrap_ours(owner, method, wrapper)


class ThreadingInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Carries the OpenTelemetry context (and so the chain) into threads."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        hold_threads(type(self).__name__)

    def _uninstrument(self, **kwargs: Any) -> None:
        release_threads(type(self).__name__)
