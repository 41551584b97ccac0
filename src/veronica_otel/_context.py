"""ExecutionContext: the chain-scoped containment boundary.

Every call made through a context goes through :meth:`ExecutionContext.begin_call`:
deadline and cancellation first, then the policy pipeline, then one atomic
ledger reservation of the call's worst case. Only then does the call run. When
it ends, :meth:`CallHandle.finish` commits what it actually cost (reported with
``record_usage``, else what it reserved, whether it returned or raised) and
releases the rest; a call never sent is released whole (DESIGN G10).
"""

from __future__ import annotations

import inspect
import itertools
import logging
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypedDict

from opentelemetry import context as otel_context
from opentelemetry import trace

from . import _acontext, _agents
from ._agent_limits import AgentLevels, lookups_of
from ._agents import HandoffCounter, current_agent
from ._call import (
    ACTIVE_CALL,
    CallHandle,
    close_awaitable,
    is_coroutine_function,
    settled_amounts,
)
from ._chain_span import end_chain_span, open_chain_span, remaining_attributes
from ._children import carve, min_limit, weak_cancel, weak_deadline
from ._cm import AsyncFromSync, Entries
from ._config import ExecutionConfig
from ._errors import BudgetExceededError, TripEvent, TripReason
from ._gc_safe import drain, pending
from ._ledger import (
    DEFAULT_LEDGER,
    Ledger,
    LedgerState,
    Level,
    Limits,
    LocalLedger,
    PoolLevel,
    Reservation,
)
from ._options import ChainSnapshot, Decision, WrapOptions
from ._policy import ALLOW, PolicyContext, PolicyDecision, PolicyPipeline
from ._pools import BudgetPool, PoolRoom, check_pools, pool_room
from ._pricing import PriceTable, UnitPrices, default_price_table
from ._propagation import CONTEXT_KEY
from ._telemetry import record_call, track_chain
from ._timer import CancellationToken, TimerHandle, schedule
from ._trips import emit_trip
from ._units import check_count, check_usd, nano_to_usd, usd_to_nano

__all__ = ["CallHandle", "ExecutionContext"]

_DEFAULT_LEDGER = DEFAULT_LEDGER


class _PoolArgs(TypedDict, total=False):
    pools: tuple[PoolLevel, ...]


_NO_POOLS: _PoolArgs = {}
_MAX_OVERRIDE_S = 7 * 24 * 3600.0
_override_logger = logging.getLogger("veronica_otel.overrides")
_logger = logging.getLogger("veronica_otel")
# How often ensure_active() (once per stream chunk) reads a shared store for a
# trip made elsewhere: at the first chunk after _STORE_POLL_CHUNKS chunks or
# _STORE_POLL_S seconds since the last read, whichever comes first.
_STORE_POLL_CHUNKS = 16
_STORE_POLL_S = 0.25
# After a failed read, the next one waits this long (time only): a store that
# hangs stalls a stream by one socket timeout per this interval at most.
_STORE_RETRY_S = 5.0
_DEFAULT_OPTIONS = WrapOptions()
_NO_RESERVATION = Reservation("", 0, 0)
_monotonic = time.monotonic


class ExecutionContext(AsyncFromSync):
    """The chain's limits, ledger entry, pipeline and deadline.

    Args:
        config: The chain's limits (unlimited when omitted).
        pipeline: Extra policies evaluated before every call.
        chain_id: Name of the chain; contexts with the same id and ledger
            share one budget (across processes with a Redis ledger).
        ledger: Where counters live; an in-process ledger by default.
        price_table: Prices for ``model``-based reservations and usage.
        name: Shown on the chain's span.
        pools: :class:`BudgetPool` budgets every call of the chain (and of
            its children) is also reserved in, atomically with the chain's
            own; they must live on the chain's ledger. A pool's denial stops
            the chain; the pool itself never trips.

    Use it as a context manager (sync or async): entering makes it the
    active chain in the OpenTelemetry context, so instrumented clients,
    threads and tasks started inside find it with :func:`current_context`.
    """

    # The agent levels of this chain tree: made at its first agent-bound call.
    _agent_tree: AgentLevels | None = None

    def __init__(
        self,
        config: ExecutionConfig | None = None,
        pipeline: PolicyPipeline | None = None,
        *,
        chain_id: str | None = None,
        ledger: Ledger | None = None,
        price_table: PriceTable | None = None,
        name: str = "chain",
        pools: Sequence[BudgetPool] | None = None,
        _parent: ExecutionContext | None = None,
        _depth: int = 0,
    ) -> None:
        if config is not None and not isinstance(config, ExecutionConfig):
            raise TypeError(f"config must be an ExecutionConfig, got {config!r}")
        if pipeline is not None and not isinstance(pipeline, PolicyPipeline):
            raise TypeError(f"pipeline must be a PolicyPipeline, got {pipeline!r}")
        if chain_id is not None and (not isinstance(chain_id, str) or not _valid_id(chain_id)):
            raise ValueError(
                f"chain_id must be 1-128 characters of letters, digits and -_.:, got {chain_id!r}"
            )
        self.config = config if config is not None else ExecutionConfig()
        self.pipeline = pipeline if pipeline is not None else PolicyPipeline()
        self._has_policies = bool(self.pipeline)  # pipelines are immutable
        # Policies that know agents' limits by name (a policy file's [agents]).
        self._agent_lookups = lookups_of(self.pipeline)
        self.chain_id = chain_id if chain_id is not None else uuid.uuid4().hex
        self.name = name
        self.depth = check_count("depth", _depth)
        self._ledger: Ledger = ledger if ledger is not None else _DEFAULT_LEDGER
        # A ledger with coroutine operations (a shared store): async calls await it.
        self._aledger: Any = self._ledger if hasattr(self._ledger, "areserve") else None
        self._pools = check_pools(pools, self._ledger)
        self._prices = price_table
        self._parent = _parent
        self._children = itertools.count(1)
        self._started = _monotonic()
        self._trip: TripEvent | None = None
        self._partial: Any = None
        self._token = CancellationToken()
        self._entries = Entries()  # one otel token per entering thread or task
        self._span: trace.Span | None = None
        self._metrics = False
        limits = self.config
        self._path: tuple[Level, ...] = (
            *(_parent._path if _parent is not None else ()),
            Level(
                self.chain_id,
                Limits(
                    cost_nano=None
                    if limits.max_cost_usd is None
                    else usd_to_nano(limits.max_cost_usd),
                    steps=limits.max_steps,
                    retries=limits.max_retries_total,
                    tokens=limits.max_tokens,
                    repeats=limits.max_repeats,
                ),
            ),
        )
        self._priced = any(level.limits.cost_nano is not None for level in self._path) or any(
            pool.max_cost_usd is not None for pool in self._pools
        )
        self._repeats_limited = any(level.limits.repeats is not None for level in self._path)
        self._deadline = self._first_deadline(_parent)
        self._timer: TimerHandle | None = None
        if self._deadline is not None:
            self._timer = schedule(self._deadline, weak_deadline(self))
        if _parent is not None:
            _parent._token.add_callback(weak_cancel(self))
        if self._priced:
            track_chain(self)
        self._handoffs = (
            HandoffCounter(limits.max_handoffs) if limits.max_handoffs is not None else None
        )
        self._fast: tuple[LocalLedger, Level, Any] | None = None
        self._live: tuple[Any, ...] | None = None
        # Store polls for trips made elsewhere (ensure_active): chunks since, time, last ok.
        self._unpolled, self._polled_at, self._poll_ok = 0, self._started, True
        if isinstance(self._ledger, LocalLedger):
            self._hold(self._ledger)
        if limits.max_depth is not None and self.depth > limits.max_depth:
            # A joined chain too deep is born tripped: every call is denied.
            self._deny(
                "depth", limits.max_depth, self.depth, "hop depth over max_depth", raise_error=False
            )

    def _first_deadline(self, parent: ExecutionContext | None) -> float | None:
        """The earlier of this chain's own ``timeout_ms`` and its parent's deadline."""
        timeout_ms = self.config.timeout_ms
        deadline = None if timeout_ms is None else self._started + timeout_ms / 1000
        inherited = None if parent is None else parent._deadline
        if inherited is not None and (deadline is None or inherited < deadline):
            deadline = inherited
        return deadline

    def _hold(self, ledger: LocalLedger) -> None:
        ledger.acquire(self.chain_id)
        weakref.finalize(self, ledger.discard, self.chain_id)
        # The live counters of every level of the path (this chain and its
        # ancestors, each held by its own context): ensure_active reads them.
        self._live = tuple(ledger.state_of(level.chain_id) for level in self._path)
        if (
            self._parent is None
            and not self._has_policies
            and self._handoffs is None
            and not self._pools
        ):
            # Held by acquire(): the live counters outlast nothing we use.
            self._fast = (ledger, self._path[0], self._live[0])

    # -- context manager -------------------------------------------------

    def __enter__(self) -> ExecutionContext:
        span = open_chain_span(self)
        self._span = span
        if span is not None and span.is_recording():
            self._metrics = True
        ctx = otel_context.set_value(CONTEXT_KEY, self)
        if span is not None:
            ctx = trace.set_span_in_context(span, ctx)
        self._entries.push(self, otel_context.attach(ctx), span)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        token, span, last = self._entries.pop(self)
        if token is not None:
            otel_context.detach(token)  # type: ignore[arg-type]
        else:
            _logger.warning(
                "%r exited in a thread or task it was not entered in; that entry's "
                "OpenTelemetry context stays attached where it was made",
                self,
            )
        if last and self._timer is not None:
            self._timer.cancel()
        if span is not None:
            end_chain_span(self, span, exc)

    # -- paper-style wrappers --------------------------------------------

    def wrap_llm_call(self, fn: Callable[[], Any], options: WrapOptions | None = None) -> Decision:
        """Run ``fn`` as one LLM call if the chain allows it.

        Returns ``Decision.ALLOW`` after running it, ``Decision.HALT`` without
        running it. Errors raised by ``fn`` propagate unchanged (a
        ``BudgetExceededError`` from a call inside ``fn`` returns ``HALT``).

        ``fn`` is committed at what it reported with ``record_usage``, else at
        its reservation (``cost_estimate_hint`` or the priced worst case),
        whether it returned or raised: once it ran, the provider may have
        billed it (DESIGN G10). That holds for any exception, for
        ``KeyboardInterrupt`` and for a ``BudgetExceededError`` raised by an
        inner call, since ``fn`` may have sent a request before the denial.
        Only a call that never started (denied, or interrupted during a
        rate-limit wait) is released.
        """
        return self._wrap(fn, options, "llm")

    def wrap_tool_call(self, fn: Callable[[], Any], options: WrapOptions | None = None) -> Decision:
        """Run ``fn`` as one tool call if the chain allows it (see wrap_llm_call)."""
        return self._wrap(fn, options, "tool")

    async def awrap_llm_call(
        self, fn: Callable[[], Awaitable[Any]], options: WrapOptions | None = None
    ) -> Decision:
        """Coroutine version of :meth:`wrap_llm_call`; ``fn`` returns an awaitable."""
        return await self._awrap(fn, options, "llm")

    async def awrap_tool_call(
        self, fn: Callable[[], Awaitable[Any]], options: WrapOptions | None = None
    ) -> Decision:
        """Coroutine version of :meth:`wrap_tool_call`."""
        return await self._awrap(fn, options, "tool")

    def _wrap(self, fn: Callable[[], Any], options: WrapOptions | None, kind: str) -> Decision:
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        if is_coroutine_function(fn):
            raise TypeError(
                f"wrap_{kind}_call got a coroutine function {fn!r}; use awrap_{kind}_call"
            )
        fast = self._fast
        if (
            fast is not None
            and self._trip is None
            and (options is None or options.plain)
            and (self._deadline is None or _monotonic() < self._deadline)
            and not self._token.cancelled
            and not self._metrics
            and not pending
            and not _agents._limited_in_code
        ):
            # The common case, kept short: an in-process root chain with no
            # policies. Same checks as begin_call; any denial re-checks the
            # general way inside reserve_one.
            ledger, level, state = fast
            cost, tokens = (
                (0, 0) if options is None else (options.hint_nano, options.reserved_tokens)
            )
            reservation = ledger.reserve_one(level, state, cost, tokens)
            if type(reservation) is not Reservation:
                self._tripped(reservation, raise_error=False)  # type: ignore[arg-type]
                return Decision.HALT
            call = CallHandle(self, reservation, None, ALLOW)
        else:
            fast = None
            try:
                call = self.begin_call(kind, options)
            except BudgetExceededError:
                return Decision.HALT
            if call.decision.rate_limit_ms:
                _wait(call)
        active = ACTIVE_CALL.set(call)
        try:
            result = fn()
        except BudgetExceededError as exc:
            call.finish(exc)
            return Decision.HALT
        except BaseException as exc:
            call.finish(exc)
            raise
        finally:
            ACTIVE_CALL.reset(active)
        if result is not None and inspect.isawaitable(result):
            call.finish(TypeError("awaitable"), sent=False)
            close_awaitable(result)
            raise TypeError(f"wrap_{kind}_call got an awaitable from {fn!r}; use awrap_{kind}_call")
        self._partial = result
        call._done = True  # settled here, one frame less on the hot path
        if fast is None:
            self._finish(call, None, True)
            return Decision.ALLOW
        reservation = call.reservation
        if call.cost_nano >= 0 or call.tokens >= 0:
            cost, tokens = max(call.cost_nano, 0), max(call.tokens, 0)
        else:
            cost, tokens = reservation.cost_nano, reservation.tokens
        overrun = fast[0].commit_one(fast[1], fast[2], reservation, cost, tokens)
        if overrun is not None:
            self._trip = overrun
            emit_trip(overrun, remaining=remaining_attributes(self))
        return Decision.ALLOW

    async def _awrap(
        self, fn: Callable[[], Awaitable[Any]], options: WrapOptions | None, kind: str
    ) -> Decision:
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        try:
            call = await self.abegin_call(kind, options)
        except BudgetExceededError:
            return Decision.HALT
        if call.decision.rate_limit_ms:
            import asyncio  # only rate-limited async calls need it; it is slow to import

            try:
                await asyncio.sleep(call.decision.rate_limit_ms / 1000)
            except BaseException:  # cancelled while waiting: nothing was sent
                await call.afinish(sent=False)
                raise
        active = ACTIVE_CALL.set(call)
        try:
            result = await fn()
        except BudgetExceededError as exc:
            await call.afinish(exc)
            return Decision.HALT
        except BaseException as exc:
            await call.afinish(exc)
            raise
        finally:
            ACTIVE_CALL.reset(active)
        self._partial = result
        await call.afinish()
        return Decision.ALLOW

    # -- the check before each call ----------------------------------------

    def begin_call(
        self,
        kind: str = "llm",
        options: WrapOptions | None = None,
        *,
        cost_nano: int | None = None,
    ) -> CallHandle:
        """Admit one call or raise :class:`BudgetExceededError`.

        Runs the deadline, the pipeline and one atomic ledger reservation.
        ``cost_nano`` overrides the reservation computed from ``options``
        (instrumentors pass their own worst case). The caller must call
        ``finish()`` on the returned handle.
        """
        if options is None:
            options = _DEFAULT_OPTIONS
        if cost_nano is None:
            cost_nano = self._cost_of(options)
        return self.begin_priced_call(
            kind,
            options.operation_name,
            options.provider,
            options.model,
            cost_nano,
            options.reserved_tokens,
            retry=options.retry,
            signature=options.signature,
        )

    def begin_priced_call(
        self,
        kind: str,
        operation_name: str,
        provider: str | None,
        model: str | None,
        cost_nano: int,
        tokens: int,
        *,
        retry: bool = False,
        signature: str | None = None,
    ) -> CallHandle:
        """:meth:`begin_call` for instrumentors that already priced the call.

        ``cost_nano`` and ``tokens`` are the call's worst case in ledger units
        (non-negative ints, validated by the caller): no options object is
        built on the hot path of every instrumented call.
        """
        if pending:
            drain()  # settle what garbage collection left, outside any lock
        if self._trip is not None and not self._trip_lifted():
            raise BudgetExceededError(self._trip)
        policy_context, decision = self._admit_checks(
            kind, operation_name, provider, model, cost_nano, signature
        )
        agents = self._agent_path() if self._agent_lookups or _agents._limited_in_code else None
        fast = self._fast
        try:
            if agents is not None:
                reservation = self._ledger.reserve(
                    agents[0],
                    cost_nano,
                    tokens,
                    retry=retry,
                    signature=signature,
                    **self._pool_args(),
                )
            elif fast is not None and signature is None and not retry:
                reservation = fast[0].reserve_one(fast[1], fast[2], cost_nano, tokens)
            else:
                reservation = self._ledger.reserve(
                    self._path,
                    cost_nano,
                    tokens,
                    retry=retry,
                    signature=signature,
                    **self._pool_args(),
                )
        except BaseException:  # the store failed: give back what policies took
            if policy_context is not None:
                self.pipeline.abandon(policy_context)
            raise
        return self._admitted(reservation, policy_context, decision, kind, model, agents)

    # Shared by begin_priced_call and the async abegin_priced_call (_acontext.py).

    def _admit_checks(
        self,
        kind: str,
        operation_name: str,
        provider: str | None,
        model: str | None,
        cost_nano: int,
        signature: str | None,
    ) -> tuple[PolicyContext | None, PolicyDecision]:
        """Deadline, cancellation, handoffs and the pipeline, before the reservation."""
        if self._deadline is not None and _monotonic() >= self._deadline:
            self._deny_timeout()
        if self._token.cancelled:
            self._deny_timeout()
        if self._handoffs is not None:
            self._check_handoff(self._handoffs)
        policy_context: PolicyContext | None = None
        decision = ALLOW
        if self._has_policies:
            policy_context = PolicyContext(
                chain_id=self.chain_id,
                kind=kind,
                operation_name=operation_name,
                provider=provider,
                model=model,
                estimated_cost_usd=nano_to_usd(cost_nano),
                signature=signature,
            )
            try:
                decision = self.pipeline.evaluate(policy_context)
            except BaseException:  # a policy raised: free the probes the earlier ones took
                self.pipeline.abandon(policy_context)
                raise
            if not decision.allowed:
                self._deny_policy(decision)
        return policy_context, decision

    def _admitted(
        self,
        reservation: Reservation | TripEvent,
        policy_context: PolicyContext | None,
        decision: PolicyDecision,
        kind: str,
        model: str | None,
        agents: tuple[tuple[Level, ...], str] | None,
    ) -> CallHandle:
        """The call's handle, or the denial raised (its policy probes given back;
        an agent's own level denied it: that agent's denial, the chain goes on)."""
        if type(reservation) is not Reservation:
            if policy_context is not None:
                self.pipeline.abandon(policy_context)
            if agents is not None:
                self._agent_denied(reservation)  # type: ignore[arg-type]
            self._tripped(reservation)  # type: ignore[arg-type]
        call = CallHandle(self, reservation, policy_context, decision)  # type: ignore[arg-type]
        if agents is not None:
            call.agents = agents
        if self._metrics:
            call.metrics = True
            call.kind = kind
            call.model = model
        return call

    def _agent_path(self) -> tuple[tuple[Level, ...], str] | None:
        """This call's path with the levels of the limited agents it is made for."""
        tree = self._agent_tree
        if tree is None:
            root = self
            while root._parent is not None:
                root = root._parent
            # One tree per root, also when threads race here (setdefault is atomic).
            tree = root.__dict__.get("_agent_tree") or root.__dict__.setdefault(
                "_agent_tree", AgentLevels(root)
            )
            self._agent_tree = tree
        return tree.path(self._path, self._agent_lookups)

    def _agent_denied(self, trip: TripEvent, *, raise_error: bool = True) -> bool:
        """Deny for an agent whose own level made ``trip``; the chain goes on.

        Returns False (nothing done) when ``trip`` is not an agent's."""
        tree = self._agent_tree
        mapped = tree.denial(trip, self.chain_id) if tree is not None else None
        if mapped is None:
            return False
        event, news = mapped
        if news:
            emit_trip(event)
        if raise_error:
            raise BudgetExceededError(event)
        return True

    # -- the same for async code (_acontext.py): a shared store is awaited ----

    async def abegin_call(
        self, kind: str = "llm", options: WrapOptions | None = None, *, cost_nano: int | None = None
    ) -> CallHandle:
        """:meth:`begin_call` for async code: the reservation never blocks the
        event loop. Settle the handle with ``await handle.afinish(...)``."""
        if self._aledger is None:  # in process: nothing to await
            return self.begin_call(kind, options, cost_nano=cost_nano)
        return await _acontext.begin_call(self, kind, options, cost_nano)

    async def abegin_priced_call(
        self,
        kind: str,
        operation_name: str,
        provider: str | None,
        model: str | None,
        cost_nano: int,
        tokens: int,
        *,
        retry: bool = False,
        signature: str | None = None,
    ) -> CallHandle:
        """:meth:`begin_priced_call` for async code (same checks, same denials)."""
        return await _acontext.begin_priced_call(
            self, kind, operation_name, provider, model, cost_nano, tokens, retry, signature
        )

    async def asnapshots(self) -> dict[str, LedgerState] | None:
        """The counters of every level with a cost, step or token ceiling, read
        without blocking; None with an in-process ledger (read it directly)."""
        return await _acontext.snapshots(self)

    async def _afinish(self, call: CallHandle, error: BaseException | None, sent: bool) -> None:
        await _acontext.finish(self, call, error, sent)

    def _check_handoff(self, counter: HandoffCounter) -> None:
        name = current_agent()
        if name is None:
            return
        over = counter.observe(name)
        if over is not None:
            last, now, count = over
            self._deny(
                "loop",
                counter.limit,
                count,
                f"agents {last!r} and {now!r} handed control back and forth {count} times "
                f"(max_handoffs={counter.limit})",
            )

    def _trip_lifted(self) -> bool:
        """Whether a logged override (maybe from another process) lifted our trip."""
        trip = self._trip
        if trip is None or trip.reason == "timeout":
            return trip is None  # a deadline is not lifted by a budget override
        # Only an explicit override lifts a trip: a store that lost the chain
        # (restart, flush, eviction) shows no trip but lifted nothing.
        lifted = getattr(self._ledger, "trip_lifted", None)
        if lifted is not None:
            if not lifted(trip.chain_id):
                return False
        elif self._ledger.snapshot(trip.chain_id).trip is not None:
            return False  # an in-process ledger removes a trip only by override
        return self._lift(trip)

    def _lift(self, trip: TripEvent) -> bool:
        self._trip = None
        try:
            span = trace.get_current_span()
            if span.is_recording():
                span.add_event(
                    "veronica.override.applied",
                    {"veronica.chain.id": trip.chain_id, "veronica.trip.reason": trip.reason},
                )
        except Exception:
            _override_logger.exception("recording an override on the span failed")
        return True

    def override(
        self,
        reason: str,
        duration_s: float,
        *,
        add_usd: float = 0.0,
        add_steps: int = 0,
    ) -> TripEvent | None:
        """Lift this chain's sticky trip for ``duration_s`` seconds: the only way past one.

        Requires a reason; is logged on ``veronica_otel.overrides`` and shown
        as a ``veronica.override`` span event; widens the cost or step ceiling
        by ``add_usd`` / ``add_steps`` until it expires by itself.
        Returns the trip that was lifted, if any.
        """
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError("override needs a reason (a non-empty string)")
        duration = check_usd("duration_s", duration_s)  # finite, >= 0, not absurd
        if duration <= 0 or duration > _MAX_OVERRIDE_S:
            raise ValueError(
                f"duration_s must be in (0, {_MAX_OVERRIDE_S}] seconds, got {duration_s!r}"
            )
        extra_cost = usd_to_nano(check_usd("add_usd", add_usd))
        extra_steps = check_count("add_steps", add_steps)
        apply = getattr(self._ledger, "override", None)
        if apply is None:
            raise TypeError(f"ledger {self._ledger!r} does not support overrides")
        expires_at = time.time() + duration
        lifted: TripEvent | None = apply(
            self.chain_id, expires_at=expires_at, add_cost_nano=extra_cost, add_steps=extra_steps
        )
        self._trip = None
        attributes: dict[str, str | float | int] = {
            "veronica.chain.id": self.chain_id,
            "veronica.override.reason": reason,
            "veronica.override.duration_s": duration,
            "veronica.override.add_usd": nano_to_usd(extra_cost),
            "veronica.override.add_steps": extra_steps,
            "veronica.trip.reason": lifted.reason if lifted else "",
        }
        _override_logger.warning(
            "override chain=%s reason=%r duration=%gs add_usd=%g add_steps=%d lifted=%s",
            self.chain_id,
            reason,
            duration,
            nano_to_usd(extra_cost),
            extra_steps,
            lifted.reason if lifted else "none",
        )
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event("veronica.override", attributes)
        return lifted

    def ensure_active(self, *, poll: bool = True) -> None:
        """Raise BudgetExceededError if the chain has tripped or its deadline passed.

        Streams call this per chunk, so a trip reaches work in flight (G5, G10):

        * In-process (a :class:`LocalLedger`): every chunk. A stream is cut at
          its next chunk after the deadline, a cancellation, or a trip of this
          chain or any ancestor, wherever in the process it happened (a few
          attribute reads: no lock, no allocation).
        * A shared store (Redis/Valkey): this process's own trips of the chain
          and its ancestors every chunk as above; a trip made in another
          process is read from the store at the first chunk after 16 chunks
          or 250 ms since the last read (``_STORE_POLL_CHUNKS``,
          ``_STORE_POLL_S``; one ``snapshot`` a level of the path). A store
          that cannot be read then does not cut the stream (it is already
          paid for; the next call fails closed on its reservation): the
          failure is logged once, and the store is read again only every
          5 s (``_STORE_RETRY_S``) until it answers.

        ``poll=False`` leaves the store read to :meth:`aensure_active` (an
        async stream's own check, which awaits it).
        """
        if self._poll_due() and poll:
            self._poll_store()

    async def aensure_active(self) -> None:
        """:meth:`ensure_active` for async streams: a due store read is awaited."""
        if self._poll_due():
            if self._aledger is None:
                self._poll_store()
                return
            self._polled()
            try:
                trips = [(await self._aledger.asnapshot(lv.chain_id)).trip for lv in self._path]
            except Exception:
                self._poll_failed()
                return
            self._poll_read(trips)

    def _poll_due(self) -> bool:
        """The checks of :meth:`ensure_active`; True when the store is due a read."""
        if self._trip is not None and not self._trip_lifted():
            raise BudgetExceededError(self._trip)
        if (self._deadline is not None and _monotonic() >= self._deadline) or (
            self._token.cancelled
        ):
            self._deny_timeout()
        live = self._live
        if live is not None:
            trip = live[0].trip  # the root level: a root chain's only one, no loop
            if trip is None and self._parent is not None:
                for state in live:
                    trip = state.trip
                    if trip is not None:
                        break
            if trip is not None:
                self._tripped(trip)
            return False
        parent = self._parent
        while parent is not None:
            if parent._trip is not None:
                self._tripped(parent._trip)
            parent = parent._parent
        self._unpolled += 1
        polled_at = self._polled_at
        return self._unpolled >= _STORE_POLL_CHUNKS or _monotonic() - polled_at >= _STORE_POLL_S

    def _poll_store(self) -> None:
        """Read the path's trips from the shared store (see :meth:`ensure_active`)."""
        self._polled()
        try:
            trips = [self._ledger.snapshot(level.chain_id).trip for level in self._path]
        except Exception:
            self._poll_failed()
            return
        self._poll_read(trips)

    def _polled(self) -> None:
        self._unpolled = 0
        self._polled_at = _monotonic()

    def _poll_failed(self) -> None:
        if self._poll_ok:  # once per outage, not once per poll
            _logger.warning(
                "chain %s: could not read the store for trips while a call is in "
                "flight; the call goes on, the next one is checked when it starts",
                self.chain_id,
                exc_info=True,
            )
        self._poll_ok = False
        self._unpolled = -(1 << 62)  # chunks alone no longer trigger a read
        self._polled_at += _STORE_RETRY_S - _STORE_POLL_S

    def _poll_read(self, trips: list[TripEvent | None]) -> None:
        self._poll_ok = True
        for trip in trips:
            if trip is not None:
                self._tripped(trip)

    @property
    def tracks_handoffs(self) -> bool:
        """Whether the chain limits handoffs between agents (``max_handoffs``)."""
        return self._handoffs is not None

    @property
    def names_agents(self) -> bool:
        """Whether a call's span should name its agent (``gen_ai.agent.name``):
        the chain counts handoffs or some agent has limits of its own."""
        return self._handoffs is not None or bool(self._agent_lookups) or _agents._limited_in_code

    @property
    def tracks_repeats(self) -> bool:
        """Whether any level of the chain limits repeated call signatures."""
        return self._repeats_limited

    def remaining_tokens(
        self, states: Mapping[str, LedgerState] | None = None, *, pools: bool = True
    ) -> int | None:
        """What the tightest token ceiling on the path (and, with ``pools``, in the
        chain's pools) has left unreserved, or None (the path's counters from
        ``states``, :meth:`asnapshots`, when given)."""
        remaining: int | None = None
        for level in self._path:
            if level.limits.tokens is None:
                continue
            state = (
                self._ledger.snapshot(level.chain_id) if states is None else states[level.chain_id]
            )
            left = max(0, level.limits.tokens - state.tokens - state.reserved_tokens)
            remaining = left if remaining is None else min(remaining, left)
        if pools and self._pools:
            remaining = min_limit(remaining, pool_room(self._pools).tokens)
        return remaining

    def prices_for(self, provider: str | None, model: str) -> UnitPrices | None:
        """Unit prices for a model; denies (reason ``cost``) an unknown model under
        a cost ceiling. Returns None when the chain has no cost ceiling and the
        model has no price (usage is then counted in tokens only)."""
        table = self._prices if self._prices is not None else default_price_table()
        prices = table.lookup(provider, model)
        if prices is None and self._priced:
            self._lookup(provider, model)
        return prices

    @property
    def awaits_store(self) -> bool:
        """Whether async calls await the ledger (a shared store; in process, never)."""
        return self._aledger is not None

    @property
    def has_cost_ceiling(self) -> bool:
        return self._priced

    def consume_retry(self) -> None:
        """Draw one retry from ``max_retries_total`` or raise BudgetExceededError."""
        if self._trip is not None:
            raise BudgetExceededError(self._trip)
        agents = self._agent_path() if self._agent_lookups or _agents._limited_in_code else None
        path = self._path if agents is None else agents[0]
        result = self._ledger.reserve(path, 0, 0, step=False, retry=True)
        if type(result) is not Reservation:
            if agents is not None:
                self._agent_denied(result)  # type: ignore[arg-type]
            self._tripped(result)  # type: ignore[arg-type]

    def _cost_of(self, options: WrapOptions) -> int:
        """What a call described by ``options`` reserves (its hint, else its worst case)."""
        cost_nano = options.hint_nano
        if options.model is not None and self._priced and cost_nano == 0:
            cost_nano = self._worst_case(options)
        return cost_nano

    async def aconsume_retry(self) -> None:
        """:meth:`consume_retry` for async code: a shared store is awaited."""
        await _acontext.consume_retry(self)

    def _worst_case(self, options: WrapOptions) -> int:
        prices = self._lookup(options.provider, options.model)
        return prices.max_cost_nano(options.input_tokens or 0, options.max_tokens or 0)

    def _lookup(self, provider: str | None, model: str | None) -> UnitPrices:
        table = self._prices if self._prices is not None else default_price_table()
        prices = table.lookup(provider, model) if model is not None else None
        if prices is None:
            self._deny(
                "cost",
                self.config.max_cost_usd or 0.0,
                float("inf"),
                f"no known price for model {model!r} (provider {provider!r}); a model "
                "with no price is never free: map the name to a priced model "
                '(VERONICA_MODEL_ALIASES="name=gpt-4o", or [models] "name" = "gpt-4o" '
                'in the policy file), price it ([prices."name"] in the policy file or '
                "a price_table), or set VERONICA_UNKNOWN_MODEL_PRICE",
                sticky=False,
            )
        return prices  # type: ignore[return-value]

    def _finish(self, call: CallHandle, error: BaseException | None, sent: bool) -> None:
        reservation = call.reservation
        agents = call.agents
        path = self._path if agents is None else agents[0]
        if not sent:
            try:
                self._ledger.release(path, reservation)
            finally:
                self._released(call)
            return
        cost, tokens = settled_amounts(call)
        fast = self._fast
        if fast is not None and agents is None:
            overrun = fast[0].commit_one(fast[1], fast[2], reservation, cost, tokens)
        else:
            overrun = self._ledger.commit(path, reservation, cost, tokens)
        self._finished(call, error, cost, overrun)

    def _released(self, call: CallHandle) -> None:
        if call.policy_context is not None:
            self.pipeline.abandon(call.policy_context)

    def _finished(
        self, call: CallHandle, error: BaseException | None, cost: int, overrun: TripEvent | None
    ) -> None:
        """What follows a commit: metrics, the pipeline's outcome, an overrun's trip
        (an agent's own level overran: that agent's, not the chain's)."""
        if call.metrics:
            record_call(call.kind, nano_to_usd(cost), error is not None, call.model)
        if call.policy_context is not None:
            call.policy_context.actual_cost_usd = nano_to_usd(cost)
            if error is None:
                self.pipeline.record_success(call.policy_context)
            elif isinstance(error, BudgetExceededError) or not isinstance(error, Exception):
                # Our own denial, a cancellation or KeyboardInterrupt says nothing
                # about the endpoint's health: free the probe, count no failure.
                self.pipeline.abandon(call.policy_context)
            else:
                self.pipeline.record_failure(call.policy_context, error)
        if overrun is not None and not (
            call.agents is not None and self._agent_denied(overrun, raise_error=False)
        ):
            self._trip = overrun
            emit_trip(overrun, remaining=remaining_attributes(self))

    # -- usage -------------------------------------------------------------

    def record_usage(
        self,
        *,
        cost_usd: float | None = None,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cached_input_tokens: int = 0,
        reasoning_tokens: int = 0,
        model: str | None = None,
        provider: str | None = None,
    ) -> None:
        """Report what the running call actually used.

        ``input_tokens`` includes cached ones and ``output_tokens`` includes
        reasoning ones (the OpenAI convention). Without ``cost_usd`` the cost
        is priced from ``model``; a model with no known price is never free,
        so under a cost ceiling it trips the chain. Outside a wrapped call the
        usage is committed to the chain directly.
        """
        for name, value in (
            ("input_tokens", input_tokens),
            ("output_tokens", output_tokens),
            ("cached_input_tokens", cached_input_tokens),
            ("reasoning_tokens", reasoning_tokens),
        ):
            check_count(name, value)
        if cached_input_tokens > input_tokens:
            raise ValueError(
                f"cached_input_tokens ({cached_input_tokens}) cannot exceed "
                f"input_tokens ({input_tokens})"
            )
        if reasoning_tokens > output_tokens:
            raise ValueError(
                f"reasoning_tokens ({reasoning_tokens}) cannot exceed "
                f"output_tokens ({output_tokens})"
            )
        if cost_usd is not None:
            cost_nano = usd_to_nano(check_usd("cost_usd", cost_usd))
        elif model is not None:
            cost_nano = self._price_usage(
                provider, model, input_tokens, output_tokens, cached_input_tokens, reasoning_tokens
            )
        else:
            cost_nano = 0
        tokens = input_tokens + output_tokens
        call = ACTIVE_CALL.get()
        if call is not None and call.context is self:
            call.add_usage(cost_nano, tokens)
            return
        held = _NO_RESERVATION
        if self._pools:  # the chain's pools count it too
            held = Reservation("", 0, 0, pools=self._pool_args()["pools"])
        agents = self._agent_path() if self._agent_lookups or _agents._limited_in_code else None
        path = self._path if agents is None else agents[0]
        overrun = self._ledger.commit(path, held, cost_nano, tokens)
        if overrun is not None and not (
            agents is not None and self._agent_denied(overrun, raise_error=False)
        ):
            self._tripped(overrun, raise_error=False)

    def _price_usage(
        self,
        provider: str | None,
        model: str,
        input_tokens: int,
        output_tokens: int,
        cached: int,
        reasoning: int,
    ) -> int:
        table = self._prices if self._prices is not None else default_price_table()
        prices = table.lookup(provider, model)
        if prices is not None:
            return prices.cost_nano(input_tokens, output_tokens, cached, reasoning)
        if self._priced:
            self._deny(
                "cost",
                self.config.max_cost_usd or 0.0,
                float("inf"),
                f"usage reported for model {model!r} with no known price; the chain is "
                "stopped because its spend can no longer be counted",
                raise_error=False,
            )
        return 0

    # -- children, state ----------------------------------------------------

    def spawn_child(
        self,
        config: ExecutionConfig | None = None,
        pipeline: PolicyPipeline | None = None,
        *,
        name: str = "agent",
    ) -> ExecutionContext:
        """Make a sub-agent's context.

        Its limits are its own ``config`` capped by what this chain has left
        now; every call it makes is also charged to this chain, so it can never
        spend more than its parent has left, and a trip here stops it.
        Raises BudgetExceededError (reason ``depth``) past ``max_depth``.
        """
        if self._trip is not None:
            raise BudgetExceededError(self._trip)
        depth = self.depth + 1
        max_depth = min_limit(self.config.max_depth, config.max_depth if config else None)
        if max_depth is not None and depth > max_depth:
            self._deny("depth", max_depth, depth, f"sub-agent depth {depth} over max_depth")
        carved = carve(
            config or ExecutionConfig(), self.config, self._ledger.snapshot(self.chain_id)
        )
        carved = ExecutionConfig(
            max_cost_usd=carved.max_cost_usd,
            max_steps=carved.max_steps,
            max_retries_total=carved.max_retries_total,
            timeout_ms=carved.timeout_ms,
            max_tokens=carved.max_tokens,
            max_repeats=carved.max_repeats,
            max_depth=max_depth,
            max_handoffs=carved.max_handoffs,
        )
        return ExecutionContext(
            carved,
            pipeline if pipeline is not None else self.pipeline,
            chain_id=f"{self.chain_id}.{next(self._children)}",
            ledger=self._ledger,
            price_table=self._prices,
            name=name,
            pools=self._pools,
            _parent=self,
            _depth=depth,
        )

    @property
    def parent(self) -> ExecutionContext | None:
        return self._parent

    @property
    def trip(self) -> TripEvent | None:
        """The sticky trip of this chain or the nearest tripped ancestor."""
        if self._trip is not None:
            return self._trip
        for level in reversed(self._path):
            trip = self._ledger.snapshot(level.chain_id).trip
            if trip is not None:
                return trip
        return None

    async def atrip(self) -> TripEvent | None:
        """:attr:`trip` for async code: a shared store is read without blocking."""
        return await _acontext.trip(self)

    @property
    def aborted(self) -> bool:
        return self.trip is not None

    def snapshot(self) -> ChainSnapshot:
        """A frozen view of this chain's counters."""
        if pending:
            drain()
        state = self._ledger.snapshot(self.chain_id)
        trip = self.trip
        return ChainSnapshot(
            chain_id=self.chain_id,
            cost_usd=nano_to_usd(state.cost_nano),
            steps=state.steps,
            retries=state.retries,
            tokens=state.tokens,
            elapsed_ms=(_monotonic() - self._started) * 1000,
            aborted=trip is not None,
            trip=trip,
            reserved_usd=nano_to_usd(state.reserved_nano),
            depth=self.depth,
        )

    def remaining_cost_and_steps(
        self, states: Mapping[str, LedgerState] | None = None
    ) -> tuple[int | None, int | None]:
        """What the tightest cost and step ceilings have left (one ledger read a
        level, or ``states`` from :meth:`asnapshots`)."""
        fast = self._fast
        if fast is not None:  # a root in-process chain: read the live counters
            limits, state = fast[1].limits, fast[2]
            return (
                None
                if limits.cost_nano is None
                else max(0, limits.cost_nano - state.cost_nano - state.reserved_nano),
                None if limits.steps is None else max(0, limits.steps - state.steps),
            )
        cost_left: int | None = None
        steps_left: int | None = None
        for level in self._path:
            limits = level.limits
            if limits.cost_nano is None and limits.steps is None:
                continue
            state = (
                self._ledger.snapshot(level.chain_id) if states is None else states[level.chain_id]
            )
            if limits.cost_nano is not None:
                left = max(0, limits.cost_nano - state.cost_nano - state.reserved_nano)
                cost_left = left if cost_left is None else min(cost_left, left)
            if limits.steps is not None:
                steps = max(0, limits.steps - state.steps)
                steps_left = steps if steps_left is None else min(steps_left, steps)
        if self._pools:
            room = pool_room(self._pools)
            cost_left = min_limit(cost_left, room.cost_nano)
            steps_left = min_limit(steps_left, room.steps)
        return cost_left, steps_left

    def remaining_cost_nano(
        self, states: Mapping[str, LedgerState] | None = None, *, pools: bool = True
    ) -> int | None:
        """What the tightest cost ceiling on the path (and, with ``pools``, in the
        chain's pools) has left unreserved, or None (the path's counters from
        ``states``, :meth:`asnapshots`, when given)."""
        remaining: int | None = None
        for level in self._path:
            if level.limits.cost_nano is None:
                continue
            state = (
                self._ledger.snapshot(level.chain_id) if states is None else states[level.chain_id]
            )
            left = max(0, level.limits.cost_nano - state.cost_nano - state.reserved_nano)
            remaining = left if remaining is None else min(remaining, left)
        if pools and self._pools:
            remaining = min_limit(remaining, pool_room(self._pools).cost_nano)
        return remaining

    def pool_room(self) -> PoolRoom | None:
        """What the chain's pools have left unreserved; None for a chain with no pools."""
        return pool_room(self._pools) if self._pools else None

    @property
    def pools(self) -> tuple[BudgetPool, ...]:
        """The budget pools every call of the chain is also reserved in."""
        return self._pools

    def _pool_args(self) -> _PoolArgs:
        """``pools=`` for a ledger reservation: each pool's current level (new
        limits apply from the next call). Empty for a chain with no pools, so
        a ledger that knows no pools is called as before."""
        if not self._pools:
            return _NO_POOLS
        return {"pools": tuple([pool.level for pool in self._pools])}

    def get_partial_result(self) -> Any:
        """The last result of a wrapped call, or text received before a cut."""
        return self._partial

    def set_partial_result(self, value: Any) -> None:
        """Keep ``value`` as the partial result (streams call this as they go)."""
        self._partial = value

    @property
    def cancellation(self) -> CancellationToken:
        return self._token

    def cancel(self) -> None:
        """Stop the chain now: later calls are denied with reason ``timeout``."""
        if self._token.cancel():
            self._trip_now("timeout", 0, self._elapsed_ms(), "chain cancelled")

    # -- trips ---------------------------------------------------------------

    def _elapsed_ms(self) -> float:
        return (_monotonic() - self._started) * 1000

    def _deny_timeout(self) -> None:
        if self._token.cancelled and self._trip is None:
            trip = self.trip
            if trip is not None:
                raise BudgetExceededError(trip)
        limit = float(self.config.timeout_ms or 0)
        self._deny("timeout", limit, self._elapsed_ms(), "wall-clock deadline passed")

    def _on_deadline(self) -> None:
        try:
            if self._trip is None:
                self._trip_now(
                    "timeout", float(self.config.timeout_ms or 0), self._elapsed_ms(), "deadline"
                )
        finally:
            self._token.cancel()  # streams are cut even if the store is unreachable

    def _trip_now(self, reason: TripReason, limit: float, observed: float, what: str) -> TripEvent:
        event = TripEvent(
            reason, float(limit), float(observed), self.chain_id, f"chain {self.chain_id}: {what}"
        )
        self._trip = self._ledger.trip(self.chain_id, event)
        return self._trip

    def _deny(
        self,
        reason: TripReason,
        limit: float,
        observed: float,
        what: str,
        *,
        sticky: bool = True,
        raise_error: bool = True,
    ) -> None:
        if sticky:
            trip = self._trip_now(reason, limit, observed, what)
        else:
            trip = TripEvent(
                reason,
                float(limit),
                float(observed),
                self.chain_id,
                f"chain {self.chain_id}: {what}",
            )
        emit_trip(trip, remaining=remaining_attributes(self))
        if raise_error:
            raise BudgetExceededError(trip)

    def _deny_policy(self, decision: PolicyDecision) -> None:
        trip = TripEvent(
            decision.trip_reason or "cost",
            decision.limit,
            decision.observed,
            self.chain_id,
            f"chain {self.chain_id}: {decision.policy_type} denied: {decision.reason}",
        )
        if decision.partial_result is not None:
            self._partial = decision.partial_result
        emit_trip(trip, remaining=remaining_attributes(self))
        raise BudgetExceededError(trip)

    def _tripped(self, trip: TripEvent, *, raise_error: bool = True) -> None:
        if trip.pool is not None and trip.sticky and trip.chain_id == self.chain_id:
            # A pool never trips; the chain it denied does (stored, so it is
            # sticky for every context of the chain, children included).
            trip = self._ledger.trip(self.chain_id, trip)
        if not trip.sticky:  # only in-flight reservations denied it: deny, remember nothing
            emit_trip(trip, remaining=remaining_attributes(self))
        elif trip.chain_id == self.chain_id or self._trip is None:
            first = self._trip is None
            self._trip = trip
            if first:
                emit_trip(trip, remaining=remaining_attributes(self))
        if raise_error:
            raise BudgetExceededError(trip)

    def __repr__(self) -> str:
        return f"ExecutionContext(chain_id={self.chain_id!r}, depth={self.depth})"


def _wait(call: CallHandle) -> None:
    """A rate-limit degradation's wait before a sync call is sent."""
    try:
        time.sleep(call.decision.rate_limit_ms / 1000)
    except BaseException:  # KeyboardInterrupt while waiting: nothing was sent
        call.finish(sent=False)
        raise


def _valid_id(chain_id: str) -> bool:
    return (
        0 < len(chain_id) <= 128
        and all(c.isalnum() or c in "-_.:" for c in chain_id)
        and chain_id.isascii()
    )
