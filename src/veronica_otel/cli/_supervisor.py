"""``veronica-otel run``: a supervisor one layer above the agent.

In-process limits stop calls; they cannot stop an agent stuck in its own
code. The supervisor starts the command in its own process group and, at the
deadline, sends SIGTERM to the whole group (children too), then SIGKILL after
a grace period. The kill is logged as a trip.

Ctrl-C escalates, and says so on stderr: the first SIGINT the supervisor
gets is forwarded to the command's group (the agent may shut down cleanly),
the second sends SIGTERM, the third SIGKILL -- an agent that ignores SIGINT
cannot keep running. A SIGTERM to the supervisor is forwarded as SIGTERM.
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


_ESCALATION = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is already gone
        os.killpg(pgid, sig)


def _say(text: str) -> None:
    # From a signal handler: os.write, not print (no re-entry into sys.stderr's buffer).
    with contextlib.suppress(OSError):
        os.write(2, f"veronica-otel run: {text}\n".encode())


class _Relay:
    """Passes the supervisor's SIGINT (escalating) and SIGTERM to the command's group.

    Installed before the command starts, so no signal slips between the two;
    one that arrives before the group exists is relayed as soon as it does.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.pgid: int | None = None
        self.interrupts = 0
        self.pending: list[int] = []

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        if self.pgid is None:
            self.pending.append(signum)
        else:
            self._relay(self.pgid, signum)

    def started(self, pgid: int) -> None:
        self.pgid = pgid
        for signum in self.pending:
            self._relay(pgid, signum)
        self.pending.clear()

    def _relay(self, pgid: int, signum: int) -> None:
        if signum != signal.SIGINT:
            _signal_group(pgid, signal.Signals(signum))
            return
        step = min(self.interrupts, len(_ESCALATION) - 1)
        self.interrupts += 1
        sig = _ESCALATION[step]
        then = f"; Ctrl-C again sends {_ESCALATION[step + 1].name}" if step < 2 else ""
        ordinal = ("", "second ", "third ")[step]
        _say(f"{ordinal}interrupt: {sig.name} sent to {self.name} (process group {pgid}){then}")
        _signal_group(pgid, sig)


def run_supervised(
    command: Sequence[str], timeout_s: float, grace_s: float = 5.0
) -> tuple[int, bool]:
    """Run ``command``; kill its process group at the deadline.

    Returns ``(exit status, killed)``: the command's own status, or ``-signal``
    when it was killed at the deadline.
    """
    relay = _Relay(command[0])
    previous = {sig: signal.signal(sig, relay) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        proc = subprocess.Popen(list(command), start_new_session=True)
        pgid = proc.pid  # start_new_session: the child leads its own group
        relay.started(pgid)
        started = time.monotonic()
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
