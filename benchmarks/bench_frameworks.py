"""Each agent framework's own cap against ours, on a runaway model.

For every framework, its example in ``examples/frameworks/`` runs in a venv
built as its users install it (``tests/_venvs.py``, cached outside the
clone): the agent, with one tool, against the fake server playing a runaway
model (every reply asks for another tool call). First under the framework's
own cap alone (or a bound, where it has none), then in a chain with
``max_steps=3``. What is compared is what reached the server: the number of
model requests, and how each run ended.

Run: python benchmarks/bench_frameworks.py [--quick] (``--quick``: the
openai-agents example only). Builds missing venvs first (minutes each).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _report import emit, environment

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import _venvs  # noqa: E402

EXAMPLES = ROOT / "examples" / "frameworks"
# (example, venv recipe in tests/_venvs.py)
RUNS = (
    ("openai_agents_handoffs.py", "FRAMEWORKS_OPENAI_3"),
    ("pydantic_ai_agent.py", "FRAMEWORKS_OPENAI_3"),
    ("langgraph_agent.py", "FRAMEWORKS_OPENAI_3"),
    ("crewai_crew.py", "FRAMEWORKS_OPENAI_2"),
    ("llama_index_agent.py", "FRAMEWORKS_OPENAI_2"),
    ("google_adk_agent.py", "FRAMEWORK_ADK"),
    ("strands_agent.py", "FRAMEWORK_STRANDS"),
    ("smolagents_agent.py", "FRAMEWORK_SMOLAGENTS"),
    ("ag2_agent.py", "FRAMEWORK_AG2"),
    ("dspy_react.py", "FRAMEWORK_DSPY"),
)
_LINE = re.compile(
    r"^(?P<framework>\S+) (?P<who>own cap|ours) \((?P<cap>[^)]*)\): "
    r"(?P<requests>\d+) requests, then (?P<ended>.+)$"
)


def _versions(venv: Path) -> dict[str, str]:
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    wanted = (
        "openai",
        "anthropic",
        "google-genai",
        "boto3",
        "litellm",
        "openai-agents",
        "pydantic-ai-slim",
        "langgraph",
        "langchain-openai",
        "crewai",
        "llama-index-core",
        "llama-index-llms-openai",
        "google-adk",
        "strands-agents",
        "smolagents",
        "ag2",
        "dspy",
    )
    pairs = (line.split("==", 1) for line in out.splitlines() if "==" in line)
    return {name.lower(): version for name, version in pairs if name.lower() in wanted}


def _run(example: str, recipe: str) -> dict[str, Any]:
    venv = _venvs.venv(recipe.lower(), getattr(_venvs, recipe))
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("VERONICA_", "OTEL_", "OPENAI_", "PYTHON"))
    }
    start = time.monotonic()
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-W", "ignore", example],
        cwd=EXAMPLES,
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    rows = [m.groupdict() for m in map(_LINE.match, done.stdout.splitlines()) if m]
    return {
        "example": example,
        "versions": _versions(venv),
        "seconds": round(time.monotonic() - start, 1),
        "exit": done.returncode,
        "runs": [{**row, "requests": int(row["requests"])} for row in rows],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the openai-agents example only")
    args = parser.parse_args()
    runs = RUNS[:1] if args.quick else RUNS
    return emit({**environment("frameworks"), "results": [_run(e, r) for e, r in runs]})


if __name__ == "__main__":
    sys.exit(main())
