"""The documentation: the site builds with no warning and the README stays a
five-minute read (its first example runs exactly as written: test_doc_pages,
with the provider pages' snippets)."""

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


def test_the_readme_is_a_five_minute_read() -> None:
    assert len(README.read_text(encoding="utf-8").split()) <= 1800


def test_the_readmes_first_example_is_the_quickstart_script() -> None:
    first = re.search(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    script = (ROOT / "examples" / "quickstart.py").read_text(encoding="utf-8")
    assert first is not None
    assert script.endswith(first.group(1)), "README and examples/quickstart.py disagree"
