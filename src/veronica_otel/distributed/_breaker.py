"""RedisCircuitBreaker: one circuit breaker shared by every process.

Same interface and semantics as :class:`~veronica_otel.CircuitBreaker`:
CLOSED -> OPEN after ``failure_threshold`` consecutive failures, HALF_OPEN
once ``recovery_timeout`` has passed, and then exactly one probe in flight,
across all processes. Each operation is one Lua script (one round trip).

* Time is the Redis server's ``TIME``, so every process agrees on when the
  circuit may be probed.
* The half-open probe slot is a random token claimed atomically by
  ``check``; the process that claimed it remembers which call (its
  :class:`~veronica_otel.PolicyContext`) holds it. Only that call's outcome
  (or an outcome reported with ``owner=None``) counts in HALF_OPEN; late
  outcomes of other calls are ignored.
* The slot expires ``probe_ttl_s`` after it was taken (default: the recovery
  timeout, at least 60 s), so a prober that crashed cannot wedge the circuit
  half-open.
* Store unreachable: ``check`` denies (fail closed), naming the store, unless
  ``fail_open`` (or ``VERONICA_FAIL_OPEN=true``) lets calls through with a
  warning. Outcomes that cannot be recorded are logged and dropped; ``state``,
  ``failure_count`` and ``reset`` raise :class:`LedgerUnavailableError`.

Usage::

    breaker = RedisCircuitBreaker.from_url("redis://localhost:6379/0", "openai:gpt-4o")
    pipeline = PolicyPipeline([breaker])
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import redis
from opentelemetry import context as otel_context

from veronica_otel._breaker import CircuitState
from veronica_otel._config import parse_env_bool
from veronica_otel._errors import TripEvent
from veronica_otel._fork import remake_locks_after_fork
from veronica_otel._policy import PolicyContext, PolicyDecision
from veronica_otel._units import check_count

from . import _scripts
from ._connect import connect
from ._errors import LedgerUnavailableError
from ._store import check_seconds, corruption, describe, quiet, text

__all__ = ["RedisCircuitBreaker"]

_logger = logging.getLogger("veronica_otel.distributed")

_ALLOW = PolicyDecision(True, "circuit_breaker")
_OWNER_LIMIT = 1024
_NOT_A_PROBE = "-"  # never equal to a claimed token
# A probe slot must outlive the probe call itself, even with a tiny recovery timeout.
_MIN_PROBE_TTL_S = 60.0


class RedisCircuitBreaker:
    """A circuit breaker whose state lives in Redis / Valkey.

    Args:
        client: A ``redis.Redis`` client (see :meth:`from_url`).
        name: The endpoint this breaker guards (``"openai:gpt-4o"``); every
            breaker with the same name and prefix shares one state.
        failure_threshold: Consecutive failures that open the circuit.
        recovery_timeout: Seconds the circuit stays OPEN before one probe.
        key_prefix: Prefix of the breaker's key.
        probe_ttl_s: Seconds a half-open probe slot is held before it is
            considered abandoned (default: ``recovery_timeout``, at least 60 s,
            so a short recovery timeout never lets a second probe in while
            the first one's call is still running).
        state_ttl_s: The state expires this long after its last write.
        fail_open: Let calls through when the store fails; ``None`` reads
            ``VERONICA_FAIL_OPEN``.
    """

    policy_type = "circuit_breaker"

    def __init__(
        self,
        client: redis.Redis,
        name: str,
        failure_threshold: int = 5,
        recovery_timeout: float = 60.0,
        *,
        key_prefix: str = "veronica:",
        probe_ttl_s: float | None = None,
        state_ttl_s: float = 86400.0,
        fail_open: bool | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        if not isinstance(key_prefix, str):
            raise ValueError(f"key_prefix must be a string, got {key_prefix!r}")
        check_count("failure_threshold", failure_threshold)
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {failure_threshold!r}")
        recovery = check_seconds("recovery_timeout", recovery_timeout)
        probe_ttl = (
            max(recovery, _MIN_PROBE_TTL_S)
            if probe_ttl_s is None
            else check_seconds("probe_ttl_s", probe_ttl_s)
        )
        state_ttl = check_seconds("state_ttl_s", state_ttl_s, minimum=1.0)
        if fail_open is None:
            fail_open = parse_env_bool("VERONICA_FAIL_OPEN")
        self.name = name
        self.failure_threshold = failure_threshold
        self.recovery_timeout = recovery
        self.key = f"{key_prefix}breaker:{name}"
        self.store = describe(client)
        self._client = client
        self._fail_open = bool(fail_open)
        self._script = client.register_script(_scripts.BREAKER)
        self._config = (
            str(failure_threshold),
            str(round(recovery * 1_000_000)),
            str(round(probe_ttl * 1_000_000)),
            str(round(max(state_ttl, recovery, probe_ttl) * 1000)),
        )
        self._lock = threading.Lock()
        remake_locks_after_fork(self)  # a parent thread may hold it at fork
        self._owners: dict[int, tuple[object, str]] = {}
        self._down = False

    @classmethod
    def from_url(
        cls,
        url: str,
        name: str,
        failure_threshold: int = 5,
        recovery_timeout: float = 60.0,
        *,
        socket_timeout: float = 2.0,
        socket_connect_timeout: float = 1.0,
        key_prefix: str = "veronica:",
        probe_ttl_s: float | None = None,
        state_ttl_s: float = 86400.0,
        fail_open: bool | None = None,
    ) -> RedisCircuitBreaker:
        """A breaker on a new client for ``url`` (short timeouts, no retries)."""
        client = connect(url, socket_timeout, socket_connect_timeout)
        return cls(
            client,
            name,
            failure_threshold,
            recovery_timeout,
            key_prefix=key_prefix,
            probe_ttl_s=probe_ttl_s,
            state_ttl_s=state_ttl_s,
            fail_open=fail_open,
        )

    # -- RuntimePolicy ---------------------------------------------------------

    @property
    def state(self) -> CircuitState:
        """Current state; OPEN reads as HALF_OPEN once the timeout has passed."""
        reply = self._run("state", "", any_owner=False)
        return CircuitState(text(reply[0]))

    @property
    def failure_count(self) -> int:
        reply = self._run("state", "", any_owner=False)
        return int(reply[1])

    def check(self, context: PolicyContext | None = None) -> PolicyDecision:
        """Allow, or deny while OPEN or while the half-open probe is out."""
        token = os.urandom(8).hex()
        try:
            reply = self._run("check", token, any_owner=False)
        except LedgerUnavailableError as exc:
            if self._fail_open:
                return _ALLOW
            return PolicyDecision(
                False, self.policy_type, exc.trip.message, limit=self.failure_threshold
            )
        if int(reply[0]) == 1:
            if int(reply[1]) == 1 and context is not None:
                self._remember(context, token)
            return _ALLOW
        state, failures, wait_us = text(reply[1]), int(reply[2]), int(reply[3])
        return PolicyDecision(
            False,
            self.policy_type,
            f"circuit {state} after {failures} failures; next probe in {wait_us / 1e6:.1f}s",
            limit=self.failure_threshold,
            observed=failures,
        )

    def record_success(self, owner: object | None = None) -> None:
        """Feed a success. In HALF_OPEN only the probe's outcome counts.

        Args:
            owner: The call reporting (its PolicyContext); None for a caller
                that manages the breaker by hand and is the probe.
        """
        self._outcome("success", owner)

    def record_failure(self, owner: object | None = None) -> None:
        """Feed a failure. Late failures neither restart OPEN nor free the probe."""
        self._outcome("failure", owner)

    def release_probe(self, owner: object | None = None) -> None:
        """Free the half-open probe slot without an outcome (call not sent)."""
        self._outcome("release", owner)

    def on_success(self, context: PolicyContext) -> None:
        self.record_success(context)

    def on_failure(self, context: PolicyContext, error: BaseException) -> None:
        self.record_failure(context)

    def on_abandon(self, context: PolicyContext) -> None:
        self.release_probe(context)

    def reset(self) -> None:
        """Close the circuit for every process (deletes the shared state)."""
        with self._lock:
            self._owners.clear()
        token = otel_context.attach(quiet())
        try:
            self._client.delete(self.key)
        except redis.RedisError as exc:
            raise self._unavailable(exc) from exc
        finally:
            otel_context.detach(token)

    # -- plumbing ----------------------------------------------------------------

    def _outcome(self, op: str, owner: object | None) -> None:
        if owner is None:
            token, any_owner = "", True
        else:
            with self._lock:
                held = self._owners.pop(id(owner), None)
            token = held[1] if held is not None and held[0] is owner else _NOT_A_PROBE
            any_owner = False
        try:
            self._run(op, token, any_owner=any_owner)
        except LedgerUnavailableError as exc:  # the outage itself was logged once
            _logger.debug("circuit %s: %s not recorded: %s", self.name, op, exc)

    def _remember(self, owner: object, token: str) -> None:
        with self._lock:
            if len(self._owners) >= _OWNER_LIMIT:
                self._owners.pop(next(iter(self._owners)))
            self._owners[id(owner)] = (owner, token)  # held: its id stays unique

    def _run(self, op: str, token: str, *, any_owner: bool) -> Any:
        args = [op, token, "1" if any_owner else "0", *self._config]
        ctx_token = otel_context.attach(quiet())
        try:
            reply: Any = self._script([self.key], args)
        except redis.RedisError as exc:
            found = corruption(exc)
            if found is not None:
                raise found from exc
            raise self._unavailable(exc) from exc
        finally:
            otel_context.detach(ctx_token)
        if self._down:
            self._down = False
            _logger.info("circuit %s: breaker store %s reachable again", self.name, self.store)
        return reply

    def _unavailable(self, exc: redis.RedisError) -> LedgerUnavailableError:
        if not self._down:
            self._down = True
            _logger.warning(
                "circuit %s: breaker store %s unreachable (%s: %s); %s",
                self.name,
                self.store,
                type(exc).__name__,
                exc,
                "VERONICA_FAIL_OPEN: calls are let through"
                if self._fail_open
                else "failing closed: calls are denied until it answers",
            )
            pool = getattr(self._client, "connection_pool", None)
            if pool is not None:
                pool.disconnect(inuse_connections=False)
        message = (
            f"circuit {self.name}: breaker store {self.store} is unreachable "
            f"({type(exc).__name__}: {exc}); failing closed, the call was not sent "
            "(set VERONICA_FAIL_OPEN=true to let calls through)"
        )
        trip = TripEvent("circuit_open", float(self.failure_threshold), 0.0, "", message)
        return LedgerUnavailableError(trip, self.store)

    def __repr__(self) -> str:
        return f"RedisCircuitBreaker({self.name!r}, store={self.store!r})"
