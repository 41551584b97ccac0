"""MkDocs hooks: pages that have one source elsewhere.

- ``<!-- veronica:readme -->`` (the home page) becomes README.md, its links
  to ``docs/`` pages made relative to the site;
- ``<!-- veronica:environment -->`` and ``<!-- veronica:policy-keys -->``
  become the tables of :mod:`veronica_otel._reference`, which a unit test
  keeps equal to what the code reads;
- ``<!-- veronica:example PATH -->`` becomes the file at PATH (from the
  repository root) as a Python block: the runnable example itself;
- ``frameworks.md`` stays the one file the framework sections are written
  in: each ``## `` or ``### `` section whose title names a framework moves to
  that framework's page (``<!-- veronica:moved -->`` there), so the overview
  keeps what is common and each page gets its own details;
- ``<!-- veronica:patched NAME ... -->`` becomes the list of SDK methods the
  instrumentor modules ``veronica_otel.instrumentors.NAME`` hook, read from
  their ``SDKHooks``: what a page says is patched is what the code patches;
- marked numbers (``<!--n:KEY-->N<!--/n-->``) come from ``docs/numbers.json``
  (see ``docs/_numbers.py``).
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from typing import Any

from veronica_otel._reference import environment_table, policy_table

_ROOT = Path(__file__).resolve().parent.parent
_REPO = "https://github.com/veronica-otel/veronica-otel/blob/main/"
sys.path.insert(0, str(_ROOT / "docs"))

from _numbers import render_numbers  # noqa: E402  (docs/ is not a package)

# Words in a frameworks.md section title -> the page the section moves to.
FRAMEWORK_PAGES = {
    "openai agents": "frameworks/openai-agents.md",
    "pydantic ai": "frameworks/pydantic-ai.md",
    "langgraph": "frameworks/langgraph.md",
    "langchain": "frameworks/langgraph.md",
    "crewai": "frameworks/crewai.md",
    "llamaindex": "frameworks/llama-index.md",
    "llama index": "frameworks/llama-index.md",
    "google adk": "frameworks/google-adk.md",
    "dspy": "frameworks/dspy.md",
    "smolagents": "frameworks/smolagents.md",
    "strands": "frameworks/strands.md",
    "ag2": "frameworks/ag2.md",
}
_FRAMEWORKS = _ROOT / "docs" / "frameworks.md"
_PATCHED = re.compile(r"<!-- veronica:patched ([\w ]+) -->")
_EXAMPLE = re.compile(r"<!-- veronica:example (\S+) -->")
_RELATIVE_LINK = re.compile(r"\]\((?!https?:|#|/|\.\./)([^)]+)\)")


def _readme() -> str:
    text = (_ROOT / "README.md").read_text(encoding="utf-8")
    text = text.replace("](docs/", "](")
    for name in ("CHANGELOG.md", "LICENSE", "examples/"):
        text = text.replace(f"]({name}", f"]({_REPO}{name}")
    return text


def page_of(title: str) -> str | None:
    """The page a frameworks.md section titled ``title`` belongs on, if any."""
    words = " " + re.sub(r"[^a-z0-9]+", " ", title.lower()).strip() + " "
    for name, page in FRAMEWORK_PAGES.items():
        if f" {name} " in words:
            return page
    return None


def split_frameworks(text: str) -> tuple[str, dict[str, list[str]]]:
    """frameworks.md without its per-framework sections, and those sections by page.

    A section is a ``## `` or ``### `` heading and what follows it up to the
    next such heading; one that moves becomes a ``## `` section of its page.
    """
    kept: list[str] = []
    moved: dict[str, list[str]] = {}
    for section in re.split(r"(?m)^(?=#{2,3} )", text):
        heading = re.match(r"#{2,3} (.*)", section)
        page = page_of(heading.group(1)) if heading else None
        if page is None:
            kept.append(section)
        else:
            body = "## " + section.split(" ", 1)[1]
            moved.setdefault(page, []).append(body.rstrip() + "\n")
    return "".join(kept), moved


def hook_targets(module: Any) -> list[str]:
    """``module.Owner.method`` for every hook of the ``SDKHooks`` in ``module``."""
    from veronica_otel.instrumentors._hooks import SDKHooks

    found: list[str] = []
    for value in vars(module).values():
        for hooks in value if isinstance(value, (list, tuple)) else (value,):
            if not isinstance(hooks, SDKHooks):
                continue
            for hook_set in hooks.sets:
                for hook in hook_set.hooks:
                    owner = f".{hook.owner}" if hook.owner else ""
                    target = f"{hooks.module}{owner}.{hook.method}"
                    if target not in found:
                        found.append(target)
    return found


def _patched(match: re.Match[str]) -> str:
    targets = []
    for name in match.group(1).split():
        path = f"veronica_otel.instrumentors.{name}"
        try:
            module = importlib.import_module(path)
        except ModuleNotFoundError as exc:
            if exc.name == path:  # a module another branch adds: nothing to list yet
                continue
            raise
        targets += [f"- `{target}`" for target in hook_targets(module)]
    return "\n".join(targets)


def _example(match: re.Match[str]) -> str:
    path = match.group(1)
    code = (_ROOT / path).read_text(encoding="utf-8").rstrip()
    return f"`{path}`:\n\n```python\n{code}\n```"


def on_page_markdown(markdown: str, page: Any = None, **kwargs: Any) -> str:
    if "<!-- veronica:readme -->" in markdown:
        markdown = markdown.replace("<!-- veronica:readme -->", _readme())
    src = getattr(getattr(page, "file", None), "src_uri", "")
    if src == "frameworks.md":
        markdown, _ = split_frameworks(markdown)
    if "<!-- veronica:moved -->" in markdown:
        _, moved = split_frameworks(_FRAMEWORKS.read_text(encoding="utf-8"))
        sections = "\n".join(moved.get(src, []))
        markdown = markdown.replace(
            "<!-- veronica:moved -->", _RELATIVE_LINK.sub(r"](../\1)", sections)
        )
    markdown = _EXAMPLE.sub(_example, markdown)
    markdown = _PATCHED.sub(_patched, markdown)
    markdown = render_numbers(markdown)
    return markdown.replace("<!-- veronica:environment -->", environment_table()).replace(
        "<!-- veronica:policy-keys -->", policy_table()
    )
