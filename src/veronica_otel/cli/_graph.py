"""``veronica-otel graph``: execution graphs as a terminal tree or HTML.

From a graph file the ``veronica_graph`` exporter wrote (``graph FILE``), or
from traces stored in Jaeger, read through its query API (``graph --jaeger
URL --trace ID`` or ``--service NAME [--last N]``): the same views, one per
chain found.
"""

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

    problem = _source_problem(args)
    if problem is not None:
        print(f"veronica-otel graph: {problem} (see veronica-otel graph --help)", file=sys.stderr)
        return 2
    if args.jaeger is not None:
        return _show_from_jaeger(args)
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


def _source_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the choice of FILE or --jaeger (None when it is right)."""
    if args.jaeger is None:
        if args.trace is not None or args.service is not None:
            return "--trace and --service read from Jaeger: give --jaeger URL too"
        if args.file is None:
            return "give a graph file, or --jaeger URL with --trace ID or --service NAME"
        return None
    if args.file is not None:
        return "give a graph FILE or --jaeger URL, not both"
    if args.trace is None and args.service is None:
        return "--jaeger needs --trace ID or --service NAME"
    if args.last < 1:
        return f"--last must be 1 or more, got {args.last}"
    return None


def _show_from_jaeger(args: argparse.Namespace) -> int:
    """The chains of one trace, or of a service's latest traces, read from Jaeger."""
    from datetime import timedelta

    from veronica_otel.exporters._graph_model import chain_key
    from veronica_otel.exporters.graph import _file_stem, render_html, render_text_tree
    from veronica_otel.exporters.jaeger_query import (
        JaegerQuery,
        JaegerQueryError,
        graphs_from_spans,
    )

    try:
        query = JaegerQuery(args.jaeger)
        if args.trace is not None:
            spans = query.trace(args.trace)
            where = f"trace {args.trace}"
        else:
            spans = query.find(
                args.service, limit=args.last, lookback=timedelta(seconds=args.lookback)
            )
            where = f"the last {args.last} trace(s) of service {args.service!r}"
    except ValueError as exc:
        return _fail(str(exc))
    except JaegerQueryError as exc:
        return _fail(str(exc))
    if not spans:
        return _fail(f"Jaeger at {args.jaeger} has no spans for {where}")
    graphs = graphs_from_spans(spans)
    if not graphs:
        return _fail(f"no veronica chain in {where} ({len(spans)} spans, none from a chain)")
    if args.html is None:
        for index, graph in enumerate(graphs):
            if index:
                print()
            print(f"trace {', '.join(graph['trace_ids'])}")
            print(render_text_tree(graph))
        return 0
    folder = Path(args.html)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for graph in graphs:
            out = folder / f"{_file_stem(chain_key(graph['chain_id']))}.html"  # as the exporter
            _write_atomically(out, render_html(graph))
            print(f"wrote {out}")
    except FileExistsError as exc:
        return _fail(f"--html {args.html} must be a folder here: {exc.filename} is a file")
    except OSError as exc:
        return _fail(f"cannot write {args.html}: {exc.strerror or exc}")
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
