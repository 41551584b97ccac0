"""``veronica-otel pools`` with the policy file: each pool's limits and what is left.

Real calls (the openai SDK against the fake server) spend in a pool the
policy file defines, on a real Valkey; the command reads the spend from the
store and the limits from the same file (``--policy`` or
``VERONICA_POLICY_FILE``), as the processes did.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
from veronica_otel.cli import main
from veronica_otel.distributed import RedisLedger
from veronica_otel.instrumentors.openai import OpenAIInstrumentor
from veronica_otel.policy_file import PolicyFile
from veronica_otel.testing import FakeLLMServer

POLICY = """
[pools."tenant:acme"]
max_cost_usd = 0.05
max_steps = 3
window = "1d"

[pools."user:idle"]
max_tokens = 5000
"""


@pytest.fixture
def spent(
    tmp_path: Path, redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Path, RedisLedger]]:
    """Three calls made in tenant:acme's pool (its step limit), the fourth refused."""
    path = tmp_path / "policy.toml"
    path.write_text(POLICY, encoding="utf-8")
    monkeypatch.setenv("VERONICA_REDIS_PREFIX", redis_prefix)
    monkeypatch.delenv("VERONICA_POLICY_FILE", raising=False)
    ledger = RedisLedger.from_url(redis_url, key_prefix=redis_prefix)
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    try:
        with FakeLLMServer() as server:
            client = openai.OpenAI(base_url=server.openai_base_url, api_key="t", max_retries=0)
            acme = PolicyFile(path).pool("tenant:acme", ledger=ledger)
            with (
                ExecutionContext(ExecutionConfig(), ledger=ledger, pools=[acme]),
                pytest.raises(BudgetExceededError) as denied,
            ):
                for _ in range(5):
                    client.chat.completions.create(
                        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
                    )
            assert denied.value.pool == "tenant:acme"
            assert server.count("/v1/chat/completions") == 3
        yield path, ledger
    finally:
        instrumentor.uninstrument()
        ledger.close()


def _rows(out: str) -> dict[str, str]:
    lines = out.splitlines()
    return {line.split()[0]: line for line in lines[1:]}


def test_pools_shows_limits_spent_and_left(
    spent: tuple[Path, RedisLedger], redis_url: str, capsys: Any
) -> None:
    path, ledger = spent
    assert main(["pools", "--redis", redis_url, "--policy", str(path)]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    assert header.split()[-2:] == ["LIMIT", "LEFT"]
    rows = _rows(out)
    snap = PolicyFile(path).pool("tenant:acme", ledger=ledger).snapshot()
    assert snap.steps == 3 and 0 < snap.cost_usd < 0.05
    acme = rows["tenant:acme"]
    assert f"{snap.cost_usd:.6f}" in acme  # spent, from the store
    assert "$0.05, 3 steps" in acme  # the limits, from the file
    left = f"${0.05 - snap.cost_usd:.6f}".rstrip("0")
    assert re.split(r"\s{2,}", acme)[-1] == f"{left}, 0 steps"  # nothing left, in steps
    # A pool the file defines that has spent nothing yet is listed too.
    assert rows["user:idle"].split()[:5] == ["user:idle", "lifetime", "0.000000", "0", "0"]
    assert re.split(r"\s{2,}", rows["user:idle"])[-2:] == ["5000 tokens", "5000 tokens"]


def test_the_policy_file_comes_from_the_environment_too(
    spent: tuple[Path, RedisLedger],
    redis_url: str,
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, _ = spent
    monkeypatch.setenv("VERONICA_POLICY_FILE", str(path))
    assert main(["pools", "--redis", redis_url]) == 0
    assert "$0.05, 3 steps" in _rows(capsys.readouterr().out)["tenant:acme"]


def test_without_the_policy_file_it_says_where_the_limits_are(
    spent: tuple[Path, RedisLedger], redis_url: str, capsys: Any
) -> None:
    assert main(["pools", "--redis", redis_url]) == 0
    captured = capsys.readouterr()
    assert "LIMIT" not in captured.out and "tenant:acme" in captured.out
    assert "pass --policy FILE" in captured.err


def test_a_bad_policy_file_is_one_line(
    redis_url: str, tmp_path: Path, capsys: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VERONICA_REDIS_PREFIX", redis_prefix)
    bad = tmp_path / "bad.toml"
    bad.write_text('[pools."x"]\nmax_cost_usd = "lots"\n', encoding="utf-8")
    assert main(["pools", "--redis", redis_url, "--policy", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("veronica-otel pools: ") and err.count("\n") == 1
    assert main(["pools", "--redis", redis_url, "--policy", str(tmp_path / "none.toml")]) == 2
