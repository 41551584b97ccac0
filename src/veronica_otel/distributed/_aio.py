"""The ledger's asyncio clients: one per event loop, to the same store as its sync client.

``redis.asyncio`` connections belong to the loop that opened them, so a
ledger used from several loops (``asyncio.run`` after ``asyncio.run``, one
loop per thread) keeps one client per loop:

* Built at the loop's first async operation, from the sync client's
  address and policy (short timeouts, no client-side retries; a Redis
  Cluster when the sync client is one), so both reach the same store.
* Closed with its loop: a small async generator is started on the loop,
  and ``loop.shutdown_asyncgens()`` (which ``asyncio.run`` and
  ``asyncio.Runner`` call before closing it) runs its ``finally``, which
  closes the client's connections while the loop still runs. A loop closed
  without that step leaves its client to be dropped at the next lookup.
* After ``fork`` the child never uses the parent's sockets: its first
  lookup starts afresh (the parent's clients are kept, untouched, so their
  finalisers never write to the parent's connections).
* At most ``size`` round trips at a time (``RedisLedger(async_connections=)``),
  in first-come order (:class:`Slots`): waiting for a connection is queueing,
  bounded by the round trips ahead (each within the socket timeouts), never
  a store failure. A call that was waiting when a round trip failed on an
  outage fails closed with it at once, without trying the store itself, so a
  dead store still fails a whole queue within one timeout.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import AsyncGenerator, Sequence
from types import TracebackType
from typing import Any

import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript, Script
from redis.exceptions import RedisClusterException

from veronica_otel._fork import remake_locks_after_fork

from ._connect import ClusterClient

__all__ = ["MAX_CONNECTIONS", "AsyncClients", "LoopClient", "QueuedOutageError", "Slots"]

_logger = logging.getLogger("veronica_otel.distributed")

# What an asyncio client copies from a sync client's connection settings.
_COPIED = (
    "host",
    "port",
    "db",
    "username",
    "password",
    "path",
    "socket_timeout",
    "socket_connect_timeout",
    "socket_keepalive",
    "socket_keepalive_options",
    "encoding",
    "encoding_errors",
    "decode_responses",
    "client_name",
    "ssl_keyfile",
    "ssl_certfile",
    "ssl_cert_reqs",
    "ssl_ca_certs",
    "ssl_ca_data",
    "ssl_check_hostname",
    "ssl_password",
    "ssl_min_version",
    "ssl_ciphers",
)
# Default connections of one loop's client (a round trip beyond them queues).
MAX_CONNECTIONS = 16  # enough to keep one server busy; beyond it calls queue
_WAIT_S = 2.0
_OUTAGES = (redis.ConnectionError, redis.TimeoutError)
_CLASSES = {
    "Connection": aredis.Connection,
    "SSLConnection": aredis.SSLConnection,
    "UnixDomainSocketConnection": aredis.UnixDomainSocketConnection,
}


class _AsyncCluster(AsyncRedisCluster):
    """The cluster's own exceptions (no node reachable, a slot not covered)
    are not ``RedisError``: raised as ``redis.ConnectionError``, so the ledger
    fails closed on them as on any outage (as ``ClusterClient`` does)."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().execute_command(*args, **kwargs)
        except RedisClusterException as exc:
            raise redis.ConnectionError(str(exc)) from exc


class QueuedOutageError(redis.ConnectionError):
    """The store failed on an outage while this round trip waited for a connection."""


class Slots:
    """First-come admission of one loop's round trips to its ``size`` connections.

    ``async with slots:`` around one round trip (never nested: a task holding
    a slot never waits for another). An uncontended entry does not yield.
    """

    __slots__ = ("_free", "_last", "_outages")

    def __init__(self, size: int) -> None:
        self._free = asyncio.Semaphore(size)  # FIFO: a newcomer never overtakes a waiter
        self._outages = 0
        self._last: BaseException | None = None

    async def __aenter__(self) -> None:
        seen = self._outages
        await self._free.acquire()
        if self._outages != seen:  # the store failed while this call queued
            self._free.release()
            raise QueuedOutageError(
                f"the ledger store failed while this call waited for a connection: {self._last}"
            ) from self._last

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, _OUTAGES) and not isinstance(exc, QueuedOutageError):
            self._outages += 1
            self._last = exc
        self._free.release()


def async_client(client: redis.Redis, size: int = MAX_CONNECTIONS) -> Any:
    """An asyncio client to ``client``'s store, with the same policy (no connection yet)."""
    retry = AsyncRetry(NoBackoff(), 0)
    if isinstance(client, ClusterClient):
        nodes = [AsyncClusterNode(host, port) for host, port in client.cluster_nodes[1:]]
        return _AsyncCluster.from_url(
            client.cluster_url, startup_nodes=nodes, retry=retry, **client.cluster_options
        )
    pool = client.connection_pool
    settings = pool.connection_kwargs
    kind = _CLASSES.get(pool.connection_class.__name__)
    if kind is None:
        raise TypeError(
            f"no asyncio connection for {pool.connection_class.__name__} (the ledger's client); "
            "async calls need a redis://, rediss:// or unix:// client"
        )
    options = {name: settings[name] for name in _COPIED if name in settings}
    # Bounded like the loop's Slots, which queue the round trips first, so
    # this pool's own wait (a reply's timeout) is only a backstop.
    apool = aredis.BlockingConnectionPool(
        connection_class=kind,
        retry=retry,
        max_connections=size,
        timeout=options.get("socket_timeout") or _WAIT_S,
        **options,
    )
    return aredis.Redis(connection_pool=apool)


def _cancels() -> int:
    """How many cancels the running task has pending (:meth:`asyncio.Task.cancelling`)."""
    task = asyncio.current_task()
    return 0 if task is None else task.cancelling()


def _raise_dropped_cancel(before: int) -> None:
    """Raise the cancel a round trip returned through instead of raising.

    On Python 3.11 redis-py awaits each send's drain inside ``asyncio.wait_for``,
    which drops a cancel that lands as the drain completes (CPython gh-86296):
    the task ran on to the reply, and a call cancelled there would be sent.
    The count of cancels the task was asked for says so; the caller's cancel
    path (give back, or queue for replay by id) then runs as for any cancel.
    """
    if _cancels() > before:
        raise asyncio.CancelledError


class LoopClient:
    """One loop's asyncio client, its registered scripts and its round-trip slots."""

    __slots__ = ("client", "closer", "flushing", "scripts", "slots")

    def __init__(self, client: Any, size: int = MAX_CONNECTIONS) -> None:
        self.client = client
        self.scripts: dict[str, AsyncScript] = {}
        self.closer: AsyncGenerator[None, None] | None = None
        self.flushing = asyncio.Lock()  # queued commits replay one task at a time
        self.slots = Slots(size)

    def script(self, script: Script) -> AsyncScript:
        """The asyncio twin of a script registered on the sync client (same SHA)."""
        found = self.scripts.get(script.sha)
        if found is None:
            found = self.scripts[script.sha] = self.client.register_script(script.script)
        return found

    async def call(self, script: Script, keys: list[str], args: list[str]) -> Any:
        """One script round trip, in its turn for a connection."""
        found = self.script(script)
        cancels = _cancels()
        async with self.slots:
            reply = await found(keys, args)
        _raise_dropped_cancel(cancels)
        return reply

    async def hmget(self, key: str, fields: Sequence[str]) -> Any:
        """One ``HMGET`` round trip, in its turn for a connection."""
        cancels = _cancels()
        async with self.slots:
            reply = await self.client.hmget(key, fields)
        _raise_dropped_cancel(cancels)
        return reply

    async def run(self, request: tuple[Script, list[str], list[str]]) -> Any:
        """One script call of a pooled plan (``_pools.Plan``) on this client."""
        return await self.call(*request)


class AsyncClients:
    """The asyncio clients of one ledger, one per running event loop."""

    def __init__(self, client: redis.Redis, size: int = MAX_CONNECTIONS) -> None:
        self._sync = client
        self._size = size
        self._by_loop: dict[asyncio.AbstractEventLoop, LoopClient] = {}
        self._pid = os.getpid()
        self._forked: list[dict[asyncio.AbstractEventLoop, LoopClient]] = []
        self._lock = threading.Lock()
        remake_locks_after_fork(self, "_lock")
        # A client of another kind (a test double, a proxy) has no asyncio
        # twin: the async operations then run the sync ones.
        self.supported = isinstance(client, ClusterClient) or (
            isinstance(getattr(client, "connection_pool", None), redis.ConnectionPool)
            and client.connection_pool.connection_class.__name__ in _CLASSES
        )

    def __len__(self) -> int:
        return len(self._by_loop)

    async def get(self) -> LoopClient:
        """The running loop's client (built, and tied to the loop's end, at first use)."""
        loop = asyncio.get_running_loop()
        found = self._by_loop.get(loop)
        if found is not None and self._pid == os.getpid():
            return found
        with self._lock:
            if self._pid != os.getpid():  # a forked child: never touch the parent's
                self._forked.append(self._by_loop)
                self._by_loop, self._pid = {}, os.getpid()
            # Loops that ended without shutdown_asyncgens (a bare loop.close()).
            ended = [self._by_loop.pop(old) for old in list(self._by_loop) if old.is_closed()]
            found = self._by_loop.get(loop)
            if found is None:
                client = async_client(self._sync, self._size)
                found = self._by_loop[loop] = LoopClient(client, self._size)
        for entry in ended:
            _abandon(entry)
        if found.closer is None:
            found.closer = self._close_with_loop(loop, found)
            await found.closer.__anext__()  # started here: the loop now tracks it
        return found

    async def drop_idle(self) -> None:
        """Close the running loop's idle connections: after a store error they
        may lead to a server that is gone (the next command connects afresh)."""
        entry = self._by_loop.get(asyncio.get_running_loop())
        pool = getattr(entry.client, "connection_pool", None) if entry is not None else None
        if pool is not None:
            await pool.disconnect(inuse_connections=False)

    async def _close_with_loop(
        self, loop: asyncio.AbstractEventLoop, entry: LoopClient
    ) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            with self._lock:
                if self._by_loop.get(loop) is entry:
                    del self._by_loop[loop]
            await _close(entry.client)

    async def close(self) -> None:
        """Close the running loop's client now (a later operation opens a new one)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._by_loop.pop(loop, None)
        if entry is not None:
            closer, entry.closer = entry.closer, None
            if closer is not None:
                await closer.aclose()
            else:
                await _close(entry.client)


def _abandon(entry: LoopClient) -> None:
    """Finish the closer of a client whose loop is closed, here and now, so it
    is never handed to that loop's finaliser (which would raise: loop closed).
    Its sockets are closed as far as a closed loop allows."""
    closer, entry.closer = entry.closer, None
    if closer is None:
        return
    step = closer.aclose()
    try:
        step.send(None)
    except StopIteration:
        return
    except RuntimeError as exc:  # the closed loop refused a callback: the sockets stay
        _logger.debug("closing a client of a closed event loop: %s", exc)
    finally:
        step.close()


async def _close(client: Any) -> None:
    if isinstance(client, aredis.Redis):  # its pool was given, so only this closes it
        await client.aclose(close_connection_pool=True)
    else:
        await client.aclose()
