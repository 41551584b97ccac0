"""The one place a store URL becomes a Redis client: one server or a Redis Cluster.

Forms of ``url`` (``VERONICA_REDIS_URL``):

* ``redis://host:6379/0``, ``rediss://...``, ``unix:///path.sock``: one server.
* ``redis://h1:7000,redis://h2:7001`` (or ``redis://h1:7000,h2:7001``): the
  nodes of a Redis Cluster. Nodes after the first may be bare ``host:port``
  and share the first one's scheme and credentials.
* A cluster flag: ``?cluster=true`` on the URL, or ``VERONICA_REDIS_CLUSTER=true``
  (the URL wins): a cluster found through that one node.

Every client gets the same policy: short socket timeouts and no client-side
retries (a retried reservation could count twice). A cluster client still
follows ``MOVED`` / ``ASK`` redirects (the command did not run), and never
retries after a connection error or timeout.

The cluster client is :class:`ClusterClient`, a ``redis.Redis`` whose commands
go to a ``redis.cluster.RedisCluster`` built at the first command: nothing is
sent at construction (an unreachable store is reported by the first
operation, fail closed), and the cluster client's own exceptions, which are
not ``RedisError`` (``RedisClusterException``: no node reachable, a slot not
covered), are raised as ``redis.ConnectionError`` so the ledger and breaker
fail closed on them as on any outage. Every key of a script shares the chain
tree's hash tag (``_keys.py``), so each script runs on the one node that
serves its slot.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from veronica_otel._config import parse_env_bool
from veronica_otel._fork import remake_locks_after_fork

from ._store import check_seconds

__all__ = ["ClusterClient", "connect", "with_cluster_flag"]

CLUSTER_VAR = "VERONICA_REDIS_CLUSTER"
_SCHEMES = ("redis", "rediss", "unix")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def connect(
    url: str, socket_timeout: float = 2.0, socket_connect_timeout: float = 1.0
) -> redis.Redis:
    """A client for ``url`` (see the module docstring for its forms).

    Raises:
        ValueError: A malformed URL or ``VERONICA_REDIS_CLUSTER`` value; the
            message never shows a password.
    """
    timeouts: dict[str, Any] = {
        "socket_timeout": check_seconds("socket_timeout", socket_timeout),
        "socket_connect_timeout": check_seconds("socket_connect_timeout", socket_connect_timeout),
    }
    first, nodes = _parse(url)
    if nodes is None:
        return redis.Redis.from_url(first, retry=Retry(NoBackoff(), 0), **timeouts)
    return ClusterClient(first, nodes, **timeouts)


def with_cluster_flag(url: str, environ: Mapping[str, str]) -> str:
    """``url`` with ``VERONICA_REDIS_CLUSTER`` from ``environ`` as its flag
    (for a configuration read from a mapping other than ``os.environ``); a
    flag already on the URL wins.

    Raises:
        ValueError: ``VERONICA_REDIS_CLUSTER`` is not a boolean (named).
    """
    if not environ.get(CLUSTER_VAR, "").strip() or "cluster=" in url:
        return url
    flag = "true" if parse_env_bool(CLUSTER_VAR, environ) else "false"
    return f"{url}{'&' if '?' in url.rpartition(',')[2] else '?'}cluster={flag}"


def _parse(url: object) -> tuple[str, list[tuple[str, int]] | None]:
    """``(url of the first node, every node)``; nodes is None for one server."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"the Redis URL must be a non-empty string, got {url!r}")
    parts = [part.strip() for part in url.strip().split(",")]
    if any(not part for part in parts):
        raise ValueError(f"the Redis URL {_safe(url)} has an empty node between commas")
    head = urlsplit(parts[0])
    if head.scheme not in _SCHEMES:
        raise ValueError(
            f"the Redis URL {_safe(parts[0])} must start with redis://, rediss:// or unix://"
        )
    flag: bool | None = None
    options: list[tuple[str, str]] = []
    nodes: list[tuple[str, int]] = []
    for index, given in enumerate(parts):
        # A bare host:port shares the first node's scheme and credentials.
        part = given if "://" in given else f"{head.scheme}://{_userinfo(head)}{given}"
        node = urlsplit(part)
        if index and (node.scheme, _userinfo(node)) != (head.scheme, _userinfo(head)):
            raise ValueError(
                f"the Redis URL {_safe(url)}: every cluster node must use the first node's "
                "scheme and credentials"
            )
        for key, value in parse_qsl(node.query, keep_blank_values=True):
            if key != "cluster":
                options.append((key, value))
            elif value.strip().lower() in _TRUE + _FALSE:
                flag = value.strip().lower() in _TRUE
            else:
                raise ValueError(
                    f"the Redis URL {_safe(url)}: cluster={value!r} is not a boolean "
                    "(use true or false)"
                )
        if node.scheme != "unix":
            try:
                host, port = node.hostname, node.port or 6379
            except ValueError:
                raise ValueError(f"the Redis URL {_safe(part)} has a malformed port") from None
            if not host:
                raise ValueError(f"the Redis URL {_safe(part)} names no host")
            nodes.append((host, port))
    if flag is None:
        flag = len(parts) > 1 or parse_env_bool(CLUSTER_VAR)
    if not flag:
        if len(parts) > 1:
            raise ValueError(
                f"the Redis URL {_safe(url)} names several nodes but cluster=false: "
                "several nodes are a Redis Cluster"
            )
        # One server: the URL as given, minus the flag (redis-py would read it as an option).
        return (parts[0] if "cluster=" not in head.query else _rebuild(head, options)), None
    if head.scheme == "unix":
        raise ValueError(f"the Redis URL {_safe(url)}: a Redis Cluster is reached over TCP")
    db = dict(options).get("db", head.path.strip("/") or "0")
    if db != "0":
        raise ValueError(f"the Redis URL {_safe(url)}: a Redis Cluster has only database 0")
    return _rebuild(head, options), nodes


def _userinfo(parts: Any) -> str:
    netloc: str = parts.netloc
    return netloc.rpartition("@")[0] + "@" if "@" in netloc else ""


def _rebuild(head: Any, options: list[tuple[str, str]]) -> str:
    return str(urlunsplit((head.scheme, head.netloc, head.path, urlencode(options), "")))


def _safe(url: str) -> str:
    """``url`` for a message: any password replaced by ``***``."""
    shown = []
    for part in url.split(","):
        scheme, sep, rest = part.strip().rpartition("://")
        userinfo, at, host = rest.rpartition("@")
        if at:
            user = userinfo.partition(":")[0]
            rest = f"{user}:***@{host}" if user else f"***@{host}"
        shown.append(f"{scheme}{sep}{rest}")
    return repr(",".join(shown))


class ClusterClient(redis.Redis):
    """A ``redis.Redis`` whose commands run on a Redis Cluster (built at first use).

    Script registration, ``EVALSHA`` (with its ``SCRIPT LOAD`` fallback) and
    every keyed command go through :meth:`execute_command` to the node that
    serves the key's slot; :meth:`pipeline` is the cluster's pipeline.
    """

    def __init__(self, url: str, nodes: list[tuple[str, int]], **options: Any) -> None:
        super().__init__()  # the encoder and response callbacks; no connection is made
        self._url = url
        self._nodes = nodes
        self._options = options
        self._cluster: RedisCluster | None = None
        self._build_lock = threading.Lock()
        remake_locks_after_fork(self, "_build_lock")  # a parent thread may hold it at fork
        self.store_label = _store_label(url, nodes)

    @property
    def cluster_url(self) -> str:
        """The first node's URL (the asyncio client is built from it too)."""
        return self._url

    @property
    def cluster_nodes(self) -> list[tuple[str, int]]:
        return list(self._nodes)

    @property
    def cluster_options(self) -> dict[str, Any]:
        return dict(self._options)

    @property
    def redis_cluster(self) -> RedisCluster:
        """The ``RedisCluster`` client (built now if it was not yet)."""
        cluster = self._cluster
        if cluster is not None:
            return cluster
        with self._build_lock:
            if self._cluster is None:
                try:
                    self._cluster = RedisCluster.from_url(
                        self._url,
                        startup_nodes=[ClusterNode(h, p) for h, p in self._nodes[1:]],  # type: ignore[no-untyped-call]
                        retry=Retry(NoBackoff(), 0),
                        **self._options,
                    )
                except RedisClusterException as exc:
                    raise redis.ConnectionError(str(exc)) from exc
            return self._cluster

    def execute_command(self, *args: Any, **options: Any) -> Any:
        try:
            return self.redis_cluster.execute_command(*args, **options)  # type: ignore[no-untyped-call]
        except RedisClusterException as exc:
            raise redis.ConnectionError(str(exc)) from exc

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        return self.redis_cluster.pipeline(transaction, shard_hint)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        """Close every node's connections (a later command connects afresh)."""
        cluster, self._cluster = self._cluster, None
        if cluster is not None:
            cluster.close()
            # A cluster built by from_url gives each node client a pool of its
            # own making, which that client's close() leaves open: close them.
            manager = cluster.nodes_manager
            nodes = [*manager.nodes_cache.values(), *manager.startup_nodes.values()]
            for node in nodes:
                if node.redis_connection is not None:
                    node.redis_connection.connection_pool.disconnect()
        super().close()

    def __repr__(self) -> str:
        return f"ClusterClient({self.store_label!r})"


def _store_label(url: str, nodes: list[tuple[str, int]]) -> str:
    """``redis-cluster://h1:p1,h2:p2`` (scheme kept, credentials never shown)."""
    scheme = urlsplit(url).scheme
    hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in nodes)
    return f"{scheme}+cluster://{hosts}"
