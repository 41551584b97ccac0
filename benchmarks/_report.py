"""What every benchmark script's JSON starts with, and how it is printed.

The scripts import it as a sibling (``python benchmarks/bench_x.py`` puts
``benchmarks/`` first on ``sys.path``), so each one still runs alone.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import sys
from typing import Any

__all__ = ["emit", "environment"]


def environment(benchmark: str) -> dict[str, Any]:
    """The benchmark's name, the date and the machine it ran on."""
    try:
        load: list[float] | None = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not available on this platform
        load = None
    return {
        "benchmark": benchmark,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average": load,
    }


def emit(report: dict[str, Any]) -> int:
    """Print ``report`` as the script's one JSON object; the exit status."""
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
