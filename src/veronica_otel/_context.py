"""ExecutionContext: the chain-scoped containment boundary.

Every call made through a context goes through :meth:`ExecutionContext.begin_call`:
deadline and cancellation first, then the policy pipeline, then one atomic
ledger reservation of the call's worst case. Only then does the call run. When
it ends, :meth:`CallHandle.finish` commits what it actually cost (reported with
``record_usage``, else what it reserved, whether it returned or raised) and
releases the rest; a call never sent is released whole (DESIGN G10).
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any, cast

from opentelemetry import context as otel_context
from opentelemetry import trace

from ._agent_limits import lookups_of
from ._agents import HandoffCounter
from ._call import CallHandle
from ._chain_span import aend_chain_span, end_chain_span, open_chain_span
from ._children import carve, min_limit, weak_cancel, weak_deadline
from ._cm import Entries
from ._config import ExecutionConfig
from ._errors import BudgetExceededError, TripEvent
from ._ledger import (
    DEFAULT_LEDGER,
    Ledger,
    Level,
    Limits,
    LocalLedger,
)
from ._limits import GRANT_MARK
from ._policy import PolicyPipeline
from ._pools import BudgetPool, check_pools
from ._pricing import PriceTable
from ._telemetry import track_chain
from ._timer import CancellationToken, schedule
from ._units import check_count, usd_to_nano
from ._wrap import WrapCalls

__all__ = ["CONTEXT_KEY", "CallHandle", "ExecutionContext"]

# Where the active chain lives in the OpenTelemetry context (see _propagation).
CONTEXT_KEY = otel_context.create_key("veronica-otel-execution-context")

_DEFAULT_LEDGER = DEFAULT_LEDGER


_logger = logging.getLogger("veronica_otel")
_monotonic = time.monotonic


class ExecutionContext(WrapCalls):
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
        if self._deadline is not None:  # else the class default: no timer
            self._timer = schedule(self._deadline, weak_deadline(self))
        if _parent is not None:
            _parent._token.add_callback(weak_cancel(self))
        if self._priced:
            track_chain(self)
        self._handoffs = (
            HandoffCounter(limits.max_handoffs) if limits.max_handoffs is not None else None
        )
        self._checked = (
            self._deadline is not None or self._handoffs is not None or self._has_policies
        )
        self._fast: tuple[LocalLedger, Level, Any] | None = None
        self._live: tuple[Any, ...] | None = None
        if isinstance(self._ledger, LocalLedger):
            self._hold(self._ledger)
        else:  # store polls for trips made elsewhere (ensure_active): chunks since, time, last ok
            self._unpolled, self._polled_at, self._poll_ok = 0, self._started, True
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
        if self._parent is None and not self._detached:
            self._check_enclosing()
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
        span = self._leave()
        if span is not None:
            end_chain_span(self, span, exc)

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
        if last and self._timer is not None:
            self._timer.cancel()
        opened: trace.Span | None = span
        return opened

    def _check_enclosing(self) -> None:
        """A root chain entered inside another chain would let the work in it
        escape that chain's limits: refused, unless it is that chain or one of
        its ancestors (entered again), or was made detached."""
        enclosing = otel_context.get_value(CONTEXT_KEY)
        if isinstance(enclosing, ExecutionContext) and all(
            level.chain_id != self.chain_id for level in enclosing._path
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
        return ExecutionContext(
            carved,
            pipeline if pipeline is not None else self.pipeline,
            chain_id=self._child_id(),
            ledger=self._ledger,
            price_table=self._prices,
            name=name,
            pools=self._pools,
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
            self._deny("depth", max_depth, depth, f"sub-agent depth {depth} over max_depth")
        carved = carve(
            config or ExecutionConfig(), self.config, self._ledger.snapshot(self.chain_id)
        )
        return replace(carved, max_depth=max_depth), depth

    def _child_id(self) -> str:
        return f"{self.chain_id}.{next(self._children)}"

    @property
    def parent(self) -> ExecutionContext | None:
        return cast("ExecutionContext | None", self._parent)  # only contexts make children

    def __repr__(self) -> str:
        return f"ExecutionContext(chain_id={self.chain_id!r}, depth={self.depth})"


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
        chain_id is not None and any(level.chain_id == chain_id for level in enclosing._path)
    ):
        return None, config, depth, chain_id, ledger, pipeline, price_table, pools
    if ledger is not None and ledger is not enclosing._ledger:
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
        enclosing._ledger,
        pipeline if pipeline is not None else enclosing.pipeline,
        price_table if price_table is not None else enclosing._prices,
        _joined(enclosing._pools, pools),
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
