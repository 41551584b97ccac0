"""``veronica_otel.cli.main`` called again in the same process (a notebook, a test).

Importing a command's module (``veronica_otel.cli._graph``) binds the package's
attribute of that name; a handler with the same name was replaced by the module
and the second call failed with "'module' object is not callable".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from veronica_otel.cli import main


def test_graph_runs_twice_in_one_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "no-such-graph.json")
    first = main(["graph", missing])
    second = main(["graph", missing])
    assert first == second != 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0] == err[1], err
    assert "no-such-graph.json" in err[0]
