"""The presets of task_spec are plain data that import no spec (cycles and layers: ``tests/test_layers.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

import task_spec
from task_spec import TaskSpec, presets

PACKAGE = Path(task_spec.__file__).parent


def _imports(path: Path) -> set[str]:
    """The task_spec modules ``path`` imports (``from task_spec import x`` counts x when it is a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    modules = {f"task_spec.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    return found & modules


def test_presets_import_nothing_of_the_package():
    assert _imports(PACKAGE / "presets.py") == set()


def test_every_classmethod_preset_is_built_from_its_keyword_arguments():
    for make in presets.PRESETS:
        kwargs = make()
        assert isinstance(kwargs, dict) and kwargs["name"] == make.__name__
        assert getattr(TaskSpec, make.__name__)() == TaskSpec(**kwargs)
        assert make() is not kwargs
