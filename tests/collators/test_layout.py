"""The collators package stays layered: no import cycles between its modules, and no module over ~250 lines."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "collators"
MAX_LINES = 250


def imports_of(path: Path) -> set[str]:
    """Names of the ``collators`` modules that ``path`` imports (TYPE_CHECKING imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("collators"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("collators"))
    return found


def test_no_module_imports_a_module_that_imports_it():
    modules = {f"collators.{path.stem}": path for path in PACKAGE.glob("*.py") if path.stem != "__init__"}
    graph = {name: imports_of(path) & set(modules) for name, path in modules.items()}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(nxt == goal or reaches(nxt, goal, seen | {nxt}) for nxt in graph[start] - seen)

    cycles = sorted(name for name in graph if reaches(name, name, set()))
    assert not cycles, f"modules on an import cycle: {cycles}"


def test_modules_stay_small():
    long = {path.name: n for path in PACKAGE.glob("*.py") if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them, one job each): {long}"
