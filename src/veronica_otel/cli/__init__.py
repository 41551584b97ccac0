"""The ``veronica-otel`` command line: demo, graph, run, override.

Exit codes: 0 success; 1 a command failed; 2 bad usage; 3 ``run`` killed the
command at its deadline; otherwise ``run`` passes on the command's own status.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 3


def _demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo, trace_to_graph

    print("veronica-otel demo: runaway agent chains against an embedded fake LLM server\n")
    finish = trace_to_graph(args.out)
    run_demo()
    written = finish()
    if written:
        print(f"\nexecution graphs, one per chain, in {args.out}/ (open the .html in a browser):")
        for name, path in written:
            print(f"  {name:<34} {path}")
        print(f"in a terminal: veronica-otel graph {written[-1][1].with_suffix('.json')}")
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    from ._supervisor import run_supervised

    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("veronica-otel run: give a command after --", file=sys.stderr)
        return EXIT_USAGE
    try:
        status, killed = run_supervised(command, args.timeout, args.grace)
    except FileNotFoundError:
        print(f"veronica-otel run: command not found: {command[0]}", file=sys.stderr)
        return 127
    if killed:
        print(
            f"veronica-otel run: {command[0]} passed its {args.timeout:g}s deadline; "
            "its whole process group was stopped",
            file=sys.stderr,
        )
        return EXIT_TIMEOUT
    return status if status >= 0 else 128 - status


def _override(args: argparse.Namespace) -> int:
    from ._override import apply_override

    return apply_override(args)


def _graph(args: argparse.Namespace) -> int:
    from ._graph import show_graph

    return show_graph(args)


def _positive_seconds(text: str) -> float:
    from ._durations import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="veronica-otel",
        description="Chain-level containment for LLM agents, inside OpenTelemetry.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="run the runaway scenarios uncontained and contained",
        description="Run the VERONICA runaway scenarios through the real openai SDK against "
        "an embedded fake LLM server, uncontained and contained, and print the table.",
    )
    demo.add_argument(
        "--out", default="veronica-demo", help="where to write the graph files (veronica-demo)"
    )
    demo.set_defaults(handler=_demo)

    run = sub.add_parser(
        "run",
        help="run a command and kill its whole process group at a deadline",
        description="Start CMD in its own process group; at the deadline send SIGTERM to "
        "the group (children too), then SIGKILL after a grace period. Exits with 3 when "
        "the deadline was hit, else with CMD's status.",
    )
    run.add_argument(
        "--timeout", type=_positive_seconds, required=True, help="deadline (90, 90s, 15m, 2h)"
    )
    run.add_argument(
        "--grace", type=_positive_seconds, default=5.0, help="SIGTERM to SIGKILL (default 5s)"
    )
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    run.set_defaults(handler=_run)

    override = sub.add_parser(
        "override",
        help="lift a chain's sticky trip for a while (logged, time-boxed)",
        description="The only way past a sticky trip: needs a reason and a duration, is "
        "logged and visible in traces, and expires by itself. Works on chains in the "
        "shared Redis/Valkey ledger (VERONICA_REDIS_URL or --redis-url).",
    )
    override.add_argument("--chain", required=True, help="chain id")
    override.add_argument("--reason", required=True, help="why (kept in the log and the trace)")
    override.add_argument(
        "--duration", type=_positive_seconds, required=True, help="how long (e.g. 15m)"
    )
    extra = override.add_mutually_exclusive_group()
    extra.add_argument("--add-usd", type=float, default=0.0, help="raise the cost ceiling by X USD")
    extra.add_argument("--add-steps", type=int, default=0, help="raise the step ceiling by N")
    override.add_argument(
        "--redis-url", default=None, help="ledger URL (default VERONICA_REDIS_URL)"
    )
    override.set_defaults(handler=_override)

    graph = sub.add_parser(
        "graph",
        help="show an execution graph file as a tree, or write it as HTML",
        description="Read a chain graph JSON file written by the veronica_graph exporter.",
    )
    graph.add_argument("file", help="graph JSON file")
    graph.add_argument(
        "--html", metavar="OUT", default=None, help="write a self-contained HTML view"
    )
    graph.set_defaults(handler=_graph)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(handler(args))
    except BrokenPipeError:  # `veronica-otel graph FILE | head`: not an error
        sys.stderr.close()
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
