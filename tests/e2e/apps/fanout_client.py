"""The caller of the fan-out test: one chain, many concurrent requests to service B.

Usage: ``fanout_client.py URL N CALLS [GRANT_MAX_STEPS [GRANT_MAX_COST_USD]]``. Opens a chain with
``max_steps=4`` and ``max_cost_usd=1.0`` (on the Redis ledger at
``VERONICA_REDIS_URL`` when set), sends ``N`` requests at once to ``URL``
``/agent?calls=CALLS`` with httpx2, and prints a JSON report: each request's
status (or the reason it was not sent), what B says it made, and the chain's
counters afterwards.
"""

from __future__ import annotations

import asyncio
import concurrent.futures.thread  # noqa: F401  (instrumentors/threading.py reads it at import)
import json
import logging
import os
import sys
import uuid
from typing import Any

import httpx2

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel.instrumentors.httpx import HTTPXInstrumentor


async def one(client: httpx2.AsyncClient, path: str) -> dict[str, Any]:
    try:
        response = await client.get(path)
    except BudgetExceededError as exc:
        return {"status": None, "denied": exc.reason}
    body = response.json()
    return {"status": response.status_code, "made": body.get("made", 0)}


async def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    url, n, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    kwargs: dict[str, Any] = {}
    if len(sys.argv) > 4:
        kwargs["grant_max_steps"] = int(sys.argv[4])
    if len(sys.argv) > 5:
        kwargs["grant_max_cost_usd"] = float(sys.argv[5])
    HTTPXInstrumentor().instrument(**kwargs)
    ledger: Any = None
    if os.environ.get("VERONICA_REDIS_URL"):
        from veronica_otel.distributed import RedisLedger

        ledger = RedisLedger.from_url(os.environ["VERONICA_REDIS_URL"])
    config = ExecutionConfig(max_steps=4, max_cost_usd=1.0)
    chain_id = f"job-{uuid.uuid4().hex[:8]}"
    with ExecutionContext(config, chain_id=chain_id, ledger=ledger) as ctx:
        async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
            results = await asyncio.gather(
                *(one(client, f"/{path}") for path in [f"agent?calls={calls}"] * n)
            )
        snap = ctx.snapshot()
    print(
        json.dumps(
            {
                "results": results,
                "steps": snap.steps,
                "cost_usd": snap.cost_usd,
                "reserved_usd": snap.reserved_usd,
                "aborted": snap.aborted,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
