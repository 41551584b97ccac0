"""The layout DESIGN.md draws: start-up code sits on top, like the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

import veronica_otel

PACKAGE = Path(veronica_otel.__file__).parent
# What may import the start-up package: itself, the CLI, and the public face
# of the policy file (``veronica_otel.policy_file``).
ON_TOP = ("startup", "cli", "policy_file.py")


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_nothing_below_imports_the_start_up_code() -> None:
    below = [
        path
        for path in PACKAGE.rglob("*.py")  # follows the instrumentors/exporters links
        if path.relative_to(PACKAGE).parts[0] not in ON_TOP
    ]
    assert len(below) > 50
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(
            name
            for name in _imported(path)
            if name.startswith("veronica_otel.startup") or name in {"veronica_otel.distro"}
        )
        for path in below
    }
    assert {path: names for path, names in offenders.items() if names} == {}
    # The kernel's relative imports cannot reach it either: it is one level down.
    relative = [
        path for path in below if path.parent == PACKAGE and "from .startup" in path.read_text()
    ]
    assert relative == []


def test_the_policy_files_public_path_is_the_start_up_module() -> None:
    from veronica_otel import policy_file
    from veronica_otel.startup import policy_file as implementation

    for name in policy_file.__all__:
        assert getattr(policy_file, name) is getattr(implementation, name)
    assert set(policy_file.__all__) == set(implementation.__all__)
