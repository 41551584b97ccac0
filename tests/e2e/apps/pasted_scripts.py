"""Scripts run as pasted, each in a process of its own forked from this one.

``python pasted_scripts.py FOLDER SCRIPT...``: every module the scripts import at
their top level is imported here first (imported only: nothing is called),
since those imports (an SDK, ours, OpenTelemetry) are most of what a short
script costs. Then each script runs as ``__main__`` from its file (its
folder first on ``sys.path``, as ``python SCRIPT`` has it) in a child forked
from this process, one after the other, and ends as
``frameworks/_report.py``'s scenarios do (its threads and atexit handlers,
not the teardown of what it inherited). The N-th script (from 0) runs in
``FOLDER/N``, which holds its stdout and stderr (``out``, ``err``) and its
exit status (``status``: 0, or 1 with the traceback on stderr) once it
ended. A script gets fresh globals: a name it uses but does not import still
fails, as pasted.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import importlib
import os
import runpy
import sys
import traceback
from pathlib import Path

from frameworks._report import WARM, exit_as_the_interpreter_does, no_collection


def _imported_names(script: Path) -> list[str]:
    """The modules ``script``'s top-level import statements name (``from a import b``: a, a.b)."""
    names = []
    for node in ast.parse(script.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def _import(name: str) -> None:
    with contextlib.suppress(ModuleNotFoundError):  # ``from a import b`` where b is no module
        importlib.import_module(name)


def _run(script: Path, folder: Path) -> None:
    """In the child: ``script`` as ``__main__`` in ``folder``, its output to files there."""
    gc.enable()  # collected as in any process (the parent's imports ran without)
    for fd, name in ((1, "out"), (2, "err")):
        target = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    os.chdir(folder)
    sys.argv = [str(script)]
    sys.path[0] = str(script.parent)  # as ``python SCRIPT`` has it
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)  # as the interpreter does
        exit_as_the_interpreter_does(exc.code if isinstance(exc.code, int) else int(bool(exc.code)))
    except BaseException:  # the test reads the traceback
        traceback.print_exc()
        exit_as_the_interpreter_does(1)
    exit_as_the_interpreter_does()


def main(out: str, *paths: str) -> None:
    no_collection()  # while importing what the scripts import (each child collects)
    scripts = [Path(path).resolve() for path in paths]
    for script in scripts:
        for name in _imported_names(script):
            _import(name)
    for name in WARM:  # what a first call imports
        _import(name)
    gc.freeze()  # a child's collections then skip (so do not copy) all this process made
    for n, script in enumerate(scripts):
        folder = Path(out, str(n))
        folder.mkdir(parents=True)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _run(script, folder)  # never returns
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        (folder / "status").write_text(str(status))


if __name__ == "__main__":
    main(*sys.argv[1:])
