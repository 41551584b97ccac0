"""Chain ledgers and circuit breakers shared across processes, in Redis or Valkey.

Install with the ``redis`` extra (``pip install 'veronica-otel[redis]'``).
The kernel never imports this package; pass its objects in explicitly.

Usage::

    from veronica_otel import ExecutionConfig, ExecutionContext, PolicyPipeline
    from veronica_otel.distributed import RedisCircuitBreaker, RedisLedger

    ledger = RedisLedger.from_url("redis://localhost:6379/0")
    breaker = RedisCircuitBreaker.from_url("redis://localhost:6379/0", "openai:gpt-4o")
    with ExecutionContext(
        ExecutionConfig(max_cost_usd=5.0, max_steps=200),
        PolicyPipeline([breaker]),
        chain_id="nightly-report",
        ledger=ledger,
    ) as ctx:
        ...

Every process that opens a context with the same ``chain_id`` on the same
store shares one budget: reserve, commit, release and trip are each one Lua
script, so the limits hold exactly across any number of processes.

Configuration:

* ``VERONICA_FAIL_OPEN``: ``true`` to fall back to a process-local ledger
  (and to let breaker checks through) when the store is unreachable. The
  default is fail closed: calls are denied with
  :class:`LedgerUnavailableError`, whose message names the store.
"""

from ._breaker import RedisCircuitBreaker
from ._errors import LedgerCorruptedError, LedgerLostError, LedgerUnavailableError
from ._ledger import RedisLedger

__all__ = [
    "LedgerCorruptedError",
    "LedgerLostError",
    "LedgerUnavailableError",
    "RedisCircuitBreaker",
    "RedisLedger",
]
