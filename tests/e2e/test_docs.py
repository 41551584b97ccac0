"""The documentation: the site builds with no warning, the README's first example
runs exactly as written, and the README stays a five-minute read."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests._venvs import plain_http_tls

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MKDOCS = Path(sys.executable).parent / "mkdocs"


def first_python_block(page: Path) -> str:
    first = re.search(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL)
    assert first is not None, f"{page.name} has no Python block"
    return first.group(1)


def snippet_environment() -> dict[str, str]:
    """This process's environment, as a snippet's reader runs it against the bundled server."""
    return {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no network at import
        **plain_http_tls(),  # the bundled server is plain HTTP
    }


def run_first_python_block(page: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the first Python block of ``page`` as pasted, in a fresh interpreter in ``cwd``."""
    script = cwd / "first.py"
    script.write_text(first_python_block(page), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        env=snippet_environment(),
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    home = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "A first example" in home  # the README is the home page
    reference = (tmp_path / "site" / "configuration" / "index.html").read_text(encoding="utf-8")
    assert "VERONICA_VENDOR_GUARD" in reference  # rendered from _reference
    assert "pools.&quot;name&quot;.window" in reference or 'pools."name".window' in reference


def test_the_readmes_first_python_block_runs_as_written(tmp_path: Path) -> None:
    result = run_first_python_block(README, tmp_path)
    assert "denied before sending:" in result.stdout
    assert "requests the server received: 3\n" in result.stdout
    shown = re.search(r"It prints:\n\n```text\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert shown is not None  # what the README says it prints is what it prints
    for said, printed in zip(shown.group(1).splitlines(), result.stdout.splitlines(), strict=True):
        head = said.split("...")[0]
        assert printed.startswith(head), (said, printed)


def test_the_readme_is_a_five_minute_read() -> None:
    assert len(README.read_text(encoding="utf-8").split()) <= 1800


def test_the_readmes_first_example_is_the_quickstart_script() -> None:
    first = re.search(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    script = (ROOT / "examples" / "quickstart.py").read_text(encoding="utf-8")
    assert first is not None
    assert script.endswith(first.group(1)), "README and examples/quickstart.py disagree"
