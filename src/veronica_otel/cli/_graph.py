"""``veronica-otel graph FILE``: an execution graph as a terminal tree or HTML."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

__all__ = ["show_graph"]


def show_graph(args: argparse.Namespace) -> int:
    """Print the graph in ``args.file`` as a tree, or write ``--html OUT``."""
    from veronica_otel.exporters.graph import load_graph, render_html, render_text_tree

    try:
        graph = load_graph(args.file)
    except FileNotFoundError:
        print(f"veronica-otel graph: no such file: {args.file}", file=sys.stderr)
        return 1
    except (ValueError, json.JSONDecodeError) as exc:
        print(f"veronica-otel graph: {args.file} is not a graph file: {exc}", file=sys.stderr)
        return 1
    if args.html is None:
        print(render_text_tree(graph))
        return 0
    directory = os.path.dirname(os.path.abspath(args.html))
    with tempfile.NamedTemporaryFile("w", dir=directory, delete=False, suffix=".tmp") as tmp:
        tmp.write(render_html(graph))
    os.replace(tmp.name, args.html)
    print(f"wrote {args.html}")
    return 0
