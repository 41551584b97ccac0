"""Runs started as ``opentelemetry-instrument python SCRIPT ARGS...`` starts them, forked from here.

``python started.py FOLDER`` runs each run of ``FOLDER/runs.json``
(``[{"name", "argv", "env"}]``, ``argv`` the script and its arguments), one
after the other, each in a process of its own, and prints ``DONE <name> <wait
status>`` as each ends; it exits with the number of runs that did not exit 0.

What such a run costs is mostly its imports (openai, the SDK, the instrumentors
installed): this process imports them (:data:`IMPORTS`, when installed, and
the module of every start-up entry point) and runs nothing of them; none of
the packages ``STARTED_LEAVE`` names (comma-separated), for runs that must see
them imported after start-up, as an app's import is. Each child
then does what ``opentelemetry-instrument`` and Python's start-up do before the
script's first line: takes the run's environment; puts the
auto-instrumentation directory and the working directory first on
``PYTHONPATH`` (the launcher's rule) and so on ``sys.path``; runs the ``.pth``
files of site-packages (``veronica_otel_zero_code.pth`` registers its door)
and then ``sitecustomize`` (``initialize()``: distro, configurator and
instrumentors, chosen by the run's ``OTEL_PYTHON_*``), through :mod:`site`'s
own functions. The script then runs as ``__main__``; an exception it lets out
is printed by ``sys.excepthook`` and exits 1, as the interpreter does, and the
child ends as ``frameworks/_report.py``'s scenarios do. Its stdout and stderr
go to ``FOLDER/<name>.out`` and ``.err``.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import importlib.util
import json
import os
import runpy
import site
import sys
from importlib.metadata import entry_points
from typing import Any

from frameworks._report import in_child, no_collection

# Imported by start-up or by a run's first call (where installed).
IMPORTS = (
    "opentelemetry.instrumentation.auto_instrumentation",
    "opentelemetry.sdk._configuration",
    "opentelemetry.sdk.trace",
    "opentelemetry.sdk.metrics",
    "opentelemetry.sdk._logs",
    "openai.resources.chat",
    "httpx",
    "httpx2",
    "requests",
    "grpc",
    "veronica_otel.instrumentors.openai",
    "veronica_otel.instrumentors.httpx",
    "veronica_otel.instrumentors.requests",
    "veronica_otel.instrumentors.urllib3",
    "genai_prices.data",
    "genai_prices.data_snapshot",
)
GROUPS = (
    "opentelemetry_distro",
    "opentelemetry_configurator",
    "opentelemetry_instrumentor",
    "opentelemetry_pre_instrument",
)
DUMP_AFTER_S = 100  # a hung run writes every thread's stack to its stderr, and exits


def main(folder: str) -> int:
    no_collection()  # while start-up's imports run here (each run collects: in_child)
    leave = set(filter(None, os.environ.pop("STARTED_LEAVE", "").split(",")))
    for name in IMPORTS:
        top = name.split(".", 1)[0]
        if top not in leave and importlib.util.find_spec(top) is not None:
            importlib.import_module(name)
    for group in GROUPS:
        for entry in entry_points(group=group):
            with contextlib.suppress(Exception):  # fails again in the run, as at start-up
                importlib.import_module(entry.module)
    imported = sorted(leave & {name.split(".", 1)[0] for name in sys.modules})
    if imported:
        raise SystemExit(f"started.py: imported {imported}, which STARTED_LEAVE leaves out")
    with open(os.path.join(folder, "runs.json")) as listed:
        runs = json.load(listed)
    gc.freeze()  # a child's collections then leave what was imported here uncopied
    failed = 0
    for run in runs:
        status = in_child(functools.partial(_run, folder, run))
        failed += status != 0
        print("DONE", run["name"], status, flush=True)
    return failed


def _run(folder: str, run: dict[str, Any]) -> int:
    """Start ``run`` as a process of its own would be started, run it; its exit status."""
    import faulthandler

    import opentelemetry.instrumentation.auto_instrumentation as auto

    for fd, suffix in ((1, "out"), (2, "err")):
        path = os.path.join(folder, f"{run['name']}.{suffix}")
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    faulthandler.dump_traceback_later(DUMP_AFTER_S, exit=True)
    os.environ.update(run["env"])
    # The launcher: its own directory first, then the working directory, on PYTHONPATH.
    launcher = os.path.dirname(os.path.abspath(auto.__file__))
    path = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    path = [launcher, *(entry for entry in [os.getcwd(), *path] if entry != launcher)]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
    script, *_ = sys.argv = [str(arg) for arg in run["argv"]]
    sys.path[0:1] = [os.path.dirname(os.path.abspath(script)), *dict.fromkeys(path)]
    try:
        # Python's start-up: the .pth files, then the first sitecustomize on the path.
        for packages in site.getsitepackages():
            site.addsitedir(packages)
        sys.modules.pop("sitecustomize", None)
        site.execsitecustomize()
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        return _exit_status(exc.code)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def _exit_status(code: object) -> int:
    """What the interpreter exits with for ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
