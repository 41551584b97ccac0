"""Every ``VERONICA_*`` environment variable and policy-file key, described once.

The documentation's configuration reference is rendered from these tables
(``docs/hooks.py``), and a test checks them against the code (every variable
the package reads is here, every key the policy schema accepts is here), so
the reference cannot drift from what the code does.
"""

from __future__ import annotations

from collections.abc import Mapping

from ._config import ENV_LIMITS
from ._policy_schema import (
    _AGENT_KEYS,
    _LIMIT_KEYS,
    _MODEL_KEYS,
    _POOL_KEYS,
    _PRICE_KEYS,
    _TOOL_KEYS,
    _TOP_KEYS,
    _UNIT_PRICE_KEYS,
)

__all__ = ["ENVIRONMENT", "POLICY_KEYS", "environment_table", "policy_table"]

#: ``(variables, meaning)``: one row per setting (several variables when they go together).
ENVIRONMENT: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        tuple(ENV_LIMITS.values()),
        "the zero-code default chain's limits (`ExecutionConfig.from_env()`): USD, steps, "
        "retries across all layers, wall-clock milliseconds, tokens, repeats of one call, "
        "sub-agent depth, handoffs between two agents; and the seconds a call refused only "
        "by other calls' in-flight reservations waits for them to settle (default 10, never "
        "past the deadline; 0: refuse at once)",
    ),
    (("VERONICA_UNKNOWN_MODEL_PRICE",), "USD per 1M tokens for models with no known price"),
    (("VERONICA_POLICY_FILE",), "a declarative policy file (TOML or YAML), reloaded on change"),
    (
        ("VERONICA_POOLS",),
        "`tenant:acme,user:alice`: budget pools the zero-code default chain also spends "
        'from; their limits come from the policy file\'s `[pools."name"]`',
    ),
    (
        ("VERONICA_REDIS_URL",),
        "the shared ledger and endpoint breakers in Redis / Valkey (the `redis` extra)",
    ),
    (("VERONICA_REDIS_CLUSTER",), "`true`: the store is a Redis Cluster"),
    (("VERONICA_REDIS_PREFIX",), "key prefix in the store (default `veronica:`)"),
    (
        ("VERONICA_CHAIN_ID",),
        "names the zero-code default chain, so processes sharing the store share one budget",
    ),
    (
        ("VERONICA_FAIL_OPEN",),
        "`true`: let calls through uncontained (with a warning) when containment cannot be "
        "installed or the store is unreachable; default: fail closed",
    ),
    (
        ("VERONICA_GRANT_KEY", "VERONICA_GRANT_KEYS"),
        "HMAC key (16+ bytes) for budget grants between services; or `kid:secret,...` "
        "for rotation (the first signs, all verify)",
    ),
    (
        ("VERONICA_GRANT_AUDIENCE",),
        "the `host[:port]` this service accepts grants for (default: the request's `Host`)",
    ),
    (
        ("VERONICA_GRANT_MAX_COST_USD", "VERONICA_GRANT_MAX_STEPS", "VERONICA_GRANT_MAX_TOKENS"),
        "the most one outgoing grant takes from the caller's chain (default: all it has left)",
    ),
    (
        ("VERONICA_MODEL_ALIASES",),
        "`deployment=model,...`: price deployment names (Azure and the like) as the model "
        "they serve",
    ),
    (
        ("VERONICA_THREADS",),
        "`false`: the instrumentors do not carry the chain into threads (default `true`)",
    ),
    (
        ("VERONICA_PROPAGATE_HOSTS",),
        "hosts the chain's baggage may be sent to (allow-list; default none)",
    ),
    (
        ("VERONICA_VENDOR_HOSTS",),
        "more LLM vendor hosts: never sent baggage, and contained by the vendor guard",
    ),
    (
        ("VERONICA_VENDOR_GUARD",),
        "`contain` (default): a request to an LLM vendor that no SDK instrumentor admitted "
        "is contained at the HTTP layer; `refuse`: refused in a limited chain; `off`",
    ),
    (
        ("VERONICA_JAEGER_CACHE", "VERONICA_JAEGER_BINARY"),
        "testing: where `veronica_otel.testing.jaeger` caches the Jaeger it builds "
        "(default `~/.cache/veronica-otel-jaeger`), or a Jaeger binary to use instead",
    ),
    (
        ("VERONICA_GRAPH_DIR", "VERONICA_OTLP_JSON_PATH"),
        "where the `veronica_graph` and `veronica_otlp_json` trace exporters write",
    ),
)

_LIMIT_MEANINGS: Mapping[str, str] = {
    "max_cost_usd": "USD",
    "max_steps": "calls dispatched",
    "max_retries_total": "retries across every layer",
    "timeout_ms": "wall-clock milliseconds",
    "max_tokens": "tokens, input and output",
    "max_repeats": "dispatches of one call signature",
    "max_depth": "sub-agent or service hops",
    "max_handoffs": "handoffs between the same two agents",
}

#: ``(key path, meaning)`` for every key a policy file may hold.
POLICY_KEYS: tuple[tuple[str, str], ...] = (
    (
        "unknown_model_price_usd_per_mtok",
        "USD per 1M tokens for models with no known price",
    ),
    *(
        (f"limits.{key}", f"the chain's ceiling on {_LIMIT_MEANINGS[key]}")
        for key in _LIMIT_KEYS
        if key in _LIMIT_MEANINGS
    ),
    (
        "limits.reservation_wait_s",
        "seconds a call refused only by other calls' in-flight reservations waits for them "
        "to settle (default 10, never past the deadline; 0: refuse at once)",
    ),
    *(
        (f'prices."model".{key}', f"USD per 1M {key.replace('_', ' ')} tokens")
        for key in _PRICE_KEYS
    ),
    ('prices."model".per_image', "USD per image of an image endpoint (the dearest size you send)"),
    ('prices."model".per_character', "USD per input character of a speech endpoint"),
    ('prices."model".per_second', "USD per second of a video endpoint"),
    (
        'prices."model".per_request',
        "the most one call may spend (an endpoint or model billed after the call "
        'returns: "openai:batches", "openai:whisper-1"), reserved and committed whole',
    ),
    ('models."model".fallback', "the model to send instead of this one"),
    ('models."model".max_tokens', "each call's output cap (a larger or missing cap is lowered)"),
    ('models."model".max_calls', "how many calls to this model one chain may make"),
    ('tools."name".max_calls', "how many calls of this tool one chain may make"),
    ('tools."name".cost_usd', "what one call of this tool costs"),
    *(
        (f'agents."name".{key}', f"the agent's own ceiling on {_LIMIT_MEANINGS[key]}")
        for key in _AGENT_KEYS
    ),
    *(
        (f'pools."name".{key}', f"the pool's ceiling on {_LIMIT_MEANINGS[key]}")
        for key in _POOL_KEYS
        if key != "window"
    ),
    ('pools."name".window', "the pool's window (`1h`, `1d`, `30d`); none: a lifetime budget"),
)

# What the checks compare POLICY_KEYS with: the schema's own key tables.
SCHEMA_KEYS: Mapping[str, tuple[str, ...]] = {
    "": _TOP_KEYS,
    "limits": _LIMIT_KEYS,
    "prices": _PRICE_KEYS + _UNIT_PRICE_KEYS,
    "models": _MODEL_KEYS,
    "tools": _TOOL_KEYS,
    "agents": _AGENT_KEYS,
    "pools": _POOL_KEYS,
}


def environment_table() -> str:
    """The environment variables as a Markdown table."""
    rows = ["| variable | meaning |", "| --- | --- |"]
    for names, meaning in ENVIRONMENT:
        rows.append(f"| {', '.join(f'`{n}`' for n in names)} | {meaning} |")
    return "\n".join(rows)


def policy_table() -> str:
    """The policy-file keys as a Markdown table."""
    rows = ["| key | meaning |", "| --- | --- |"]
    rows += [f"| `{key}` | {meaning} |" for key, meaning in POLICY_KEYS]
    return "\n".join(rows)
