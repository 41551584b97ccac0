"""Containment of the ``openai`` SDK's WebSocket sessions (DESIGN G12).

``client.realtime.connect()``, ``client.responses.connect()`` and their
``beta`` twins (and any other session: ``realtime.translations``, ``live``)
send over a WebSocket, not through the HTTP request hook. Each connection
manager of the SDK opens its socket in ``_connect_ws`` (for the first
connection and every reconnection; the older ``beta.realtime`` manager in
``__enter__``): we wrap that, and hold the socket it returns in a proxy that
sees every message sent and received, whichever path of the SDK sends it
(a direct send, the queue flushed on entry or after a reconnect).

- Opening: a session belongs to the chain active when it opens. A tripped
  chain (or a passed deadline) raises BudgetExceededError before the socket
  is opened; a session we cannot price is refused under a cost ceiling.
- Each event that makes the model generate (``response.create``; with turn
  detection on, the audio that may end a turn) is admitted as a call before
  it is sent: a step, its worst case reserved (:mod:`._realtime_session`);
  the kernel's output cap is written into the event. It is settled from the
  usage the server reports when the response is done, each modality at its
  own rate.
- A trip cuts an open session at its next event: the send or receive raises
  BudgetExceededError and the connection is closed.
- A response not done when the connection closes or drops (G10: its outcome
  is unknown) costs its reservation; one whose send failed before the frame
  left is released.
- A session opened outside any chain is not contained (it belongs to none).

Gemini Live (``google-genai`` ``client.aio.live.connect``) is contained the
same way (:func:`live_connect`, registered by the ``google-genai`` adapter;
its protocol in :mod:`._live_session`): the chain is checked before the
socket opens, the socket the session holds is proxied once open.

Installed by :class:`~veronica_otel.instrumentors.openai.OpenAIInstrumentor`
(:func:`install` / :func:`remove`).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
import weakref
from collections.abc import Callable
from typing import Any

import wrapt
from opentelemetry import context as otel_context

from veronica_otel._agents import current_agent
from veronica_otel._call_spec import CallSpec
from veronica_otel._context import CONTEXT_KEY, ExecutionContext
from veronica_otel._errors import BudgetExceededError
from veronica_otel._propagation import default_context

from ._adapter import refuse_unpriced
from ._admit import aadmit, admit
from ._common import ContainedCall, get_field, start_span
from ._hooks import InstrumentationError
from ._live_session import LiveSession
from ._realtime_session import PROVIDER, Session, session_kind
from ._unwrap import is_ours, unwrap_ours

__all__ = ["install", "live_connect", "remove"]

_logger = logging.getLogger(__name__.rpartition(".")[0] + ".openai")

# The SDK modules holding WebSocket connection managers (a test walks the
# installed SDK for any other). One missing in an older release is skipped.
_MODULES = (
    "openai.resources.realtime.realtime",
    "openai.resources.realtime.translations.translations",
    "openai.resources.beta.realtime.realtime",
    "openai.resources.responses.responses",
    "openai.resources.beta.responses.responses",
    "openai.resources.live.live",
    "openai.resources.live.sideband",
    "openai.resources.live.forks",
)
_installed = False  # install() ran and remove() has not since
_registered = False  # the post-import hooks are registered (once: wrapt keeps them)
_UNPRICED = (
    "cannot be priced before it is sent; it is refused under a cost ceiling "
    "(run it in a chain without max_cost_usd to count it in steps)"
)


class _Bound:
    """A session and the chain it belongs to (one per connection manager)."""

    __slots__ = ("agent", "ctx", "parent", "path", "session")

    def __init__(self, ctx: ExecutionContext, session: Session, parent: Any, path: str) -> None:
        self.ctx = ctx
        self.session = session
        self.parent = parent  # the OpenTelemetry context the session opened in
        self.agent = current_agent() if ctx.names_agents else None
        self.path = path


_BOUND: weakref.WeakKeyDictionary[Any, _Bound] = weakref.WeakKeyDictionary()


def _chain() -> tuple[Any, ExecutionContext | None]:
    """The current OpenTelemetry context and the chain active in it (None: none)."""
    current = otel_context.get_current()
    ctx: ExecutionContext | None = current.get(CONTEXT_KEY)  # type: ignore[assignment]
    return current, ctx if ctx is not None else default_context(current)


def _bind(manager: Any) -> _Bound | None:
    """The session ``manager`` opens, bound to the active chain; None: no chain."""
    bound = _BOUND.get(manager)
    if bound is not None:
        return bound  # a reconnection: the session and its chain carry on
    current, ctx = _chain()
    if ctx is None:
        return None
    try:
        path = str(manager._prepare_url().path)
    except Exception as exc:  # the SDK changed: we cannot tell what the session bills
        raise InstrumentationError(
            f"veronica-otel cannot read the path of {type(manager).__qualname__} "
            f"({exc!r}); the session is refused"
        ) from exc
    model = next(
        (v for k, v in vars(manager).items() if k.endswith("__model") and isinstance(v, str)),
        "",
    )
    beta = ".beta." in type(manager).__module__
    bound = _Bound(ctx, Session(session_kind(path), model, beta), current, path)
    _BOUND[manager] = bound
    return bound


def _spec(bound: _Bound, spec: CallSpec) -> tuple[CallSpec, Any]:
    """``spec`` bounded, and its span (the model's prices may deny it first)."""
    provider = bound.session.provider
    prices = bound.ctx.prices_for(provider, spec.model)
    spec = bound.session.bound(spec, prices)
    span = start_span(spec.operation, provider, spec.model, bound.agent, bound.parent)
    return spec, span


def _session_spec(bound: _Bound) -> CallSpec | None:
    """The call a session we cannot price is (None: a priced session, or refused)."""
    if bound.session.kind is not None:
        return None
    if bound.ctx.has_cost_ceiling:
        refuse_unpriced(bound.ctx, f"openai WebSocket session {bound.path}", why=_UNPRICED)
    return CallSpec(PROVIDER, "realtime", bound.session.model, 0, 0, False)


def _closed(error: BaseException) -> bool:
    """Whether ``error`` is the socket found closed (a frame refused, none sent)."""
    try:
        from websockets.exceptions import ConnectionClosed
    except ImportError:  # pragma: no cover - the SDK's sessions need websockets
        return False
    return isinstance(error, ConnectionClosed)


def _fixed(call: ContainedCall, spec: CallSpec, fallback: str | None, bound: _Bound) -> None:
    """A session keeps its model (not a Responses one): a fallback is priced as what is sent."""
    if fallback is not None and bound.session.kind != "responses":
        call.model, call.prices = spec.model, bound.ctx.prices_for(spec.provider, spec.model)


class _SyncSocket(wrapt.BaseObjectProxy[Any]):
    """A ``websockets.sync`` connection of a session: each message seen."""

    def __init__(self, socket: Any, bound: _Bound) -> None:
        super().__init__(socket)
        self._self_bound = bound

    def _self_cut(self, error: BaseException) -> None:
        with contextlib.suppress(Exception):
            self.__wrapped__.close()
        for call, _ in self._self_bound.session.lost():
            call.finish(error)

    def _self_alive(self) -> None:
        try:
            self._self_bound.ctx.ensure_active()
        except BudgetExceededError as exc:
            self._self_cut(exc)
            raise

    def _self_admit(self, spec: CallSpec) -> tuple[ContainedCall, int | None, str | None]:
        bound = self._self_bound
        try:
            spec, span = _spec(bound, spec)
            call, clamp, fallback = admit(bound.ctx, span, True, spec)
        except BudgetExceededError as exc:
            self._self_cut(exc)
            raise
        _fixed(call, spec, fallback, bound)
        return call, clamp, fallback

    def send(self, message: Any, *args: Any, **kwargs: Any) -> Any:
        self._self_alive()
        session = self._self_bound.session
        spec, event = session.outgoing(message)
        entry = None
        if spec is not None:
            call, clamp, fallback = self._self_admit(spec)
            if event is not None and (clamp is not None or fallback is not None):
                message = session.rewrite(event, clamp, fallback)
            entry = session.add(call, armed=event is None)
        try:
            return self.__wrapped__.send(message, *args, **kwargs)
        except BaseException as exc:
            if entry is not None:
                session.drop(entry)
                entry[0].finish(exc, sent=not _closed(exc))
            raise

    def recv(self, *args: Any, **kwargs: Any) -> Any:
        self._self_alive()
        session = self._self_bound.session
        try:
            message = self.__wrapped__.recv(*args, **kwargs)
        except BaseException as exc:
            if _closed(exc):
                for call, _ in session.lost():
                    call.finish(exc)
            raise
        started, response_id, settled = session.incoming(message)
        for call in settled:
            call.finish()
        if started:
            call, _, _ = self._self_admit(session.server_spec())
            session.add(call)[1] = response_id
        return message

    def close(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.__wrapped__.close(*args, **kwargs)
        finally:  # closed before its response was done: the reservation
            for call, unstarted in self._self_bound.session.lost():
                call.finish(sent=not unstarted)


class _AsyncSocket(wrapt.BaseObjectProxy[Any]):
    """A ``websockets.asyncio`` connection of a session: :class:`_SyncSocket`, awaited."""

    def __init__(self, socket: Any, bound: _Bound) -> None:
        super().__init__(socket)
        self._self_bound = bound

    async def _self_cut(self, error: BaseException) -> None:
        with contextlib.suppress(Exception):
            await self.__wrapped__.close()
        for call, _ in self._self_bound.session.lost():
            await call.afinish(error)

    async def _self_alive(self) -> None:
        try:
            await self._self_bound.ctx.aensure_active()
        except BudgetExceededError as exc:
            await self._self_cut(exc)
            raise

    async def _self_admit(self, spec: CallSpec) -> tuple[ContainedCall, int | None, str | None]:
        bound = self._self_bound
        try:
            spec, span = _spec(bound, spec)
            call, clamp, fallback = await aadmit(bound.ctx, span, True, spec)
        except BudgetExceededError as exc:
            await self._self_cut(exc)
            raise
        _fixed(call, spec, fallback, bound)
        return call, clamp, fallback

    async def send(self, message: Any, *args: Any, **kwargs: Any) -> Any:
        await self._self_alive()
        session = self._self_bound.session
        spec, event = session.outgoing(message)
        entry = None
        if spec is not None:
            call, clamp, fallback = await self._self_admit(spec)
            if event is not None and (clamp is not None or fallback is not None):
                message = session.rewrite(event, clamp, fallback)
            entry = session.add(call, armed=event is None)
        try:
            return await self.__wrapped__.send(message, *args, **kwargs)
        except BaseException as exc:
            if entry is not None:
                session.drop(entry)
                await entry[0].afinish(exc, sent=not _closed(exc))
            raise

    async def recv(self, *args: Any, **kwargs: Any) -> Any:
        await self._self_alive()
        session = self._self_bound.session
        try:
            message = await self.__wrapped__.recv(*args, **kwargs)
        except BaseException as exc:
            if _closed(exc):
                for call, _ in session.lost():
                    await call.afinish(exc)
            raise
        started, response_id, settled = session.incoming(message)
        for call in settled:
            await call.afinish()
        if started:
            call, _, _ = await self._self_admit(session.server_spec())
            session.add(call)[1] = response_id
        return message

    async def close(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await self.__wrapped__.close(*args, **kwargs)
        finally:
            await self._self_closed()

    async def _self_closed(self) -> None:
        """Settle what was in flight when the connection closed (not through us)."""
        for call, unstarted in self._self_bound.session.lost():
            await call.afinish(sent=not unstarted)


# -- the hooks -----------------------------------------------------------------


def _open_sync(bound: _Bound, open_socket: Callable[[], Any]) -> Any:
    """Check the chain, admit an unpriced session, open the socket (then ``wrap``)."""
    bound.ctx.ensure_active()  # a tripped chain opens no socket
    spec = _session_spec(bound)
    call = None
    if spec is not None:
        spec, span = _spec(bound, spec)
        call = admit(bound.ctx, span, True, spec)[0]
    try:
        result = open_socket()
    except BaseException as exc:
        if call is not None:
            call.finish(exc, sent=False)
        raise
    if call is not None:
        bound.session.add(call)  # settled when the connection ends
    return result


async def _open_async(bound: _Bound, open_socket: Callable[[], Any]) -> Any:
    await bound.ctx.aensure_active()
    spec = _session_spec(bound)
    call = None
    if spec is not None:
        spec, span = _spec(bound, spec)
        call = (await aadmit(bound.ctx, span, True, spec))[0]
    try:
        result = await open_socket()
    except BaseException as exc:
        if call is not None:
            await call.afinish(exc, sent=False)
        raise
    if call is not None:
        bound.session.add(call)
    return result


def _connect_ws(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    bound = _bind(instance)
    if bound is None:
        return wrapped(*args, **kwargs)
    return _SyncSocket(_open_sync(bound, lambda: wrapped(*args, **kwargs)), bound)


async def _aconnect_ws(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    bound = _bind(instance)
    if bound is None:
        return await wrapped(*args, **kwargs)
    return _AsyncSocket(await _open_async(bound, lambda: wrapped(*args, **kwargs)), bound)


def _enter(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """``__enter__`` of a manager that opens its socket there (``beta.realtime``)."""
    bound = _bind(instance)
    if bound is None:
        return wrapped(*args, **kwargs)
    connection = _open_sync(bound, lambda: wrapped(*args, **kwargs))
    connection._connection = _SyncSocket(connection._connection, bound)
    return connection


async def _aenter(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    bound = _bind(instance)
    if bound is None:
        return await wrapped(*args, **kwargs)
    connection = await _open_async(bound, lambda: wrapped(*args, **kwargs))
    connection._connection = _AsyncSocket(connection._connection, bound)
    return connection


class _LiveConnect:
    """``client.aio.live.connect(...)`` of ``google-genai``: its context manager,
    the chain checked before the socket opens and the socket held once open."""

    def __init__(self, inner: Any, bound: _Bound) -> None:
        self._inner = inner
        self._bound = bound
        self._socket: _AsyncSocket | None = None

    async def __aenter__(self) -> Any:
        session = await _open_async(self._bound, self._inner.__aenter__)
        self._socket = session._ws = _AsyncSocket(session._ws, self._bound)
        return session

    async def __aexit__(self, *exc_info: Any) -> Any:
        try:  # the SDK closes its socket itself, not through ours
            return await self._inner.__aexit__(*exc_info)
        finally:
            if self._socket is not None:
                await self._socket._self_closed()


def live_connect(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """The wrapper of ``google.genai.live.AsyncLive.connect`` (``model=``, ``config=``)."""
    current, ctx = _chain()
    if ctx is None:
        return wrapped(*args, **kwargs)
    config = kwargs.get("config")
    generation = get_field(config, "generation_config") or config
    cap = get_field(generation, "max_output_tokens")
    model = str(kwargs.get("model") or "")
    vertex = bool(getattr(getattr(instance, "_api_client", None), "vertexai", False))
    session = LiveSession(
        model,
        "gcp.vertex_ai" if vertex else "gcp.gemini",
        _setup_parts(config),
        cap if type(cap) is int and cap > 0 else None,
    )
    bound = _Bound(ctx, session, current, "live")
    return _LiveConnect(wrapped(*args, **kwargs), bound)


def _setup_parts(config: object) -> object:
    """What the setup message sends (instructions, tools): input of every turn."""
    dump = getattr(config, "model_dump", None)
    return dump(exclude_none=True, mode="json") if callable(dump) else config


def _managers_of(module: Any) -> list[type]:
    """The WebSocket connection managers ``module`` defines."""
    name = module.__name__
    return [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and value.__module__ == name
        and value.__name__.endswith("ConnectionManager")
    ]


def managers() -> list[type]:
    """The SDK's WebSocket connection managers, in the :data:`_MODULES` imported so far."""
    found = []
    for name in _MODULES:
        module = sys.modules.get(name)
        if module is not None:
            found += _managers_of(module)
    return found


def _hooks(manager: type) -> list[tuple[str, Any]]:
    """``(method, wrapper)`` to put on ``manager``."""
    connect = inspect.getattr_static(manager, "_connect_ws", None)
    if connect is not None:
        is_async = inspect.iscoroutinefunction(inspect.unwrap(connect))
        return [("_connect_ws", _aconnect_ws if is_async else _connect_ws)]
    if hasattr(manager, "__aenter__"):
        return [("__aenter__", _aenter), ("enter", _aenter)]
    return [("__enter__", _enter), ("enter", _enter)]


def _wrap(module: Any) -> None:
    """Wrap the managers of ``module`` (a post-import hook: it may run after :func:`remove`)."""
    if not _installed:
        return
    for manager in _managers_of(module):
        for method, wrapper in _hooks(manager):
            if hasattr(manager, method) and not is_ours(manager, method, wrapper):
                wrapt.wrap_function_wrapper(manager, method, wrapper)


def install() -> None:
    """Wrap every WebSocket connection manager of the SDK, as its module is imported.

    The client imports these modules on first use (``client.realtime``), before
    any session can open; importing them here instead would load every
    resource module of the SDK (about 900) at start-up and tear them down at
    exit, for apps that never open a session (seconds under zero code).
    """
    global _installed, _registered
    _installed = True
    if _registered:
        for name in _MODULES:
            module = sys.modules.get(name)
            if module is not None:
                _wrap(module)
        return
    _registered = True
    for name in _MODULES:  # a module imported already is wrapped now
        wrapt.register_post_import_hook(_wrap, name)


def remove() -> None:
    """Remove our wrappers (a module imported later is left alone)."""
    global _installed
    _installed = False
    for manager in managers():
        for method, wrapper in _hooks(manager):
            unwrap_ours(manager, method, wrapper)
