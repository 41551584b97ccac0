"""The one demo run the end-to-end tests share.

``veronica-otel demo`` takes about 3 CPU-seconds; ``test_cli_errors`` reads
its table, hint and graphs, ``test_numbers`` its counts. Both modules run on
one pytest-xdist worker (``tests/conftest.py``), so the demo runs once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

DemoRun = tuple[Path, subprocess.CompletedProcess[str]]


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """``python -m veronica_otel.cli demo`` in a folder of its own, in a shell whose
    PATH does not have the venv's scripts: the folder and the process."""
    cwd = tmp_path_factory.mktemp("demo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERONICA_")}
    result = subprocess.run(
        [sys.executable, "-m", "veronica_otel.cli", "demo", "--out", "graphs"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "PATH": "/usr/bin:/bin"},
        cwd=cwd,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return cwd, result
