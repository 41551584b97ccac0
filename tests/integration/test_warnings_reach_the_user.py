"""Warnings reach the user's terminal when the app configured no logging.

The app is a subprocess that uses a real Valkey without persistence, as a
user would; the store warns. With no logging configured the warning is one
line on stderr, printed once; with logging configured it goes only where the
app's logging sends it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from veronica_otel.testing import RedisServerProcess

APP = textwrap.dedent(
    """
    import logging, sys
    if sys.argv[2] == "configured":
        logging.basicConfig(stream=sys.stdout, format="app-log %(levelname)s %(message)s")
    from veronica_otel import ExecutionConfig, ExecutionContext, WrapOptions
    from veronica_otel.distributed import RedisLedger
    for _ in range(3):  # three ledgers, three checks of the same store: one line
        ledger = RedisLedger.from_url(sys.argv[1])
        with ExecutionContext(ExecutionConfig(max_steps=5), ledger=ledger) as ctx:
            ctx.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.01))
    print("done")
    """
)


def _run(redis_server: RedisServerProcess, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", APP, redis_server.url, mode],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def test_with_no_logging_the_persistence_warning_is_one_line_on_stderr(
    redis_server: RedisServerProcess,
) -> None:
    result = _run(redis_server, "bare")
    lines = [line for line in result.stderr.splitlines() if "no persistence" in line]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("veronica-otel: WARNING: ledger store ")
    assert "Traceback" not in result.stderr
    assert result.stdout == "done\n"


def test_with_logging_configured_it_goes_to_the_apps_handler_only(
    redis_server: RedisServerProcess,
) -> None:
    result = _run(redis_server, "configured")
    assert "no persistence" not in result.stderr
    assert "app-log WARNING ledger store" in result.stdout
