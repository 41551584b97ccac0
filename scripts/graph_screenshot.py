"""Render a real chain's execution graph in headless Chromium: a PNG and the page's DOM.

Runs the planner/critic loop of ``examples/planner_critic.py`` (real ``openai``
SDK against the embedded fake LLM server, ``max_handoffs=8``), writes its graph
with the ``veronica_graph`` exporter, then takes a screenshot of the HTML view
and dumps the DOM Chromium rendered (after the page's script ran).

Chromium comes from Debian: ``apt-get install -y chromium``. Usage::

    python scripts/graph_screenshot.py --png docs/graph-planner-critic.png

Exit status 2 when no Chromium is found (set ``CHROMIUM`` to its path).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["chromium", "dump_dom", "planner_critic_graph", "screenshot"]

WIDTH, HEIGHT = 1280, 1000
_TIMEOUT_S = 120  # a cold start on a busy 2-core machine; one usually takes 2 s


def chromium() -> str | None:
    """The Chromium executable: ``$CHROMIUM`` (None if not one), else the first on the PATH."""
    found = os.environ.get("CHROMIUM")
    if found:
        return shutil.which(found)
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path is not None:
            return path
    return None


def _run(browser: str, *args: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as profile:  # no state shared with a user's browser
        return subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",  # containers run as root
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                f"--user-data-dir={profile}",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
            check=True,
        )


def screenshot(
    browser: str, html: Path, png: Path, width: int = WIDTH, height: int = HEIGHT
) -> None:
    """Write a ``width`` x ``height`` PNG of ``html`` as Chromium renders it."""
    png.parent.mkdir(parents=True, exist_ok=True)
    _run(browser, f"--window-size={width},{height}", f"--screenshot={png}", html.as_uri())
    if not png.is_file():
        raise RuntimeError(f"{browser} wrote no screenshot to {png}")


def dump_dom(browser: str, html: Path) -> str:
    """The DOM of ``html`` after its script ran, serialised by Chromium."""
    return _run(browser, "--dump-dom", html.as_uri()).stdout


def planner_critic_graph(out_dir: Path) -> Path:
    """Run the contained planner/critic loop with the graph exporter; its HTML file.

    Installs the SDK tracer provider when none is (this is a program, not a
    library), as ``veronica-otel demo --out`` does.
    """
    import openai

    from veronica_otel import BudgetExceededError, ExecutionConfig, ExecutionContext
    from veronica_otel.cli._demo import trace_to_graph
    from veronica_otel.cli._demo_scenarios import planner_critic
    from veronica_otel.instrumentors.openai import OpenAIInstrumentor
    from veronica_otel.testing import FakeLLMServer

    finish = trace_to_graph(str(out_dir))
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    try:
        with FakeLLMServer(output_tokens=40) as server:
            client = openai.OpenAI(base_url=server.openai_base_url, api_key="demo", max_retries=0)
            try:
                config = ExecutionConfig(max_handoffs=8, max_cost_usd=0.5)
                with ExecutionContext(config, name="planner-critic"):
                    planner_critic(client)
            except BudgetExceededError:
                pass  # the loop trip this picture shows
            finally:
                client.close()
    finally:
        instrumentor.uninstrument()
    written = finish()
    if len(written) != 1:
        raise RuntimeError(f"expected one graph in {out_dir}, found {written}")
    return written[0][1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--png", type=Path, default=Path("docs/graph-planner-critic.png"))
    parser.add_argument("--dom", type=Path, help="also write the rendered DOM here")
    parser.add_argument("--html-dir", type=Path, help="keep the graph files here")
    parser.add_argument("--width", type=int, default=WIDTH)
    parser.add_argument("--height", type=int, default=HEIGHT)
    args = parser.parse_args(argv)
    browser = chromium()
    if browser is None:
        print("graph_screenshot: no Chromium found (apt-get install -y chromium)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        out_dir = args.html_dir or Path(scratch)
        html = planner_critic_graph(out_dir)
        screenshot(browser, html, args.png, args.width, args.height)
        print(f"wrote {args.png} ({args.width}x{args.height}) from {html}")
        if args.dom is not None:
            args.dom.write_text(dump_dom(browser, html), encoding="utf-8")
            print(f"wrote {args.dom}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
