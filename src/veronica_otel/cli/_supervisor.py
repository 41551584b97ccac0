"""``veronica-otel run``: a supervisor one layer above the agent.

In-process limits stop calls; they cannot stop an agent stuck in its own
code. The supervisor starts the command in its own process group and, at the
deadline, sends SIGTERM to the whole group (children too), then SIGKILL after
a grace period. The kill is logged as a trip.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from types import FrameType

from veronica_otel._errors import TripEvent
from veronica_otel._trips import emit_trip

__all__ = ["run_supervised"]

_logger = logging.getLogger("veronica_otel.supervisor")


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is already gone
        os.killpg(pgid, sig)


def run_supervised(
    command: Sequence[str], timeout_s: float, grace_s: float = 5.0
) -> tuple[int, bool]:
    """Run ``command``; kill its process group at the deadline.

    Returns ``(exit status, killed)``: the command's own status, or ``-signal``
    when it was killed at the deadline.
    """
    proc = subprocess.Popen(list(command), start_new_session=True)
    pgid = proc.pid  # start_new_session: the child leads its own group

    def forward(signum: int, _frame: FrameType | None) -> None:
        _signal_group(pgid, signal.Signals(signum))

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    started = time.monotonic()
    try:
        try:
            return proc.wait(timeout=timeout_s), False
        except subprocess.TimeoutExpired:
            pass
        elapsed_ms = (time.monotonic() - started) * 1000
        emit_trip(
            TripEvent(
                "timeout",
                timeout_s * 1000,
                elapsed_ms,
                f"run:{pgid}",
                f"veronica-otel run: {command[0]} (process group {pgid}) passed its "
                f"{timeout_s:g}s deadline; sending SIGTERM, SIGKILL after {grace_s:g}s",
            )
        )
        _signal_group(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _logger.warning("process group %d ignored SIGTERM; sending SIGKILL", pgid)
        # Children may outlive a leader that exited on SIGTERM: finish the group.
        _signal_group(pgid, signal.SIGKILL)
        status = proc.wait()
        return status, True
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
