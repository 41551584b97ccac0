"""ExecutionContext: the chain-scoped containment boundary.

Every call made through a context goes through its admission: deadline and
cancellation first, then the policy pipeline, then one atomic ledger
reservation of the call's worst case. Only then does the call run. When it
ends, :meth:`CallHandle.finish` commits what it actually cost (reported with
``record_usage``, else what it reserved, whether it returned or raised) and
releases the rest; a call never sent is released whole (DESIGN G10).

:class:`ExecutionContext` is a front (lifecycle, children, the public methods)
over parts it holds, each made with what it uses and readable alone:

* :class:`~._chain_state.ChainState`: limits, the path of ledger levels, snapshots;
* :class:`~._chain_trips.ChainTrips`: denials, the sticky trip, overrides;
* :class:`~._chain_poll.ChainPolling`: ``ensure_active``, trips reaching work in flight;
* :class:`~._admission.Admission`: one answer per call (``admit_call``,
  ``begin_priced_call``);
* :class:`~._settlement.Settlement`: commit or release, per call (every
  :class:`CallHandle` settles there);
and the ``wrap_*`` API (``_wrap``) runs a callable as one call through the
admission and settlement parts.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from . import _chain_poll, _wrap
from ._admission import Admission
from ._call import CallHandle
from ._chain_poll import ChainPolling
from ._chain_span import aend_chain_span, end_chain_span, open_chain_span
from ._chain_state import ChainState
from ._chain_trips import ChainTrips
from ._children import carve, min_limit, weak_cancel, weak_deadline
from ._cm import Entries
from ._config import ExecutionConfig
from ._errors import BudgetExceededError, TripEvent
from ._ledger import DEFAULT_LEDGER, Ledger, LedgerState
from ._limits import GRANT_MARK
from ._options import ChainSnapshot, WrapOptions
from ._policy import PolicyPipeline
from ._pools import BudgetPool, PoolRoom, check_pools
from ._pricing import PriceTable, UnitPrices
from ._settlement import Settlement
from ._timer import CancellationToken, schedule
from ._units import check_count

if TYPE_CHECKING:
    from ._breaker import CircuitBreaker
    from ._call_spec import Admitted, CallSpec
    from ._clamp import OutputClamp

__all__ = ["CONTEXT_KEY", "CallHandle", "ExecutionContext"]

# Where the active chain lives in the OpenTelemetry context (see _propagation).
CONTEXT_KEY = otel_context.create_key("veronica-otel-execution-context")

_DEFAULT_LEDGER = DEFAULT_LEDGER


_logger = logging.getLogger("veronica_otel")


class ExecutionContext:
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
        detached: ``True`` makes an independent chain even when made inside
            another one. By default a context made while another chain is
            active is that chain's child, as :meth:`spawn_child` makes it:
            its limits are capped by what the enclosing chain has left, every
            call is charged to both, and the enclosing chain's trip stops it.
            It shares the enclosing chain's ledger (another ``ledger`` is a
            ``ValueError`` unless detached), pipeline and price table unless
            given, and its pools as well as its own. A ``chain_id`` already
            on the enclosing chain's path names that chain itself, not a
            child. A context made outside every chain cannot be entered
            inside one (``RuntimeError``) unless it is detached.

    Use it as a context manager (sync or async): entering makes it the
    active chain in the OpenTelemetry context, so instrumented clients,
    threads and tasks started inside find it with :func:`current_context`.
    """

    _detached = False
    # The parts (set in __init__): see the module docstring.
    _state: ChainState
    _trips: ChainTrips
    _settlement: Settlement
    _admission: Admission
    _polling: ChainPolling

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
        detached: bool = False,
        _parent: ExecutionContext | None = None,
        _depth: int = 0,
        _grant_chain: bool = False,
    ) -> None:
        _check_arguments(config, pipeline, chain_id, detached, _grant_chain)
        if detached:  # else the class default (a plain chain keeps its attributes inline)
            self._detached = True
        if _parent is None and not detached:  # made inside a chain: its child
            _parent, config, _depth, chain_id, ledger, pipeline, price_table, pools = _nested(
                config, _depth, chain_id, ledger, pipeline, price_table, pools
            )
        self.config = config if config is not None else ExecutionConfig()
        self.pipeline = pipeline if pipeline is not None else PolicyPipeline()
        self.chain_id = chain_id if chain_id is not None else uuid.uuid4().hex
        self.name = name
        self.depth = check_count("depth", _depth)
        self._parent = _parent
        self._children = itertools.count(1)
        self._entries = Entries()  # one otel token per entering thread or task
        self._span: trace.Span | None = None
        chain_ledger = ledger if ledger is not None else _DEFAULT_LEDGER
        state = ChainState(
            self.config,
            self.pipeline,
            self.chain_id,
            name,
            self.depth,
            chain_ledger,
            check_pools(pools, chain_ledger),
            price_table,
            None if _parent is None else _parent._state,
        )
        trips = ChainTrips(state)
        if state.deadline is not None:  # else the class default: no timer
            state.timer = schedule(state.deadline, weak_deadline(trips))
        if _parent is not None:
            _parent._state.token.add_callback(weak_cancel(trips))
        settlement = Settlement(state, trips)
        admission = Admission(state, trips, settlement)
        polling = ChainPolling(state, trips)
        self._state = state
        self._trips = trips
        self._settlement = settlement
        self._admission = admission
        self._polling = polling
        max_depth = self.config.max_depth
        if max_depth is not None and self.depth > max_depth:
            # A joined chain too deep is born tripped: every call is denied.
            trips.deny(
                "depth", max_depth, self.depth, "hop depth over max_depth", raise_error=False
            )

    # -- context manager -------------------------------------------------

    def __enter__(self) -> ExecutionContext:
        if self._parent is None and not self._detached:
            self._check_enclosing()
        span = open_chain_span(self)
        self._span = span
        if span is not None and span.is_recording():
            self._state.metrics = True
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
        span = self._leave()
        if span is not None:
            end_chain_span(self, span, exc)

    async def __aenter__(self) -> ExecutionContext:
        """``async with``: entering never blocks, so it is :meth:`__enter__`."""
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """``async with``: the chain span's totals are read from a shared store
        without blocking the event loop."""
        span = self._leave()
        if span is not None:
            await aend_chain_span(self, span, exc)

    def _leave(self) -> trace.Span | None:
        """Detach this entry's context; the chain span to end, if this entry opened one."""
        token, span, last = self._entries.pop(self)
        if token is not None:
            otel_context.detach(token)  # type: ignore[arg-type]
        else:
            _logger.warning(
                "%r exited in a thread or task it was not entered in; that entry's "
                "OpenTelemetry context stays attached where it was made",
                self,
            )
        timer = self._state.timer
        if last and timer is not None:
            timer.cancel()
        opened: trace.Span | None = span
        return opened

    def _check_enclosing(self) -> None:
        """A root chain entered inside another chain would let the work in it
        escape that chain's limits: refused, unless it is that chain or one of
        its ancestors (entered again), or was made detached."""
        enclosing = otel_context.get_value(CONTEXT_KEY)
        if isinstance(enclosing, ExecutionContext) and all(
            level.chain_id != self.chain_id for level in enclosing._state.path
        ):
            raise RuntimeError(
                f"{self!r} was made outside any chain and is entered inside chain "
                f"{enclosing.chain_id!r}, whose limits it would escape: make it inside "
                "that chain (it becomes its child) or pass detached=True"
            )

    # -- children ----------------------------------------------------------

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
        carved, depth = self._child_terms(config)
        state = self._state
        return ExecutionContext(
            carved,
            pipeline if pipeline is not None else self.pipeline,
            chain_id=self._child_id(),
            ledger=state.ledger,
            price_table=state.prices,
            name=name,
            pools=state.pools,
            _parent=self,
            _depth=depth,
        )

    def _child_terms(self, config: ExecutionConfig | None) -> tuple[ExecutionConfig, int]:
        """A child's limits (``config`` capped by what this chain has left now)
        and depth; BudgetExceededError if this chain is tripped or the child
        would be deeper than ``max_depth``."""
        trip = self.trip
        if trip is not None:
            raise BudgetExceededError(trip)
        depth = self.depth + 1
        max_depth = min_limit(self.config.max_depth, config.max_depth if config else None)
        if max_depth is not None and depth > max_depth:
            self._trips.deny("depth", max_depth, depth, f"sub-agent depth {depth} over max_depth")
        carved = carve(
            config or ExecutionConfig(), self.config, self._state.ledger.snapshot(self.chain_id)
        )
        return replace(carved, max_depth=max_depth), depth

    def _child_id(self) -> str:
        return f"{self.chain_id}.{next(self._children)}"

    @property
    def parent(self) -> ExecutionContext | None:
        return self._parent

    def __repr__(self) -> str:
        return f"ExecutionContext(chain_id={self.chain_id!r}, depth={self.depth})"

    # -- reading the chain (ChainState) --------------------------------------

    @property
    def trip(self) -> TripEvent | None:
        """The sticky trip of this chain or the nearest tripped ancestor."""
        return self._state.current_trip()

    async def atrip(self) -> TripEvent | None:
        """:attr:`trip` for async code: a shared store is read without blocking."""
        return await self._state.atrip()

    @property
    def aborted(self) -> bool:
        return self._state.current_trip() is not None

    def snapshot(self) -> ChainSnapshot:
        """A frozen view of this chain's counters."""
        return self._state.snapshot()

    async def asnapshot(self) -> ChainSnapshot:
        """:meth:`snapshot` for async code: a shared store is read without blocking."""
        return await self._state.asnapshot()

    async def asnapshots(self) -> dict[str, LedgerState] | None:
        """The counters of every level with a cost, step or token ceiling, read
        without blocking; None with an in-process ledger (read it directly)."""
        return await self._state.asnapshots()

    def remaining_cost_and_steps(
        self, states: Mapping[str, LedgerState] | None = None, room: PoolRoom | None = None
    ) -> tuple[int | None, int | None]:
        """What the tightest cost and step ceilings have left (one ledger read a
        level, or ``states`` from :meth:`asnapshots`; the pools' ``room`` from
        :meth:`apool_room`, else read here)."""
        return self._state.remaining_cost_and_steps(states, room)

    def remaining_cost_nano(
        self, states: Mapping[str, LedgerState] | None = None, *, pools: bool = True
    ) -> int | None:
        """What the tightest cost ceiling on the path (and, with ``pools``, in the
        chain's pools) has left unreserved, or None (the path's counters from
        ``states``, :meth:`asnapshots`, when given)."""
        return self._state.remaining_cost_nano(states, pools=pools)

    def remaining_tokens(
        self, states: Mapping[str, LedgerState] | None = None, *, pools: bool = True
    ) -> int | None:
        """What the tightest token ceiling on the path (and, with ``pools``, in the
        chain's pools) has left unreserved, or None (the path's counters from
        ``states``, :meth:`asnapshots`, when given)."""
        return self._state.remaining_tokens(states, pools=pools)

    def pool_room(self) -> PoolRoom | None:
        """What the chain's pools have left unreserved; None for a chain with no pools."""
        return self._state.pool_room()

    async def apool_room(self) -> PoolRoom | None:
        """:meth:`pool_room` for async code: a shared store is read without blocking."""
        return await self._state.apool_room()

    @property
    def pools(self) -> tuple[BudgetPool, ...]:
        """The budget pools every call of the chain is also reserved in."""
        return self._state.pools

    @property
    def tracks_handoffs(self) -> bool:
        """Whether the chain limits handoffs between agents (``max_handoffs``)."""
        return self._state.handoffs is not None

    @property
    def names_agents(self) -> bool:
        """Whether a call's span should name its agent (``gen_ai.agent.name``):
        the chain counts handoffs or some agent has limits of its own."""
        return self._state.names_agents

    @property
    def tracks_repeats(self) -> bool:
        """Whether any level of the chain limits repeated call signatures."""
        return self._state.repeats_limited

    @property
    def awaits_store(self) -> bool:
        """Whether async calls await the ledger (a shared store; in process, never)."""
        return self._state.aledger is not None

    @property
    def has_cost_ceiling(self) -> bool:
        return self._state.priced

    def get_partial_result(self) -> Any:
        """The last result of a wrapped call, or text received before a cut."""
        return self._state.partial

    def set_partial_result(self, value: Any) -> None:
        """Keep ``value`` as the partial result (streams call this as they go)."""
        self._state.partial = value

    @property
    def cancellation(self) -> CancellationToken:
        return self._state.token

    # -- trips and overrides (ChainTrips) --------------------------------------

    def cancel(self) -> None:
        """Stop the chain now: later calls are denied with reason ``timeout``."""
        self._trips.cancel()

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
        return self._trips.override(reason, duration_s, add_usd=add_usd, add_steps=add_steps)

    # -- work in flight (ChainPolling) ------------------------------------------

    # Module functions themselves: a stream's per-chunk check runs no frame of ours.
    ensure_active = _chain_poll.ensure_active
    aensure_active = _chain_poll.aensure_active

    # -- admission (Admission) ----------------------------------------------

    def admit_call(
        self,
        spec: CallSpec,
        breaker: CircuitBreaker | None = None,
        probe: object = None,
        defer: bool = False,
    ) -> Admitted:
        """Admit one described LLM call, or raise :class:`BudgetExceededError`
        (see :func:`~._llm_admission.admit_call`): breaker, prices, the output
        clamp, deadline, policies and agents, one reservation of its worst
        case, then a policy's degradation."""
        return self._admission.admit_call(spec, breaker, probe, defer)

    async def aadmit_call(
        self, spec: CallSpec, breaker: CircuitBreaker | None = None, probe: object = None
    ) -> Admitted:
        """:meth:`admit_call` for async code: a shared store is awaited, never
        blocked on. Settle with ``afinish``/``acommit``."""
        return await self._admission.aadmit_call(spec, breaker, probe)

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
        return self._admission.begin_call(kind, options, cost_nano=cost_nano)

    def begin_priced_call(
        self,
        kind: str,
        operation_name: str,
        provider: str | None,
        model: str | None,
        cost_nano: int,
        tokens: int,
        retry: bool = False,
        signature: str | None = None,
        clamp: OutputClamp | None = None,
        step: bool = True,
        defer: bool = False,
    ) -> CallHandle:
        """:meth:`begin_call` for instrumentors that already priced the call
        (see :meth:`Admission.begin_priced_call`)."""
        return self._admission.begin_priced_call(
            kind,
            operation_name,
            provider,
            model,
            cost_nano,
            tokens,
            retry,
            signature,
            clamp,
            step,
            defer,
        )

    async def abegin_call(
        self, kind: str = "llm", options: WrapOptions | None = None, *, cost_nano: int | None = None
    ) -> CallHandle:
        """:meth:`begin_call` for async code: the reservation never blocks the
        event loop. Settle the handle with ``await handle.afinish(...)``."""
        return await self._admission.abegin_call(kind, options, cost_nano=cost_nano)

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
        step: bool = True,
    ) -> CallHandle:
        """:meth:`begin_priced_call` for async code (same checks, same denials)."""
        return await self._admission.abegin_priced_call(
            kind,
            operation_name,
            provider,
            model,
            cost_nano,
            tokens,
            retry=retry,
            signature=signature,
            step=step,
        )

    def consume_retry(self) -> None:
        """Draw one retry from ``max_retries_total`` or raise BudgetExceededError."""
        self._admission.consume_retry()

    async def aconsume_retry(self) -> None:
        """:meth:`consume_retry` for async code: a shared store is awaited."""
        await self._admission.aconsume_retry()

    def prices_for(self, provider: str | None, model: str) -> UnitPrices | None:
        """Unit prices for a model; denies (reason ``cost``) an unknown model under
        a cost ceiling. Returns None when the chain has no cost ceiling and the
        model has no price (usage is then counted in tokens only)."""
        return self._admission.prices_for(provider, model)

    # -- settlement (Settlement) ----------------------------------------------

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
        self._settlement.record_usage(
            cost_usd=cost_usd,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cached_input_tokens=cached_input_tokens,
            reasoning_tokens=reasoning_tokens,
            model=model,
            provider=provider,
        )

    # -- the wrap API (_wrap): admit through the admission, run, settle -------

    # The module's functions themselves, so a wrapped call runs no frame of ours.
    wrap_llm_call = _wrap.wrap_llm_call
    wrap_tool_call = _wrap.wrap_tool_call
    awrap_llm_call = _wrap.awrap_llm_call
    awrap_tool_call = _wrap.awrap_tool_call


_Nested = tuple[
    "ExecutionContext | None",
    ExecutionConfig | None,
    int,
    str | None,
    Ledger | None,
    PolicyPipeline | None,
    PriceTable | None,
    Sequence[BudgetPool] | None,
]


def _check_arguments(
    config: object, pipeline: object, chain_id: object, detached: object, grant: bool = False
) -> None:
    if config is not None and not isinstance(config, ExecutionConfig):
        raise TypeError(f"config must be an ExecutionConfig, got {config!r}")
    if pipeline is not None and not isinstance(pipeline, PolicyPipeline):
        raise TypeError(f"pipeline must be a PolicyPipeline, got {pipeline!r}")
    if chain_id is not None and (
        not isinstance(chain_id, str) or not _valid_id(chain_id, grant=grant)
    ):
        raise ValueError(
            "chain_id must be 1-128 ASCII letters, digits and -_.: not starting with . or :, "
            f"got {chain_id!r}"
        )
    if not isinstance(detached, bool):
        raise TypeError(f"detached must be a bool, got {detached!r}")


def _nested(
    config: ExecutionConfig | None,
    depth: int,
    chain_id: str | None,
    ledger: Ledger | None,
    pipeline: PolicyPipeline | None,
    price_table: PriceTable | None,
    pools: Sequence[BudgetPool] | None,
) -> _Nested:
    """A context made inside another chain: (parent, carved config, depth,
    chain id, ledger, pipeline, prices, pools) of the child it becomes; the
    arguments unchanged outside every chain, or when ``chain_id`` names a
    chain on the enclosing path (that chain itself)."""
    enclosing = otel_context.get_value(CONTEXT_KEY)
    if not isinstance(enclosing, ExecutionContext) or (
        chain_id is not None and any(level.chain_id == chain_id for level in enclosing._state.path)
    ):
        return None, config, depth, chain_id, ledger, pipeline, price_table, pools
    if ledger is not None and ledger is not enclosing._state.ledger:
        raise ValueError(
            f"ledger={ledger!r} is not the ledger of the enclosing chain "
            f"{enclosing.chain_id!r}: a nested context is its child and shares it; "
            "pass detached=True for an independent chain"
        )
    carved, child_depth = enclosing._child_terms(config)
    return (
        enclosing,
        carved,
        child_depth,
        chain_id if chain_id is not None else enclosing._child_id(),
        enclosing._state.ledger,
        pipeline if pipeline is not None else enclosing.pipeline,
        price_table if price_table is not None else enclosing._state.prices,
        _joined(enclosing._state.pools, pools),
    )


def _joined(
    inherited: tuple[BudgetPool, ...], own: Sequence[BudgetPool] | None
) -> tuple[BudgetPool, ...]:
    """The enclosing chain's pools, then the child's own that are not among them."""
    names = {pool.name for pool in inherited}
    return (*inherited, *(pool for pool in own or () if pool.name not in names))


def _valid_id(chain_id: str, *, grant: bool = False) -> bool:
    """ASCII letters, digits and ``-_.:`` (no ``/``: agents' and grants' ids
    hold it), not starting with ``.`` or ``:`` (the store refuses those, and
    the pools' tag is ``:pools``): see ``distributed/_keys.py``. With
    ``grant``, also a request chain joined under a grant (``<id>:grant/<nonce>``,
    made by ``_remote.child_chain_id``, never by a user)."""
    if grant and GRANT_MARK in chain_id:
        caller, _, nonce = chain_id.rpartition(GRANT_MARK)
        return (
            _valid_id(caller, grant=True)
            and nonce.isascii()
            and all(c.isalnum() or c in "-_" for c in nonce)
        )
    return (
        0 < len(chain_id) <= 128
        and chain_id.isascii()
        and chain_id[0] not in ".:"
        and all(c.isalnum() or c in "-_.:" for c in chain_id)
    )
