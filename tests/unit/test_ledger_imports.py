"""The shared ledger's modules import one way: no loop, not even a type-only one.

Read from the source (every ``import``, under ``TYPE_CHECKING`` and inside
functions too), so a loop that only a type checker or a late import would
follow fails here before it costs a reader a second file to understand the first.
"""

from __future__ import annotations

import ast
from pathlib import Path

import veronica_otel

PACKAGE = Path(veronica_otel.__file__).parent
DISTRIBUTED = "veronica_otel.distributed"


def _modules() -> dict[str, Path]:
    found = {}
    for path in (PACKAGE / "distributed").glob("*.py"):
        name = f"{DISTRIBUTED}.{path.stem}" if path.stem != "__init__" else DISTRIBUTED
        found[name] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            module = f"{base}.{node.module}" if node.level and node.module else base
            if not node.level:
                module = node.module or ""
            subs = {f"{module}.{a.name}" for a in node.names} & known
            out |= subs
            if len(subs) < len(node.names) and module in known:
                out.add(module)
    out.discard(name)
    return out


def _loop_from(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    stack = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, trail = stack.pop()
        for nxt in graph[node]:
            if nxt == start:
                return [*trail, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*trail, nxt]))
    return None


def test_no_module_of_the_shared_ledger_imports_itself_back() -> None:
    modules = _modules()
    assert f"{DISTRIBUTED}._ledger" in modules and f"{DISTRIBUTED}._aledger" in modules
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    # The package's __init__ re-exports its modules; those edges are not loops.
    for edges in graph.values():
        edges.discard(DISTRIBUTED)
    loops = [loop for name in graph if (loop := _loop_from(name, graph)) is not None]
    assert loops == []


def test_the_async_ledger_builds_on_the_parts_not_on_the_ledger() -> None:
    # The loop this replaced: _aledger imported _ledger for RedisLedger's type.
    path = PACKAGE / "distributed" / "_aledger.py"
    imported = _imports(f"{DISTRIBUTED}._aledger", path, set(_modules()))
    assert f"{DISTRIBUTED}._ledger" not in imported
    assert {f"{DISTRIBUTED}._chain_ops", f"{DISTRIBUTED}._link"} <= imported
