"""The ``veronica-otel`` command line: demo, graph, run, override, pools.

Exit codes: 0 success; 1 a command failed; 2 bad usage; 3 ``run`` killed the
command at its deadline; 130 interrupted; otherwise ``run`` passes on the
command's own status. A user's mistake (a bad argument, a path that cannot be
read or written, a missing extra) is one line on stderr naming the problem,
never a traceback. Also runnable as ``python -m veronica_otel.cli``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

__all__ = ["main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 3
EXIT_INTERRUPTED = 130

_OPENAI_EXTRA = (
    "pip install 'veronica-otel[openai]' once published; from a checkout: "
    "pip install -e '.[openai]'"
)


def _fail(command: str, problem: str) -> int:
    print(f"veronica-otel {command}: {problem}", file=sys.stderr)
    return EXIT_FAILED


def _openai_missing() -> str | None:
    """Why the demo cannot use the openai SDK when it is not installed at all
    (found without importing it), or None."""
    try:
        found = importlib.util.find_spec("openai") is not None
    except (ImportError, ValueError):  # a broken entry in sys.modules: the import says why
        found = True
    return None if found else f"needs the openai SDK, which is not installed ({_OPENAI_EXTRA})"


def _openai_problem() -> str | None:
    """Why the demo cannot use the openai SDK, or None when it can."""
    try:
        import openai  # noqa: F401
    except ImportError as exc:
        if (exc.name or "").split(".")[0] == "openai":
            return f"needs the openai SDK, which is not installed ({_OPENAI_EXTRA})"
        return f"the openai SDK cannot be imported ({exc}); reinstall it ({_OPENAI_EXTRA})"
    return None


def _unwritable(folder: str) -> str | None:
    """Why graph files cannot be written in ``folder`` (created if missing), or None."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".veronica-probe-"):
            pass
    except FileExistsError as exc:  # mkdir: a file is in the way
        return f"cannot write the graph files to {folder!r}: {exc.filename} is not a directory"
    except OSError as exc:
        return f"cannot write the graph files to {folder!r}: {exc.strerror or exc}"
    return None


def runnable_cli() -> str:
    """This command as the user's shell can run it: ``veronica-otel`` when that is
    on PATH, else the script next to this Python, else ``python -m``."""
    script = Path(sys.executable).parent / "veronica-otel"
    found = shutil.which("veronica-otel")
    if script.is_file():
        if found and os.path.samefile(found, script):
            return "veronica-otel"
        relative = os.path.relpath(script)
        return shlex.quote(script.as_posix() if relative.startswith("..") else relative)
    return f"{shlex.quote(sys.executable)} -m veronica_otel.cli"


def _demo_command(args: argparse.Namespace) -> int:
    # The folder is checked before openai is imported (about a CPU-second), so
    # a bad --out fails at once; a missing SDK fails before the folder is made.
    problem = _openai_missing() or _unwritable(args.out) or _openai_problem()
    if problem is not None:
        return _fail("demo", problem)
    from ._demo import run_demo, trace_to_graph

    print("veronica-otel demo: runaway agent chains against an embedded fake LLM server\n")
    finish = trace_to_graph(args.out)
    run_demo()
    written = finish()
    if not written:
        return _fail("demo", f"no graph file was written to {args.out!r} (see the log above)")
    print(f"\nexecution graphs, one per chain, in {args.out}/ (open the .html in a browser):")
    for name, path in written:
        print(f"  {name:<34} {path}")
    graph = shlex.quote(str(written[-1][1].with_suffix(".json")))
    print(f"in a terminal: {runnable_cli()} graph {graph}")
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
    except PermissionError:
        print(f"veronica-otel run: not executable: {command[0]}", file=sys.stderr)
        return 126
    except OSError as exc:  # not a program (exec format error), ...
        print(f"veronica-otel run: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return 126
    if killed:
        print(
            f"veronica-otel run: {command[0]} passed its {args.timeout:g}s deadline; "
            "its whole process group was stopped",
            file=sys.stderr,
        )
        return EXIT_TIMEOUT
    return status if status >= 0 else 128 - status


def _override_command(args: argparse.Namespace) -> int:
    from ._override import apply_override

    return apply_override(args)


def _status_command(args: argparse.Namespace) -> int:
    from ._status import show_status

    return show_status(args)


def _pools_command(args: argparse.Namespace) -> int:
    from ._pool_table import show_pools

    return show_pools(args)


def _graph_command(args: argparse.Namespace) -> int:
    from ._graph import show_graph

    return show_graph(args)


def _positive_seconds(text: str) -> float:
    from ._durations import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (argparse prints the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _store_flag(command: argparse.ArgumentParser) -> None:
    """The shared ledger's URL: one flag name everywhere (``--redis-url`` kept as an alias)."""
    command.add_argument(
        "--redis",
        "--redis-url",
        dest="redis",
        metavar="URL",
        default=None,
        help="Redis/Valkey ledger URL (default VERONICA_REDIS_URL)",
    )


def _parser() -> argparse.ArgumentParser:
    from veronica_otel._version import __version__

    parser = _Parser(
        prog="veronica-otel",
        description="Chain-level containment for LLM agents, inside OpenTelemetry.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
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
    demo.set_defaults(handler=_demo_command)

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
        "shared Redis/Valkey ledger (VERONICA_REDIS_URL or --redis).",
    )
    override.add_argument("--chain", required=True, help="chain id")
    override.add_argument("--reason", required=True, help="why (kept in the log and the trace)")
    override.add_argument(
        "--duration", type=_positive_seconds, required=True, help="how long (e.g. 15m)"
    )
    override.add_argument(
        "--add-usd", type=float, default=0.0, help="raise the cost ceiling by X USD"
    )
    override.add_argument("--add-steps", type=int, default=0, help="raise the step ceiling by N")
    _store_flag(override)
    override.set_defaults(handler=_override_command)

    status = sub.add_parser(
        "status",
        help="show a chain in the shared ledger: spent, steps, tokens, and its trip",
        description="What a chain in the shared Redis/Valkey ledger has spent and whether "
        "(and why) it is stopped: look before you override.",
    )
    status.add_argument("--chain", required=True, help="chain id")
    _store_flag(status)
    status.set_defaults(handler=_status_command)

    pools = sub.add_parser(
        "pools",
        help="show every budget pool in the shared ledger: spent, limits, left, time to free",
        description="Lists the budget pools found in the shared Redis/Valkey ledger "
        "(VERONICA_REDIS_URL or --redis; key prefix VERONICA_REDIS_PREFIX). With the policy "
        "file that defines them, also their limits and what is left.",
    )
    _store_flag(pools)
    pools.add_argument(
        "--policy",
        metavar="FILE",
        default=None,
        help="policy file whose [pools] give the limits (default VERONICA_POLICY_FILE)",
    )
    pools.set_defaults(handler=_pools_command)

    graph = sub.add_parser(
        "graph",
        help="show an execution graph as a tree, or write it as HTML (from a file or Jaeger)",
        description="Read a chain graph JSON file written by the veronica_graph exporter, "
        "or read traces from Jaeger's query API (--jaeger) and show each chain in them.",
    )
    graph.add_argument("file", nargs="?", default=None, help="graph JSON file")
    graph.add_argument(
        "--html",
        metavar="OUT",
        default=None,
        help="write a self-contained HTML view (with --jaeger: a folder, one page per chain)",
    )
    graph.add_argument(
        "--jaeger",
        metavar="URL",
        default=None,
        help="Jaeger's query service, e.g. http://localhost:16686",
    )
    chosen = graph.add_mutually_exclusive_group()
    chosen.add_argument("--trace", metavar="ID", default=None, help="one trace (32 hex digits)")
    chosen.add_argument(
        "--service", metavar="NAME", default=None, help="the latest traces of a service"
    )
    graph.add_argument(
        "--last", metavar="N", type=int, default=1, help="with --service: how many traces (1)"
    )
    graph.add_argument(
        "--lookback",
        metavar="DUR",
        type=_positive_seconds,
        default=7 * 86400.0,
        help="with --service: how far back to look (7d)",
    )
    graph.set_defaults(handler=_graph_command)
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
    except KeyboardInterrupt:
        print(f"veronica-otel {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as exc:  # a path or device the user named: say which, no traceback
        return _fail(args.command, str(exc))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
