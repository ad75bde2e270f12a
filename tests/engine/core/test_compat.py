"""Library internals live in engine/core/compat.py alone, and an unsupported library version is refused at import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from engine.core import compat

ROOT = Path(__file__).resolve().parents[3]
LIBRARIES = ("torch", "torchdata", "lightning")
LIBRARY_INTERNALS = {
    "_iterator", "_workers", "_shutdown_workers", "_worker_pids_set", "_remove_worker_pids", "_num_yielded",
    "_finished", "_worker_result_queue", "_reader", "_new_shared", "_set_hparams", "_hparams", "_hparams_initial",
    "_log_hyperparams", "_accelerator_connector", "_it", "_shutdown", "_profiler_enabled", "_get_iterator",
}
"""Private attributes of torch, torchdata and Lightning objects that the engine reads or writes (in compat.py)."""
DOCUMENTED_EXTENSION_POINT = ("collators/default.py", "torch.utils.data._utils.collate")
"""torch's ``default_collate`` documents ``collate(..., collate_fn_map=...)`` as its extension point; collators sit
below the engine, so they import it themselves."""


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def internals_used(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LIBRARIES:
            names = [*node.module.split("."), *(alias.name for alias in node.names)]
            if any(map(private, names)) and (str(path.relative_to(ROOT)), node.module) != DOCUMENTED_EXTENSION_POINT:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}")
        elif isinstance(node, ast.Import):
            found += [f"{path.relative_to(ROOT)}:{node.lineno} imports {alias.name}" for alias in node.names
                      if alias.name.split(".")[0] in LIBRARIES and any(map(private, alias.name.split(".")))]
        elif isinstance(node, ast.Attribute) and node.attr in LIBRARY_INTERNALS:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} uses .{node.attr}")
        elif isinstance(node, ast.Constant) and node.value in LIBRARY_INTERNALS:  # getattr(x, "_name")
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} names {node.value!r}")
    return found


def test_only_compat_touches_library_internals():
    compat_path = Path(compat.__file__).resolve()
    files = [path for package in ("task_spec", "collators", "engine") for path in sorted((ROOT / package).rglob("*.py"))
             if path.resolve() != compat_path]
    assert [use for path in files for use in internals_used(path)] == []


def test_the_scan_sees_an_internal_in_compat_itself():
    assert internals_used(Path(compat.__file__).resolve())  # the check would fail if it were used elsewhere


def test_supported_versions_pass_and_others_are_refused_naming_the_range():
    compat.check_versions()  # the installed ones
    compat.check_versions({"torch": "2.9.1+cu128", "torchdata": "0.11.0", "lightning": "2.6.6"})
    with pytest.raises(ImportError, match=r"torchdata 0\.12\.0 is not supported: this engine needs "
                                          r"torchdata>=0\.11,<0\.12"):
        compat.check_versions({"torchdata": "0.12.0"})
    with pytest.raises(ImportError, match=r"torch 2\.8\.0 is not supported: .*pip install 'torch>=2\.9,<2\.10'"):
        compat.check_versions({"torch": "2.8.0"})


def test_pyproject_declares_the_supported_ranges():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    for package, (low, high) in compat.SUPPORTED.items():
        assert f'"{package}>={low},<{high}"' in text, package


def test_every_pin_lies_in_the_range_pyproject_declares():
    """constraints.txt is what the suite runs on; a declared range that excludes it would promise what is untested."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = [line for group in declared["optional-dependencies"].values() for line in group]
    requirements = [Requirement(line) for line in [*declared["dependencies"], *extras]]
    pins = {canonicalize_name(name): pin for name, pin in (
        line.split("==", 1) for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").split() if "==" in line)}
    for requirement in requirements:
        if canonicalize_name(requirement.name) == canonicalize_name(declared["name"]):
            continue  # the dev extra names the project's own extras
        pin = pins.get(canonicalize_name(requirement.name))
        assert pin is not None, f"{requirement.name} is declared but not pinned in constraints.txt"
        assert requirement.specifier.contains(pin, prereleases=True), f"{requirement.name}=={pin} not in {requirement}"
