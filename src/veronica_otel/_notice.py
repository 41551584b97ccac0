"""Warnings that reach the user when the app configured no logging.

A library's warnings are usually left to the app's logging, but an app that
configured none would never see them (a Redis without persistence, an
instrumentor that could not install). OpenTelemetry's SDK relies on Python's
last-resort handler for this; we do the same with one difference: each kind
of warning is printed once per process, as one line, with no traceback.

:class:`StderrFallback` sits on the ``veronica_otel`` logger. It prints only
while the root logger has no handler: once the app configures logging, our
records go wherever the app sends them, and nothing is printed twice.
Records a caller already printed itself carry ``extra={PRINTED: True}``.
The trips channel (``veronica_otel.trips``) is data, not a warning: a denied
call already raises.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["PRINTED", "StderrFallback"]

PRINTED = "veronica_printed"
_MAX_KINDS = 256  # distinct warnings remembered; beyond it, the oldest is forgotten


class StderrFallback(logging.Handler):
    """One line on stderr per kind of warning, while the app has no logging."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self._printed: dict[object, None] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers or getattr(record, PRINTED, False):
            return
        if record.name.startswith("veronica_otel.trips"):
            return
        kind = (record.name, record.msg)  # the template: its arguments vary per call
        if kind in self._printed:
            return
        self._printed[kind] = None
        if len(self._printed) > _MAX_KINDS:
            del self._printed[next(iter(self._printed))]
        try:
            message = record.getMessage().splitlines()[0] if record.getMessage() else ""
            sys.stderr.write(f"veronica-otel: {record.levelname}: {message}\n")
        except Exception:  # a closed stderr must not break the call being made
            self.handleError(record)
