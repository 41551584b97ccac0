"""MkDocs hooks: pages that have one source elsewhere.

- ``<!-- veronica:readme -->`` (the home page) becomes README.md, its links
  to ``docs/`` pages made relative to the site;
- ``<!-- veronica:environment -->`` and ``<!-- veronica:policy-keys -->``
  become the tables of :mod:`veronica_otel._reference`, which a unit test
  keeps equal to what the code reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from veronica_otel._reference import environment_table, policy_table

_ROOT = Path(__file__).resolve().parent.parent
_REPO = "https://github.com/veronica-otel/veronica-otel/blob/main/"


def _readme() -> str:
    text = (_ROOT / "README.md").read_text(encoding="utf-8")
    text = text.replace("](docs/", "](")
    for name in ("CHANGELOG.md", "LICENSE"):
        text = text.replace(f"]({name})", f"]({_REPO}{name})")
    return text


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    if "<!-- veronica:readme -->" in markdown:
        markdown = markdown.replace("<!-- veronica:readme -->", _readme())
    return markdown.replace("<!-- veronica:environment -->", environment_table()).replace(
        "<!-- veronica:policy-keys -->", policy_table()
    )
