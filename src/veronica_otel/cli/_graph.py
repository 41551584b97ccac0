"""``veronica-otel graph FILE``: an execution graph as a terminal tree or HTML."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

__all__ = ["show_graph"]


def show_graph(args: argparse.Namespace) -> int:
    """Print the graph in ``args.file`` as a tree, or write ``--html OUT``."""
    from veronica_otel.exporters.graph import load_graph, render_html, render_text_tree

    try:
        graph = load_graph(args.file)
    except FileNotFoundError:
        return _fail(f"no such file: {args.file}")
    except OSError as exc:  # a directory, no permission, ...
        return _fail(f"cannot read {args.file}: {exc.strerror or exc}")
    except (ValueError, json.JSONDecodeError) as exc:
        return _fail(f"{args.file} is not a graph file: {exc}")
    if args.html is None:
        print(render_text_tree(graph))
        return 0
    out = Path(args.html)
    if out.is_dir():
        return _fail(f"--html {args.html} is a directory; name the file, e.g. {out / 'graph.html'}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)  # a new folder is fine
        _write_atomically(out, render_html(graph))
    except FileExistsError as exc:  # mkdir: a file is in the way
        return _fail(f"cannot write {args.html}: {exc.filename} is not a directory")
    except OSError as exc:
        return _fail(f"cannot write {args.html}: {exc.strerror or exc}")
    print(f"wrote {args.html}")
    return 0


def _fail(problem: str) -> int:
    print(f"veronica-otel graph: {problem}", file=sys.stderr)
    return 1


def _write_atomically(out: Path, text: str) -> None:
    """Readers see the old file or the whole new one, never half of it."""
    with tempfile.NamedTemporaryFile(
        "w", dir=out.parent, delete=False, suffix=".tmp", encoding="utf-8"
    ) as tmp:
        try:
            tmp.write(text)
            os.chmod(tmp.name, 0o666 & ~_umask())  # as open() would: temp files are 0600
        except BaseException:
            tmp.close()
            os.unlink(tmp.name)
            raise
    try:
        os.replace(tmp.name, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp.name)
        raise


def _umask() -> int:
    mask = os.umask(0o022)  # read by setting: put back at once (the CLI is one thread)
    os.umask(mask)
    return mask
