"""The graph page as a browser renders it: headless Chromium, a screenshot and the DOM.

Skipped when no Chromium is installed (Debian: ``apt-get install -y chromium``).
"""

from __future__ import annotations

import importlib.util
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "graph_screenshot.py"
WIDTH, HEIGHT = 1000, 700
TRIP_RED = (0xC6, 0x28, 0x28)  # --trip in the page's CSS


def _script() -> object:
    spec = importlib.util.spec_from_file_location("graph_screenshot", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if _script().chromium() is None:  # type: ignore[attr-defined]
    pytest.skip(
        "no Chromium to render the graph (apt-get install -y chromium)", allow_module_level=True
    )


def _pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and unfiltered rows of an 8-bit RGB or RGBA PNG."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind, body = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert header is not None
    width, height, depth, colour = header[:4]
    assert depth == 8 and colour in (2, 6), header
    bpp = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        kind, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = previous[x]
            c = previous[x - bpp] if x >= bpp else 0
            if kind == 1:
                line[x] = (line[x] + a) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + b) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line) if bpp == 3 else bytes(v for i, v in enumerate(line) if i % 4 != 3))
        previous = line
    return width, height, rows


def test_the_graph_page_renders_with_its_numbers(tmp_path: Path) -> None:
    png, dom = tmp_path / "graph.png", tmp_path / "graph.dom.html"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--png",
            str(png),
            "--dom",
            str(dom),
            "--width",
            str(WIDTH),
            "--height",
            str(HEIGHT),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    width, height, rows = _pixels(png.read_bytes())
    assert (width, height) == (WIDTH, HEIGHT)
    colours = {row[i : i + 3] for row in rows[::4] for i in range(0, len(row), 12)}
    assert len(colours) > 20, "the screenshot is blank"
    assert any(bytes(TRIP_RED) in row for row in rows), "no trip row painted red"
    page = dom.read_text(encoding="utf-8")
    assert 'data-ready="true"' in page  # the page's script ran under its CSP
    # The numbers of the planner/critic chain, as the browser has them.
    assert "<th>steps</th><td>9 = 9 LLM calls + 0 tool calls</td>" in page
    assert "<th>LLM calls</th><td>10 (1 denied, never sent)</td>" in page
    assert "<th>agents</th><td>2 (critic, planner; 10 turns)</td>" in page
    assert "agents 'planner' and 'critic' alternate 10 times" in page
    assert "trip: loop (limit 8, observed 9)" in page
    assert page.count('<tr class="node') == 21  # the chain, 10 turns, 10 calls
    assert "<h2>Legend</h2>" in page
