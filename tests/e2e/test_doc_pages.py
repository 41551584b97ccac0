"""The provider and framework pages: each snippet runs as pasted, each page has its parts.

Every provider page's first Python block, and the README's, is run as
pasted, from its own file as ``__main__`` in a process of its own, with the
real SDK against the bundled fake server, and must print the denial and the
count the server received (the processes are forked from one that imported
what the blocks import: :func:`tests.e2e._pasted.run_pasted`); the framework
pages' sections come from ``docs/frameworks.md`` by the site hook, which is
checked here too.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PROVIDER_PAGES = sorted((DOCS / "providers").glob("*.md"))
FRAMEWORK_PAGES = sorted((DOCS / "frameworks").glob("*.md"))
PARTS = ("**Install:**", "**What is patched", "**What is counted and priced", "**What a denial")

sys.path.insert(0, str(DOCS))
import hooks  # noqa: E402  (docs/ is not a package)

from tests.e2e._pasted import run_pasted  # noqa: E402
from tests.e2e.test_docs import first_python_block, snippet_environment  # noqa: E402


def test_every_provider_and_framework_has_its_page() -> None:
    assert {p.stem for p in PROVIDER_PAGES} == {
        "openai", "anthropic", "google-genai", "bedrock", "mistralai", "cohere", "groq",
        "ollama", "litellm", "mcp", "vendor-guard",
    }  # fmt: skip
    assert {p.stem for p in FRAMEWORK_PAGES} == {
        "openai-agents", "pydantic-ai", "langgraph", "crewai", "llama-index", "google-adk",
        "dspy", "smolagents", "strands", "ag2",
    }  # fmt: skip
    for page in PROVIDER_PAGES + FRAMEWORK_PAGES:
        text = page.read_text(encoding="utf-8")
        missing = [part for part in PARTS if part not in text]
        assert not missing, f"{page.name} lacks {missing}"


@pytest.fixture(scope="module")
def snippet_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, subprocess.CompletedProcess[str]]:
    """Each provider page's first Python block, and the README's (``README``), run
    once (its exit status and output)."""
    folder = tmp_path_factory.mktemp("pasted")
    pages = [*PROVIDER_PAGES, README]
    scripts = []
    for page in pages:
        scripts.append(folder / f"{page.stem}.py")
        scripts[-1].write_text(first_python_block(page), encoding="utf-8")
    ran = run_pasted(scripts, folder / "runs", snippet_environment())
    return {page.stem: result for page, result in zip(pages, ran, strict=True)}


def test_the_readmes_first_python_block_runs_as_written(
    snippet_runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    result = snippet_runs["README"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert "denied before sending:" in result.stdout
    assert "requests the server received: 3\n" in result.stdout
    shown = re.search(r"It prints:\n\n```text\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert shown is not None  # what the README says it prints is what it prints
    for said, printed in zip(shown.group(1).splitlines(), result.stdout.splitlines(), strict=True):
        head = said.split("...")[0]
        assert printed.startswith(head), (said, printed)


@pytest.mark.parametrize("page", PROVIDER_PAGES, ids=lambda p: p.stem)
def test_the_provider_pages_snippet_runs_as_pasted(
    page: Path, snippet_runs: dict[str, subprocess.CompletedProcess[str]]
) -> None:
    result = snippet_runs[page.stem]
    assert result.returncode == 0, result.stderr[-3000:]
    assert "denied before sending: chain " in result.stdout
    # The server (or the MCP tool) saw exactly the calls the chain allowed.
    assert re.search(
        r"^(requests the server received|tool runs the server made): 3$", result.stdout, re.M
    )
    shown = re.findall(r"```text\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL)[-1]
    denial = next(line for line in result.stdout.splitlines() if line.startswith("denied"))
    said = shown.splitlines()[0]
    assert denial.split(": ", 2)[2] == said.split(": ", 2)[2], (said, denial)


def test_each_framework_page_shows_its_example_and_what_its_code_hooks() -> None:
    for page in FRAMEWORK_PAGES:
        text = page.read_text(encoding="utf-8")
        examples = re.findall(r"<!-- veronica:example (\S+) -->", text)
        assert len(examples) == 1, page.name
        assert (ROOT / examples[0]).is_file(), examples[0]
        rendered = hooks.on_page_markdown(text)
        assert "<!-- veronica:" not in rendered, page.name
        if "veronica:patched" in text:  # the methods listed are the SDKHooks' own
            assert re.search(r"^- `[\w.]+\.\w+`$", rendered, re.M), page.name
    listed = hooks.hook_targets(importlib.import_module("veronica_otel.instrumentors.crewai"))
    assert "crewai.agent.core.Agent.execute_task" in listed


def test_framework_sections_move_to_their_pages() -> None:
    text = (
        "# F\n\nintro\n\n## CrewAI\n\ncrew [x](concepts.md)\n\n"
        "## Agent frameworks\n\ntable\n\n### LangGraph\n\n- **Steps:** lg\n\n"
        "### Notes\n\nkept\n\n## LangChain\n\nlc\n"
    )
    kept, moved = hooks.split_frameworks(text)
    assert kept == "# F\n\nintro\n\n## Agent frameworks\n\ntable\n\n### Notes\n\nkept\n\n"
    assert moved == {
        "frameworks/crewai.md": ["## CrewAI\n\ncrew [x](concepts.md)\n"],
        "frameworks/langgraph.md": ["## LangGraph\n\n- **Steps:** lg\n", "## LangChain\n\nlc\n"],
    }
    assert hooks.page_of("pydantic-ai: agents") == "frameworks/pydantic-ai.md"
    assert hooks.page_of("Agents and pools") is None
    # Every page the hook moves sections to exists, and has the marker they go to.
    for page in set(hooks.FRAMEWORK_PAGES.values()):
        assert "<!-- veronica:moved -->" in (DOCS / page).read_text(encoding="utf-8"), page
