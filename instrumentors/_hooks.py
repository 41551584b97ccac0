"""Probing the SDK methods an instrumentor patches, before patching any of them.

The LLM instrumentors wrap private SDK methods, which a release may rename,
remove or re-sign. Wrapping what is there and hoping would fail open: a call
that no longer passes through a hook is not counted. So, all or nothing:

1. the installed version is inside the range the instrumentor was tested with
   (its ``_instruments``), and every hook exists, is a function (async where
   our wrapper awaits it) and has the parameters our wrapper reads. An SDK
   whose base client changed shape across releases declares a
   :class:`HookSet` per shape, each with its own range: the first whose
   range holds the installed version and whose hooks all fit is the one;
2. only then is each hook wrapped, once (ours is found anywhere in the chain of
   wrappers, so instrumenting twice never wraps twice);
3. otherwise nothing is wrapped, :class:`InstrumentationError` is raised and
   logged naming the version and the hook, and a *refusal* is installed on the
   SDK's public ``request`` (or ``post``): every call made through that SDK in
   a chain that limits anything raises the same error, unless
   ``VERONICA_FAIL_OPEN=true`` lets it through uncontained, with a warning.
   Under zero code ``opentelemetry-instrument`` only logs an instrumentor's
   exception; the refusal is what keeps the app from running uncontained.

Every such instrumentor also carries the chain into ``threading.Thread`` and
``ThreadPoolExecutor`` work (:mod:`veronica_otel.instrumentors.threading`),
held for as long as it is instrumented, and even when its hooks did not fit
(so the refusal sees the chain in threads too). Opt out with
``instrument(propagate_threads=False)`` or ``VERONICA_THREADS=false``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from types import FunctionType
from typing import Any

import wrapt
from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)
from packaging.requirements import Requirement

from veronica_otel._config import ExecutionConfig, parse_env_bool
from veronica_otel._propagation import current_context, default_context

from ._unwrap import is_ours, unwrap_ours
from .threading import hold_threads, release_threads

__all__ = [
    "GuardedInstrumentor",
    "Hook",
    "HookSet",
    "InstrumentationError",
    "SDKHooks",
    "function_problem",
]

_logger = logging.getLogger(__name__)
_UNLIMITED = ExecutionConfig()


class InstrumentationError(RuntimeError):
    """Containment could not be installed for a library (version or hook changed).

    Raised by ``instrument()`` and, in a chain, by every call made through that
    library afterwards (fail closed; ``VERONICA_FAIL_OPEN=true`` lets them pass).
    """


@dataclass(frozen=True, slots=True)
class Hook:
    """One SDK method we wrap, and the part of its signature our wrapper relies on.

    Attributes:
        owner: The class holding the method, in the SDK module; or a module
            function's module: ``""`` for the SDK module itself, a dotted path
            for a submodule (``"main"``) or a class in one (``"core.Client"``).
        method: The method's (or module function's) name.
        wrapper: Our ``wrapt`` wrapper.
        positional: Parameters after ``self`` that we read by position (in this
            order) or by name.
        keyword: Parameters we read from ``kwargs`` only: they must be keyword-only.
        is_async: Whether the method is a coroutine function (our wrapper awaits it).
    """

    owner: str
    method: str
    wrapper: Callable[..., Any]
    positional: tuple[str, ...] = ()
    keyword: tuple[str, ...] = ()
    is_async: bool = False

    @property
    def name(self) -> str:
        return f"{self.owner}.{self.method}" if self.owner else self.method


def _owner(module: Any, path: str) -> Any:
    """The class or module ``path`` names in ``module`` (see :attr:`Hook.owner`),
    importing a submodule not imported yet; None when there is none."""
    owner = module
    for part in path.split(".") if path else ():
        found = getattr(owner, part, None)
        if inspect.ismodule(owner) and not (isinstance(found, type) or inspect.ismodule(found)):
            try:  # a submodule (a package may export a function of the same name)
                found = importlib.import_module(f"{owner.__name__}.{part}")
            except ImportError:
                return None
        owner = found
    return owner if isinstance(owner, type) or inspect.ismodule(owner) else None


@dataclass(frozen=True, slots=True)
class HookSet:
    """One shape of an SDK's base client: the releases it was tested with, its hooks.

    An SDK whose base client changed shape across releases (``anthropic``: a
    retry loop in ``request``, then a per-attempt ``_attempt_request``, then
    its own spans around ``_request``) declares one set per shape.
    """

    requirement: str
    hooks: tuple[Hook, ...]


def _problem(owner: Any, hook: Hook) -> str | None:
    """What is wrong with ``hook`` on ``owner``, or None when our wrapper fits it."""
    try:
        found = inspect.getattr_static(owner, hook.method)
    except AttributeError:
        return "is missing"
    return function_problem(
        found, hook.positional, hook.keyword, hook.is_async, method=not inspect.ismodule(owner)
    )


def function_problem(
    found: object,
    positional: tuple[str, ...] = (),
    keyword: tuple[str, ...] = (),
    is_async: bool = False,
    *,
    method: bool = True,
) -> str | None:
    """What keeps our wrapper from fitting ``found``, or None (see :class:`Hook`).

    ``method``: the first parameter is ``self`` and is not among ``positional``.
    """
    function = inspect.unwrap(found) if callable(found) else found  # through wrappers
    if not inspect.isfunction(function):
        return f"is not a function ({type(function).__name__})"
    if inspect.iscoroutinefunction(function) != is_async:
        return "is no longer async" if is_async else "became async"
    signature = inspect.signature(function)
    parameters = list(signature.parameters.values())[1 if method else 0 :]
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    for i, name in enumerate(positional):
        param = parameters[i] if i < len(parameters) else None
        if param is None or param.name != name or param.kind not in kinds:
            return f"no longer takes {name!r} as argument {i + 1} (signature {signature})"
    by_name = {p.name: p.kind for p in parameters}
    for name in keyword:
        if by_name.get(name) is not inspect.Parameter.KEYWORD_ONLY:
            return f"has no keyword-only {name!r} (signature {signature})"
    return None


def _wrap(owner: Any, hook: Hook) -> None:
    """Put ``hook.wrapper`` over ``owner``'s method: a plain function (:func:`_plain`)
    over a sync function of a class, a ``wrapt`` wrapper over anything else (a
    module function, an async method, a static or class method, a method some
    other instrumentation wrapped first)."""
    found = inspect.getattr_static(owner, hook.method)
    if (
        isinstance(owner, type)
        and not hook.is_async
        and type(found) is FunctionType
        and not inspect.iscoroutinefunction(found)
    ):
        setattr(owner, hook.method, _plain(hook.wrapper, found))
    else:
        wrapt.wrap_function_wrapper(owner, hook.method, hook.wrapper)


def _plain(wrapper: Callable[..., Any], original: Any) -> Callable[..., Any]:
    """``wrapper`` (``wrapper(wrapped, instance, args, kwargs)``) over the sync
    method ``original`` as a plain function: every call of every hooked SDK
    method passes here, and a ``FunctionWrapper`` builds a bound wrapper on
    each attribute read and dispatches in C with more work than one frame
    (~2.6k instructions a call more, measured with cachegrind). What it
    passes is what ``wrapt`` passes a method called on an instance: the
    bound method and the instance. It keeps ``wrapt``'s shape where it
    matters, as the transport hooks do (``_attempts``): ``__wrapped__`` is
    what it calls, read per call (a wrapper under it can be spliced out,
    :mod:`._unwrap`), and ``veronica_hook`` names ``wrapper`` (``is_ours``).
    A wrapper with a ``veronica_lane`` (a factory of such a function, which
    runs its common call in that one frame and hands the rest to ``wrapper``:
    :func:`._adapter._lane`) is put on as the function it makes."""

    lane = getattr(wrapper, "veronica_lane", None)
    hooked: Callable[..., Any]
    if lane is not None:  # the wrapper's own plain function, a lane for its common call
        hooked = lane()
    else:

        def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
            method = hooked.__wrapped__  # type: ignore[attr-defined]
            return wrapper(method.__get__(self, type(self)), self, args, kwargs)

    # __wrapped__, name, docs, and what a decorator set on the method (which
    # wrapt's proxy would show through it)
    functools.update_wrapper(hooked, original)
    hooked.veronica_hook = wrapper  # type: ignore[attr-defined]
    return hooked


class SDKHooks:
    """The hooks of one SDK module, probed together and wrapped all or nothing.

    Args:
        requirement: The tested range, as in ``_instruments`` (``"openai >= 2.30, < 4"``).
        module: The SDK module holding the hooked classes.
        hooks: What to wrap; or, for an SDK whose base client changed shape,
            :class:`HookSet` s in order of preference: the first whose range
            holds the installed version and whose hooks all fit is wrapped.
        guards: ``(class, (method, ...))`` in ``module`` where a refusal goes:
            the first of the methods that exists, any signature (public ones
            every API call passes through, e.g. ``request`` then ``post``);
            the class is named as :attr:`Hook.owner` (module functions too).
    """

    def __init__(
        self,
        requirement: str,
        module: str,
        hooks: tuple[Hook, ...] | tuple[HookSet, ...],
        guards: tuple[tuple[str, tuple[str, ...]], ...],
    ) -> None:
        self.requirement = Requirement(requirement)
        self.module = module
        sets = tuple(hook for hook in hooks if isinstance(hook, HookSet))
        plain = tuple(hook for hook in hooks if isinstance(hook, Hook))
        self.sets: tuple[HookSet, ...] = sets or (HookSet(requirement, plain),)
        self._chosen: HookSet | None = None
        self.guards = guards
        self._refusals: list[tuple[Any, str, Any]] = []
        self._warned = False

    @property
    def library(self) -> str:
        return self.requirement.name

    def version(self) -> str | None:
        try:
            return version(self.library)
        except PackageNotFoundError:
            return None

    @property
    def hooks(self) -> tuple[Hook, ...]:
        """The hooks wrapped (after :meth:`install`), else those of the installed version."""
        if self._chosen is not None:
            return self._chosen.hooks
        return self._candidates(self.version())[0].hooks

    def _candidates(self, installed: str | None) -> list[HookSet]:
        """The sets whose range holds ``installed``, in order; the first set if none does."""
        found = [
            hook_set
            for hook_set in self.sets
            if installed is not None
            and Requirement(hook_set.requirement).specifier.contains(installed, prereleases=True)
        ]
        return found or [self.sets[0]]

    def _label(self) -> str:
        return f"{self.library} {self.version() or '(version unknown)'}"

    def probe(self) -> Any:
        """The SDK module, once every hook fits; else :class:`InstrumentationError`."""
        installed = self.version()
        label = self._label()
        problems: list[str] = []
        if installed is None or not self.requirement.specifier.contains(
            installed, prereleases=True
        ):
            problems.append(f"the version is outside the tested range {self.requirement}")
        try:
            module = importlib.import_module(self.module)
        except Exception as exc:
            raise self._error(label, [f"{self.module} cannot be imported ({exc})"]) from exc
        first: list[str] | None = None
        for hook_set in self._candidates(installed):
            misfits = self._misfits(module, hook_set)
            if not misfits and not problems:
                self._chosen = hook_set
                return module
            first = misfits if first is None else first
        # The problems of the shape this version should have (the first in range).
        raise self._error(label, problems + (first or []))

    def _misfits(self, module: Any, hook_set: HookSet) -> list[str]:
        problems = []
        for hook in hook_set.hooks:
            owner = _owner(module, hook.owner)
            if owner is None:
                problems.append(f"{self.module}.{hook.owner} is missing")
                continue
            problem = _problem(owner, hook)
            if problem is not None:
                problems.append(f"{self.module}.{hook.name} {problem}")
        return problems

    def _error(self, label: str, problems: list[str]) -> InstrumentationError:
        return InstrumentationError(
            f"veronica-otel cannot contain {label}: {'; '.join(problems)}. Nothing was "
            f"patched: {self.library} calls made in a chain are refused "
            "(VERONICA_FAIL_OPEN=true lets them through uncontained)"
        )

    def install(self) -> None:
        """Wrap every hook (those already ours stay as they are), or none and refuse."""
        try:
            module = self.probe()
            self.lift()  # a refusal left by an earlier failure: the hooks fit now
            self._unwrap(keep=self.hooks)  # another shape's, wrapped before the SDK changed
            wrapped: list[Hook] = []
            try:
                for hook in self.hooks:
                    owner = _owner(module, hook.owner)
                    if not is_ours(owner, hook.method, hook.wrapper):
                        _wrap(owner, hook)
                        wrapped.append(hook)
            except Exception as exc:
                for hook in wrapped:
                    unwrap_ours(_owner(module, hook.owner), hook.method, hook.wrapper)
                raise self._error(self._label(), [f"wrapping failed ({exc!r})"]) from exc
        except InstrumentationError as exc:
            self._unwrap()  # nothing of ours stays half in place
            self.refuse(exc)
            _logger.error("%s", exc)
            raise

    def remove(self) -> None:
        """Remove our wrappers (only ours, wherever they sit) and any refusal."""
        self._unwrap()
        self.lift()

    def _unwrap(self, keep: tuple[Hook, ...] = ()) -> None:
        try:
            module = importlib.import_module(self.module)
        except Exception:
            return  # never imported, so never wrapped
        for hook_set in self.sets:  # every shape's: ours never stays anywhere
            for hook in hook_set.hooks:
                owner = _owner(module, hook.owner)
                if owner is not None and hook not in keep:
                    unwrap_ours(owner, hook.method, hook.wrapper)

    def refuse(self, error: BaseException) -> None:
        """Make every call through the SDK in a chain raise ``error``'s message."""
        self.lift()
        self._warned = False
        try:
            module = importlib.import_module(self.module)
        except Exception:
            _logger.error("veronica-otel: %s cannot be imported to refuse its calls", self.module)
            return
        message = str(error)
        for owner_name, methods in self.guards:
            owner = _owner(module, owner_name)
            method = next((m for m in methods if callable(getattr(owner, m, None))), None)
            if owner is None or method is None:
                _logger.error(
                    "veronica-otel: no %s.%s.%s to refuse calls on",
                    self.module,
                    owner_name,
                    "/".join(methods),
                )
                continue
            is_async = inspect.iscoroutinefunction(inspect.unwrap(getattr(owner, method)))
            guard = self._guard(message, is_async)
            try:
                wrapt.wrap_function_wrapper(owner, method, guard)
            except Exception:  # the error being reported matters more than this one
                _logger.exception("veronica-otel: could not refuse calls on %s", method)
                continue
            self._refusals.append((owner, method, guard))

    def lift(self) -> None:
        """Remove the refusal (containment is installed, or uninstrumented on purpose)."""
        for owner, method, guard in self._refusals:
            unwrap_ours(owner, method, guard)
        self._refusals.clear()

    def refused(self, message: str) -> bool:
        """Whether this call must be refused: a chain that limits anything, and no
        ``VERONICA_FAIL_OPEN`` (which warns once, naming ``message``)."""
        ctx = current_context()
        if ctx is None:
            ctx = default_context()  # raises a configuration error: closed too
            if ctx is None or (ctx.config == _UNLIMITED and not ctx.pipeline):
                return False  # no chain, or a default chain that limits nothing
        if not parse_env_bool("VERONICA_FAIL_OPEN"):
            return True
        if not self._warned:
            self._warned = True
            _logger.warning(
                "VERONICA_FAIL_OPEN: %s calls are NOT contained: %s", self.library, message
            )
        return False

    def _guard(self, message: str, is_async: bool) -> Callable[..., Any]:
        if is_async:

            async def arefuse(
                wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
            ) -> Any:
                if self.refused(message):
                    raise InstrumentationError(message)
                return await wrapped(*args, **kwargs)

            return arefuse

        def refuse(
            wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> Any:
            if self.refused(message):
                raise InstrumentationError(message)
            return wrapped(*args, **kwargs)

        return refuse


class GuardedInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """A ``BaseInstrumentor`` whose SDK hooks are probed first (see the module docs).

    Subclasses set ``_hooks``. ``instrument()`` raises :class:`InstrumentationError`
    when the SDK does not fit; the refusal then stays until ``uninstrument()``.
    """

    _hooks: SDKHooks
    #: The adapter's calls have their HTTP attempts reported at the transport
    #: (``_attempts.ensure_attempt_hooks``): the SDK's own retries are drawn there.
    reports_attempts: bool = False

    def _check_dependency_conflicts(self) -> Any:
        conflict = super()._check_dependency_conflicts()
        if conflict is not None and getattr(conflict, "found", None):
            # Installed, but out of the tested range: never skip quietly (the
            # base class would only log it); _instrument refuses loudly.
            return None
        return conflict

    def _instrument(self, **kwargs: Any) -> None:
        try:
            threads = _propagate_threads(kwargs.get("propagate_threads"))
        except ValueError as exc:  # a malformed VERONICA_THREADS: closed, like a bad hook
            error = self._hooks._error(self._hooks._label(), [str(exc)])
            self._hooks.refuse(error)
            _logger.error("%s", error)
            raise error from exc
        if threads:  # before the hooks: a refusal must see the chain in threads too
            hold_threads(type(self).__name__)
        if self.reports_attempts:
            from ._attempts import ensure_attempt_hooks  # imports the adapter machinery

            ensure_attempt_hooks()
        self._hooks.install()

    def _uninstrument(self, **kwargs: Any) -> None:
        self._hooks.remove()
        release_threads(type(self).__name__)

    def uninstrument(self, **kwargs: Any) -> Any:
        self._hooks.lift()  # a refusal left by a failed instrument(), which set no flag
        if not self.is_instrumented_by_opentelemetry:  # ... and may hold the threads
            release_threads(type(self).__name__)
        return super().uninstrument(**kwargs)


def _propagate_threads(choice: object) -> bool:
    """``propagate_threads=`` if given, else ``VERONICA_THREADS`` (default true)."""
    if choice is not None:
        if not isinstance(choice, bool):
            raise TypeError(f"propagate_threads={choice!r} must be True or False")
        return choice
    if not os.environ.get("VERONICA_THREADS", "").strip():
        return True
    return parse_env_bool("VERONICA_THREADS")
