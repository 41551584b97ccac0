"""Process body for the multi-process pool test (spawned, so importable and light)."""

from __future__ import annotations

from multiprocessing.synchronize import Barrier

from veronica_otel._ledger import Level, Limits, PoolLevel, Reservation
from veronica_otel.distributed import RedisLedger


def pool_calls(
    url: str,
    prefix: str,
    chain_id: str,
    calls: int,
    cost_nano: int,
    pool: PoolLevel,
    start: Barrier,
) -> int:
    """Reserve and commit ``calls`` calls of ``chain_id`` in ``pool``; return how many ran."""
    ledger = RedisLedger.from_url(url, key_prefix=prefix)
    path = [Level(chain_id, Limits(steps=calls))]
    ledger.snapshot(chain_id)  # connected: the race starts with the first call
    start.wait(timeout=60)
    ran = 0
    for _ in range(calls):
        got = ledger.reserve(path, cost_nano, 0, pools=[pool])
        if isinstance(got, Reservation):
            ran += 1
            ledger.commit(path, got, cost_nano, 0)
    ledger.close()
    ledger.client.close()
    return ran
