"""The layers hold: no import cycles between modules, and no package reads another package's private modules.

The order of the layers themselves is kept by the import-linter contracts in ``pyproject.toml`` (``make lint``
runs them); these are the two rules a layers contract cannot state.
"""

from __future__ import annotations

import grimp
import pytest

PACKAGES = ("task_spec", "collators", "engine", "demo")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES)


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Groups of modules that import each other, directly or through others (strongly connected, size > 1)."""
    edges = {module: {imported for imported in graph.find_modules_directly_imported_by(module)
                      if not module.startswith(imported + ".")}  # a module importing its own package's face
             for module in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in edges[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while group[-1:] != [module]:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def private_owner(module: str) -> str | None:
    """The package that owns ``module`` when a part of its name is private (``_x``), else None."""
    parts = module.split(".")
    for position, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:position])
    return None


def test_no_module_imports_a_module_that_imports_it(graph):
    assert cycles(graph) == [], "modules on an import cycle: cut it where it starts (no module imports its caller)"


def test_no_package_imports_another_packages_private_module(graph):
    crossings = sorted(
        f"{importer} -> {imported}"
        for importer in graph.modules for imported in graph.find_modules_directly_imported_by(importer)
        if (owner := private_owner(imported)) is not None and not importer.startswith(owner + ".")
    )
    assert crossings == [], "import the owner's public module instead (or make the module public)"


def test_the_checks_see_a_crossing_and_a_cycle():
    assert private_owner("engine.sources._arrow_fetch") == "engine.sources" and private_owner("engine.rng") is None
    example = grimp.build_graph("engine")
    example.add_import(importer="engine.core.rng", imported="engine.datamodule.universal")
    assert any("engine.core.rng" in group for group in cycles(example))
