"""What the HTTP vendor guard costs a request that is not a vendor's.

Every request through a hooked transport passes the guard's hook. For one
that is not an LLM vendor's, the hook is one context-variable read and one
cheap test (the method, a cached host verdict, the path's last segment).
This prints, per request:

* ``hook_*``: the transport hook alone (around a no-op send), guard off and
  on, for a GET, a POST to an ordinary path, and a POST whose last segment
  looks like an API's (``/api/chat`` on a non-vendor host: the path's regex
  and then the body are read, inside a chain);
* ``request_*``: a whole ``httpx2.Client.post`` to the local fake server's
  ``/health`` (not an API path), guard off and on: the median of many.

Run: ``python benchmarks/bench_vendor_guard.py [--json]``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx2

from veronica_otel import ExecutionConfig, ExecutionContext
from veronica_otel.instrumentors._attempts import _attempt
from veronica_otel.instrumentors._guard_transports import TRANSPORTS, install_guard
from veronica_otel.instrumentors._vendor_guard import VendorGuard
from veronica_otel.testing import FakeLLMServer

_N = 200_000


def _per_call_ns(fn: Callable[[], Any], n: int = _N) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter_ns() - start) / n)
    return best


def _hook_cost(request: httpx2.Request) -> float:
    def send(*args: Any, **kwargs: Any) -> None:
        return None

    instance = object()
    args = (request,)
    kwargs: dict[str, Any] = {}
    return _per_call_ns(lambda: _attempt(send, instance, args, kwargs))


def main() -> None:
    results: dict[str, float] = {}
    get = httpx2.Request("GET", "http://orders.internal:8080/v1/items?x=1")
    post = httpx2.Request("POST", "http://orders.internal:8080/v1/items", json={"a": 1})
    api_like = httpx2.Request("POST", "http://orders.internal:8080/api/chat", json={"q": "x"})
    with ExecutionContext(ExecutionConfig(max_steps=10**9)):
        for state in ("off", "on"):
            install_guard("httpx", "bench", VendorGuard() if state == "on" else None)
            results[f"hook_get_{state}_ns"] = _hook_cost(get)
            results[f"hook_post_{state}_ns"] = _hook_cost(post)
            results[f"hook_api_like_post_{state}_ns"] = _hook_cost(api_like)
        install_guard("httpx", "bench", None)
        with FakeLLMServer() as server, httpx2.Client(transport=httpx2.HTTPTransport()) as c:
            from veronica_otel.instrumentors._attempts import ensure_attempt_hooks

            ensure_attempt_hooks()  # the hook is on the transport class from here on
            url = server.base_url + "/health"
            for state in ("off", "on", "off", "on"):
                install_guard("httpx", "bench", VendorGuard() if state == "on" else None)
                times = []
                for _ in range(3000):
                    start = time.perf_counter_ns()
                    c.post(url, json={"a": 1})
                    times.append(time.perf_counter_ns() - start)
                results[f"request_{state}_us"] = statistics.median(times) / 1000
        install_guard("httpx", "bench", None)
    assert TRANSPORTS["httpx"].guard is None
    if "--json" in sys.argv:
        print(json.dumps(results, indent=2))
        return
    for name, value in results.items():
        print(f"{name:32} {value:10.1f}")
    added = results["hook_post_on_ns"] - results["hook_post_off_ns"]
    share = added / (results["request_off_us"] * 1000)
    print(f"guard on, non-vendor POST: +{added:.0f} ns per request ({share:.3%} of one request)")


if __name__ == "__main__":
    main()
