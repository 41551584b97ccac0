"""Several framework apps of one venv served by one process: ``host.py APP...``.

Started as an app is (``opentelemetry-instrument python host.py ...`` with
``FRAMEWORK_SCENARIOS=1``, :class:`tests.e2e._frameworks.FrameworkApp`), it
runs each app file as ``__main__``, one after the other, with
``FRAMEWORK_HOST=1``: each imports its framework and builds its agents at its
top level, as when run alone, and its closing ``run()`` registers its
scenarios (``_report.HOSTED``) instead of serving them. Then it serves every
app's scenarios as one app serves its own (``_report.serve``): a line names
its app (``"app"``) besides its scenario, and runs in a child forked after all
the imports. The apps of a venv share most of what they import (Python,
OpenTelemetry's start-up, openai, pydantic, httpx): imported once, not once per app.
"""

from __future__ import annotations

import os
import runpy
import sys

import _report


def main(apps: list[str]) -> None:
    _report.no_collection()  # while the apps import their frameworks (children collect)
    os.environ["FRAMEWORK_HOST"] = "1"
    for app in apps:
        sys.argv = [app]
        runpy.run_path(app, run_name="__main__")
    del os.environ["FRAMEWORK_HOST"]  # a scenario's child runs as its app alone would
    _report.serve(lambda scenario: _report.HOSTED[scenario["app"]][scenario["scenario"]])


if __name__ == "__main__":
    main(sys.argv[1:])
