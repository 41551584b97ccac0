"""Run a script unchanged under ``opentelemetry-instrument``, as users do.

The environment is this process's minus any ``VERONICA_*``, ``OTEL_*``,
``OPENAI_*`` and ``ANTHROPIC_*`` settings, pointed at the fake LLM server,
with OpenTelemetry exporters off unless a test sets them.

:func:`run_instrumented` starts a process per script. :func:`script_scenarios`
starts one zero-code process for a module whose tests vary only the script
and its ``VERONICA_*`` variables: each runs in a process forked from it after
openai's import, with a default chain built from those variables as start-up
builds it (``e2e/apps/unchanged_scripts.py``). :func:`start_runs` starts
runs whose start-up itself is tested (the distro and configurator chosen, a
malformed variable): each is forked, before start-up, from one process that
imported what start-up imports, and then started as ``opentelemetry-instrument``
and Python's start-up start it (``e2e/apps/started.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests._venvs import plain_http_tls
from veronica_otel.testing import FakeLLMServer

if TYPE_CHECKING:
    from tests.e2e._frameworks import CompletedProcess, FrameworkApp

INSTRUMENT = Path(sys.executable).parent / "opentelemetry-instrument"
SCRIPTS_APP = Path(__file__).parent / "e2e" / "apps" / "unchanged_scripts.py"
UNCHANGED_AGENT = Path(__file__).parent / "e2e" / "apps" / "unchanged_agent.py"
STARTED_APP = Path(__file__).parent / "e2e" / "apps" / "started.py"


def environment(server: FakeLLMServer | None, **env: str) -> dict[str, str]:
    """This process's environment for an app: no ``VERONICA_*``, ``OTEL_*``,
    ``OPENAI_*`` or ``ANTHROPIC_*`` of its own, the fake server's URL (unless
    ``server`` is None), exporters off; ``env`` overrides."""
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("VERONICA_", "OTEL_", "OPENAI_", "ANTHROPIC_"))
    }
    if server is not None:
        environ["OPENAI_BASE_URL"] = server.openai_base_url
    environ.update(
        OPENAI_API_KEY="test-key",
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        **plain_http_tls(),
    )
    environ.update(env)
    return environ


def run_instrumented(
    script: Path, server: FakeLLMServer, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` under ``opentelemetry-instrument``; ``env`` overrides the defaults."""
    return subprocess.run(
        [str(INSTRUMENT), sys.executable, str(script)],
        env=environment(server, **env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def start_runs(
    python: Path,
    runs: Mapping[str, tuple[Sequence[str | Path], Mapping[str, str]]],
    folder: Path,
    environ: Mapping[str, str],
    leave: Sequence[str] = (),
) -> dict[str, subprocess.CompletedProcess[str]]:
    """Each run (name: script and arguments, its variables) as a process of its own.

    All are forked from one ``python`` process (``e2e/apps/started.py``, run
    with ``environ``), one after the other, each before start-up and then
    started as ``opentelemetry-instrument python SCRIPT ARGS...`` would start
    it with ``environ`` and its own variables. ``leave``: packages that process
    must not import (each run imports them after start-up, as an app does).
    Returns each run's exit status and output; ``folder`` keeps their files.
    """
    listed = [
        {"name": name, "argv": [str(arg) for arg in argv], "env": dict(env)}
        for name, (argv, env) in runs.items()
    ]
    (folder / "runs.json").write_text(json.dumps(listed))
    parent = subprocess.run(
        [str(python), str(STARTED_APP), str(folder)],
        env={**environ, "STARTED_LEAVE": ",".join(leave)},
        capture_output=True,
        text=True,
        timeout=60 + 60 * len(listed),
        check=False,
    )
    ended = dict(line.split()[1:] for line in parent.stdout.splitlines() if line[:5] == "DONE ")
    assert ended.keys() == runs.keys(), (parent.stdout, parent.stderr[-3000:])
    return {
        name: subprocess.CompletedProcess(
            [str(arg) for arg in argv],
            os.waitstatus_to_exitcode(int(ended[name])),
            (folder / f"{name}.out").read_text(),
            (folder / f"{name}.err").read_text(),
        )
        for name, (argv, _) in runs.items()
    }


def script_scenarios(server: FakeLLMServer) -> FrameworkApp:
    """``apps/unchanged_scripts.py`` under zero code here; ``.run(script, **env)`` per scenario.

    Use as a context manager (a module fixture); each test's script then runs
    as :func:`run_instrumented` would run it, in a process of its own forked
    from this one, and reports how it ended (``frameworks/_report.py``).
    """
    from tests.e2e._frameworks import FrameworkApp

    return FrameworkApp(
        Path(sys.executable).parent.parent,  # this environment, as run_instrumented's
        str(SCRIPTS_APP),
        server,
        PYTHONPATH=os.environ.get("PYTHONPATH"),  # these sources, as run_instrumented's
    )


class ScriptRuns:
    """A :func:`script_scenarios` process's runs aimed at ``server``.

    The process is shared (the session's ``zero_code_scripts`` fixture): each
    run gets ``server``'s address (``OPENAI_BASE_URL``, ``OPENAI_API_BASE``,
    ``FAKE_LLM_URL``) in its own environment, which the scripts read when they
    make their clients, so a module counts what its own server received.
    """

    def __init__(self, scripts: FrameworkApp, server: FakeLLMServer) -> None:
        self._scripts, self._server = scripts, server

    def run(self, script: str, **env: str | None) -> tuple[dict[str, Any], CompletedProcess]:
        """``script`` as a scenario: see :meth:`FrameworkApp.run`."""
        url = self._server.openai_base_url
        aimed = {"OPENAI_BASE_URL": url, "OPENAI_API_BASE": url}
        return self._scripts.run(script, **aimed, **{"FAKE_LLM_URL": self._server.base_url, **env})


def printed(done: CompletedProcess) -> list[str]:
    """What a scenario's script printed (its RESULT line aside)."""
    return [line for line in done.stdout.splitlines() if not line.startswith("RESULT ")]
