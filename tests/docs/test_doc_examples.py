"""Run every ```python block of README.md and docs/*.md, so the documentation cannot drift from the code.

The blocks of one file run in order in one shared namespace (a later block may use an earlier block's names); each
file is one test. Blocks that must not run use another language tag (```bash, ```text). Collator registrations made
by an example are undone after its file (the registry is scoped), and the examples run in a temporary directory.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from collators import CollatorRegistry

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYTHON_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
LOCAL_LINK = re.compile(r"\]\((?!https?://|#)([^)#\s]+)(?:#[^)]*)?\)")


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """``(line number, code)`` of each ```python block in ``path``."""
    text = path.read_text(encoding="utf-8")
    return [(text.count("\n", 0, match.start()) + 2, match.group(1)) for match in PYTHON_BLOCK.finditer(text)]


def doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", DOC_FILES, ids=doc_id)
def test_python_blocks_run(path, tmp_path, monkeypatch):
    blocks = python_blocks(path)
    assert blocks, f"{doc_id(path)} has no ```python block; every page shows at least one runnable example"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__doc_example__"}
    with CollatorRegistry.get_instance().scoped():
        for line, code in blocks:
            # Compiled under "<file>:<line>" so a failure's traceback names the block that failed.
            exec(compile(code, f"{doc_id(path)}:{line}", "exec"), namespace)


@pytest.mark.parametrize("path", DOC_FILES, ids=doc_id)
def test_local_links_resolve(path):
    text = PYTHON_BLOCK.sub("", path.read_text(encoding="utf-8"))
    missing = [link for link in LOCAL_LINK.findall(text) if not (path.parent / link).exists()]
    assert not missing, f"{doc_id(path)} links to files that do not exist: {missing}"


def test_api_reference_names_every_public_name():
    import collators
    import engine
    import task_spec

    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    undocumented = [f"{package.__name__}.{name}" for package in (task_spec, collators, engine)
                    for name in package.__all__ if f"`{name}" not in api]
    assert not undocumented, f"docs/api.md does not describe {undocumented}"
