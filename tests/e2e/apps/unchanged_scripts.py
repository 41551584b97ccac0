"""Unchanged scripts as scenarios of one zero-code process (``FrameworkApp``).

Run under ``opentelemetry-instrument``: each scenario names a script, which
runs as ``__main__`` in a process forked from this one once openai (what they
call) is imported, under the scenario's ``VERONICA_*`` variables and a
default chain built from them as zero code's start-up builds it
(``frameworks/_report.py``). What else a script imports (mcp,
``langchain_core``) it imports itself, after the fork, so the distro's
import hooks patch it there as they would in a process of its own.
"""

from __future__ import annotations

import runpy
from collections.abc import Callable

import openai  # noqa: F401  (imported once, before the fork)
from frameworks._report import run


class _Scripts(dict[str, Callable[[], object]]):
    def __missing__(self, path: str) -> Callable[[], object]:
        return lambda: runpy.run_path(path, run_name="__main__")


run(_Scripts())
