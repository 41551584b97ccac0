"""The override across processes: the CLI lifts a trip in the shared ledger."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from veronica_otel import Decision, ExecutionConfig, ExecutionContext
from veronica_otel.distributed import RedisLedger

CLI = Path(sys.executable).parent / "veronica-otel"


def test_cli_override_lifts_a_trip_seen_by_another_process(
    redis_url: str, redis_prefix: str
) -> None:
    ledger = RedisLedger.from_url(redis_url, key_prefix=redis_prefix)
    ctx = ExecutionContext(ExecutionConfig(max_steps=2), chain_id="ov-shared", ledger=ledger)
    assert [ctx.wrap_llm_call(lambda: None) for _ in range(3)] == [
        Decision.ALLOW,
        Decision.ALLOW,
        Decision.HALT,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERONICA_")}
    result = subprocess.run(
        [
            str(CLI),
            "override",
            "--chain",
            "ov-shared",
            "--reason",
            "INC-7: let the report finish",
            "--duration",
            "10m",
            "--add-steps",
            "1",
            "--redis-url",
            redis_url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "VERONICA_REDIS_PREFIX": redis_prefix},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "lifted a steps trip" in result.stdout
    assert "INC-7" in result.stderr  # logged on veronica_otel.overrides
    assert ctx.wrap_llm_call(lambda: None) is Decision.ALLOW  # this process sees it
    assert ctx.wrap_llm_call(lambda: None) is Decision.HALT  # one extra step only


def test_override_in_the_shared_ledger_widens_the_limit_for_everyone(
    redis_url: str, redis_prefix: str
) -> None:
    a = ExecutionContext(
        ExecutionConfig(max_steps=1),
        chain_id="ov-2",
        ledger=RedisLedger.from_url(redis_url, key_prefix=redis_prefix),
    )
    b = ExecutionContext(
        ExecutionConfig(max_steps=1),
        chain_id="ov-2",
        ledger=RedisLedger.from_url(redis_url, key_prefix=redis_prefix),
    )
    assert a.wrap_llm_call(lambda: None) is Decision.ALLOW
    assert b.wrap_llm_call(lambda: None) is Decision.HALT  # tripped: steps
    lifted = b.override("approved by on-call", 300, add_steps=2)
    assert lifted is not None and lifted.reason == "steps"
    assert a.wrap_llm_call(lambda: None) is Decision.ALLOW  # a sees the lifted trip
    assert b.wrap_llm_call(lambda: None) is Decision.ALLOW
    assert a.wrap_llm_call(lambda: None) is Decision.HALT  # 1 + 2 used up
    assert a.snapshot().steps == 3


def _cli(*args: str, prefix: str = "veronica:") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERONICA_")}
    return subprocess.run(
        [str(CLI), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "VERONICA_REDIS_PREFIX": prefix},
        check=False,
    )


def test_cli_override_adds_money_and_steps_together(redis_url: str, redis_prefix: str) -> None:
    ledger = RedisLedger.from_url(redis_url, key_prefix=redis_prefix)
    ctx = ExecutionContext(ExecutionConfig(max_steps=1), chain_id="ov-both", ledger=ledger)
    assert [ctx.wrap_llm_call(lambda: None) for _ in range(2)] == [Decision.ALLOW, Decision.HALT]
    result = _cli(
        "override",
        "--chain",
        "ov-both",
        "--reason",
        "INC-9",
        "--duration",
        "10m",
        "--add-usd",
        "0.5",
        "--add-steps",
        "2",
        "--redis",  # the same flag name as `pools`
        redis_url,
        prefix=redis_prefix,
    )
    assert result.returncode == 0, result.stderr
    assert "(add $0.50, 2 steps)" in result.stdout
    assert [ctx.wrap_llm_call(lambda: None) for _ in range(3)] == [
        Decision.ALLOW,
        Decision.ALLOW,
        Decision.HALT,
    ]


def test_cli_with_the_store_down_names_the_store_and_changes_nothing() -> None:
    for command in (
        ("override", "--chain", "c1", "--reason", "x", "--duration", "5m"),
        ("pools",),
        ("status", "--chain", "c1"),
    ):
        result = _cli(*command, "--redis-url", "redis://127.0.0.1:1/0")  # the old name works
        assert result.returncode == 1
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert "the ledger store redis://127.0.0.1:1/0 cannot be reached" in lines[0]
        assert "the call was not sent" not in lines[0]  # words for LLM calls, not a store


def test_cli_status_shows_the_spend_and_the_trip_before_an_override(
    redis_url: str, redis_prefix: str
) -> None:
    ledger = RedisLedger.from_url(redis_url, key_prefix=redis_prefix)
    ctx = ExecutionContext(ExecutionConfig(max_steps=2), chain_id="st-1", ledger=ledger)
    assert [ctx.wrap_llm_call(lambda: None) for _ in range(3)][-1] is Decision.HALT
    result = _cli("status", "--chain", "st-1", "--redis", redis_url, prefix=redis_prefix)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("chain st-1 in redis://")
    assert "  steps     2" in lines
    assert any(line.startswith("  trip      steps (limit 2, observed 3)") for line in lines)
    assert any("veronica-otel override --chain st-1" in line for line in lines)
    unknown = _cli("status", "--chain", "nope", "--redis", redis_url, prefix=redis_prefix)
    assert unknown.returncode == 1
    assert "chain 'nope' is not in the ledger store" in unknown.stderr
