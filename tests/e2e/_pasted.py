"""Short scripts run as pasted, each a process of its own, sharing their imports.

:func:`run_pasted` runs ``apps/pasted_scripts.py``: each script as
``__main__`` from its own file in a process forked from one that imported
what the scripts import at their top (most of what a short script costs).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

RUNNER = Path(__file__).parent / "apps" / "pasted_scripts.py"


def run_pasted(
    scripts: Sequence[Path], folder: Path, env: Mapping[str, str] | None = None
) -> list[subprocess.CompletedProcess[str]]:
    """How each of ``scripts`` ended (its exit status, stdout, stderr), in order.

    The N-th runs in ``folder/N`` with this interpreter and ``env`` (this
    process's environment by default).
    """
    done = subprocess.run(
        [sys.executable, str(RUNNER), str(folder), *map(str, scripts)],
        capture_output=True,
        text=True,
        timeout=600,
        env=None if env is None else dict(env),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = []
    for n, script in enumerate(scripts):
        ran = folder / str(n)
        results.append(
            subprocess.CompletedProcess(
                [str(script)],
                int((ran / "status").read_text()),
                (ran / "out").read_text(encoding="utf-8"),
                (ran / "err").read_text(encoding="utf-8"),
            )
        )
    return results
