"""How a framework's run ended, as one ``RESULT {json}`` line for the test to read.

``how`` says where our ``BudgetExceededError`` was: ``"itself"`` (it reached
the caller unchanged), ``"cause"`` (the ``__cause__`` / ``__context__`` of
the framework's own error), ``"group"`` (inside an ``ExceptionGroup``), or
``None`` (the run ended some other way).

An app hands :func:`run` its scenarios by name (``""`` the default). Run
with arguments, it runs the one named by ``argv[1]``; run with
``FRAMEWORK_SCENARIOS=1`` (:class:`tests.e2e._frameworks.FrameworkApp`), it
imports the framework once and serves scenarios: for each line on stdin
(``{"scenario": name, "env": {...}}``) a forked child takes that environment,
builds the default chain from it as zero code's start-up does
(``install_zero_code``), runs the scenario, prints its RESULT and exits the
normal way; once it is gone the parent prints ``DONE <wait status>``. The
parent makes no call of its own, so what the server counted when DONE comes
is what that one process sent. Before serving, the parent imports what a
run would otherwise import in every child (:data:`WARM`: the SDKs the
frameworks import on their first call, the price data on ours), as each
import is most of a scenario's CPU; it calls nothing.

A run (a scenario's child, or the one run without ``FRAMEWORK_SCENARIOS``)
that is still going ``FRAMEWORK_DUMP_AFTER_S`` seconds after it began, which
the test sets to less than it waits, writes every thread's stack to stderr and
exits (:func:`faulthandler.dump_traceback_later`): the test's failure then
says where the run stood, not only that no RESULT came.
"""

from __future__ import annotations

import atexit
import faulthandler
import gc
import importlib
import importlib.util
import json
import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any


def _ours(exc: BaseException) -> bool:
    return type(exc).__name__ == "BudgetExceededError" and type(exc).__module__.startswith(
        "veronica_otel"
    )


def _find(exc: BaseException, seen: set[int]) -> tuple[str, BaseException] | None:
    if id(exc) in seen:
        return None
    seen.add(id(exc))
    if _ours(exc):
        return "itself", exc
    for inner in getattr(exc, "exceptions", ()) or ():  # an ExceptionGroup
        found = _find(inner, seen)
        if found is not None:
            return "group", found[1]
    for link in (exc.__cause__, exc.__context__):
        if link is not None:
            found = _find(link, seen)
            if found is not None:
                return ("group" if found[0] == "group" else "cause"), found[1]
    return None


def outcome(exc: BaseException | None) -> dict[str, Any]:
    if exc is None:
        return {"raised": None, "how": None}
    found = _find(exc, set())
    result: dict[str, Any] = {"raised": type(exc).__name__, "how": None, "message": str(exc)[:300]}
    if found is not None:
        how, ours = found
        result.update(
            how=how, reason=getattr(ours, "reason", None), agent=getattr(ours, "agent", None)
        )
    return result


class Result(dict[str, Any]):
    """What a scenario returns to report itself, in place of how it ended."""


def ended(main: Callable[[], object]) -> dict[str, Any]:
    """How ``main()`` ended (see :func:`outcome`), or the :class:`Result` it returned."""
    try:
        returned = main()
    except BaseException as exc:  # the test reads how it ended
        return outcome(exc)
    return returned if isinstance(returned, Result) else outcome(None)


def report(result: dict[str, Any]) -> None:
    print("RESULT " + json.dumps(result), flush=True)


# Imported by the first call of a run, not by the frameworks' own import:
# openai's chat and Responses resources (and the httpx2 it may use), and the
# price data our pricing reads.
WARM = (
    "openai.resources.chat",
    "openai.resources.responses",
    "httpx2",
    "genai_prices.data",
    "genai_prices.data_snapshot",
    "genai_prices.types",
)


def _warm(modules: tuple[str, ...]) -> None:
    for name in modules:
        if importlib.util.find_spec(name.split(".", 1)[0]) is not None:  # installed here
            importlib.import_module(name)


Scenarios = Mapping[str, Callable[[], object]]
HOSTED: dict[str, Scenarios] = {}  # app file name -> its scenarios, under ``host.py``


def run(main: Callable[[], object] | Scenarios) -> None:
    """Run ``main``, or the scenario named by ``argv[1]``; or serve scenarios (see above).

    Under ``host.py`` (``FRAMEWORK_HOST=1``) the app's scenarios are only
    registered, by its file name: the host serves them with its other apps'.
    """
    mains = main if isinstance(main, Mapping) else {"": main}
    if os.environ.get("FRAMEWORK_HOST") == "1":
        HOSTED[os.path.basename(sys.argv[0])] = mains
        return
    if os.environ.get("FRAMEWORK_SCENARIOS") != "1":
        _dump_if_hung()
        report(ended(mains[sys.argv[1] if len(sys.argv) > 1 else ""]))
        return
    serve(lambda scenario: mains[scenario["scenario"]])


def serve(choose: Callable[[dict[str, Any]], Callable[[], object]]) -> None:
    """For each scenario line on stdin, ``choose(scenario)`` run in a forked child (see above)."""
    _warm(WARM)
    gc.freeze()  # a child's collections then skip (so do not copy) what this process made
    for line in sys.stdin:
        scenario = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _in_child(choose(scenario), scenario["env"])  # never returns
        _, status = os.waitpid(pid, 0)
        print(f"DONE {status}", flush=True)


def _in_child(main: Callable[[], object], env: Mapping[str, str | None]) -> None:
    gc.enable()  # collected as a run of its own is (its parent may not: no_collection)
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _dump_if_hung()  # armed here, not in the parent: its watchdog thread would not survive fork
    from veronica_otel.startup.distro import install_zero_code  # the test's harness, not the app

    install_zero_code()  # the default chain from this scenario's VERONICA_* variables
    report(ended(main))
    exit_as_the_interpreter_does()


def _dump_if_hung() -> None:
    """``FRAMEWORK_DUMP_AFTER_S`` seconds from now: every thread's stack to stderr, and exit."""
    after = os.environ.get("FRAMEWORK_DUMP_AFTER_S")
    if after:
        faulthandler.dump_traceback_later(float(after), exit=True)


def no_collection() -> None:
    """No garbage collection in this process from now on (its forked children collect).

    For a parent about to import what its children share: each full collection
    walks every object imported so far, about a quarter of the imports' CPU for a
    dozen SDKs or a framework, and imports make few cycles. A child forked by
    :func:`serve` or :func:`in_child` collects again (``gc.enable``).
    """
    gc.disable()


def in_child(run: Callable[[], int]) -> int:
    """``run()`` in a process forked from this one, ended with the status it returns
    as the interpreter ends (:func:`exit_as_the_interpreter_does`); its wait status."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        gc.enable()  # collected as a run of its own is (its parent may not: no_collection)
        exit_as_the_interpreter_does(run())
    return os.waitpid(pid, 0)[1]


def exit_as_the_interpreter_does(status: int = 0) -> None:
    """End a forked child with what the interpreter's exit does that a run is counted by.

    Its other (non-daemon) threads are waited for, its ``atexit`` handlers run
    (an exporter's flush, a ledger's close) and its output is flushed, so what
    is sent at exit is counted too. Then ``os._exit``: the teardown of every
    module and object that would follow, in a process forked after a
    framework's import, touches (and so copies) most of its memory, which cost
    about 1 CPU-second per scenario, several times the run itself.
    """
    # The interpreter's own first two steps of exit (Py_FinalizeEx): threading's
    # exit hooks (thread pools told to stop) and the non-daemon threads joined,
    # then the atexit handlers.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
