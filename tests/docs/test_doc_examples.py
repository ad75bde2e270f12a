"""Run every ```python block of README.md and docs/*.md, so the documentation cannot drift from the code.

The blocks of one file run in order in one shared namespace (a later block may use an earlier block's names); each
file is one test. Blocks that must not run use another language tag (```bash, ```text). Collator registrations made
by an example are undone after its file (the registry is scoped), and the examples run in a temporary directory.

Shown output is checked, doctest-style, so a comment cannot drift from the code:

- a line ``print(...)  # text`` must print ``text``;
- a ```text block right after a ```python block (only blank lines between them) must be everything that block
  printed. A ```text block with prose before it is not output and is not checked.

Lines are compared with trailing spaces and leading and trailing blank lines ignored. Where part of an output
legitimately varies from run to run (a time, a path, a memory size), write ``...`` in its place: like doctest's
ELLIPSIS it matches any text, line breaks included. Use it sparingly, for the varying part only; prefer an example
that prints something stable.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import re
import sys
import tokenize
from pathlib import Path

import pytest

from collators import CollatorRegistry

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYTHON_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
OUTPUT_BLOCK = re.compile(r"[ \t]*\n(?:[ \t]*\n)*```text[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
LOCAL_LINK = re.compile(r"\]\((?!https?://|#)([^)#\s]+)(?:#[^)]*)?\)")


def python_blocks(text: str) -> list[tuple[int, str, str | None]]:
    """``(line number, code, shown output or None)`` of each ```python block in the markdown ``text``."""
    blocks = []
    for match in PYTHON_BLOCK.finditer(text):
        # ``pattern.match(text, pos)`` anchors at ``pos`` (``\A`` would only match at the start of ``text``).
        shown = OUTPUT_BLOCK.match(text, match.end())
        blocks.append((text.count("\n", 0, match.start()) + 2, match.group(1), shown.group(1) if shown else None))
    return blocks


def matches(shown: str, printed: str) -> bool:
    """Whether ``printed`` is what ``shown`` says, line ends ignored and ``...`` matching any text."""
    def clean(text: str) -> str:
        return "\n".join(line.rstrip() for line in text.strip().splitlines())

    pattern = ".*?".join(re.escape(part) for part in clean(shown).split("..."))
    return re.fullmatch(pattern, clean(printed), re.DOTALL) is not None


def output_diff(shown: str, printed: str) -> str:
    """A unified diff from the shown output to the printed one, line ends ignored.

    A printed line that its shown line (same position) matches, ``...`` included, is shown as that line, so the diff
    points at the lines that differ, not at every line with a ``...``.
    """
    expected, got = ([line.rstrip() for line in text.strip().splitlines()] for text in (shown, printed))
    got = [want if matches(want, line) else line for want, line in zip(expected, got)] + got[len(expected):]
    return "\n".join(difflib.unified_diff(expected, got, "shown in the docs", "printed by the example", lineterm=""))


def with_checked_prints(code: str, path: str, first_line: int) -> str:
    """``code`` with each one-line ``print(...)  # shown`` made to check that it prints ``shown``."""
    lines = code.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        if token.type != tokenize.COMMENT:
            continue
        row = token.start[0] - 1
        statement = lines[row][: token.start[1]].rstrip()
        indent = statement[: len(statement) - len(statement.lstrip())]
        if statement.lstrip().startswith("print(") and statement.endswith(")"):
            shown = token.string[1:].strip()
            lines[row] = (f"{indent}__check_print__(lambda: {statement.lstrip()}, {shown!r}, "
                          f"'{path}:{first_line + row}')")
    return "\n".join(lines) + "\n"


def check_print(thunk, shown: str, where: str) -> None:
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        thunk()
    sys.stdout.write(captured.getvalue())
    assert matches(shown, captured.getvalue()), f"{where}: the comment shows {shown!r}, but the code printed " \
                                                f"{captured.getvalue().strip()!r}"


def doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def run_page(text: str, name: str) -> None:
    """Run the ```python blocks of the markdown ``text`` (called ``name`` in failures) and check their shown output.

    The blocks run in order in one namespace; a block followed by a ```text block must print what it shows.
    """
    namespace: dict = {"__name__": "__doc_example__", "__check_print__": check_print}
    for line, code, shown in python_blocks(text):
        where = f"{name}:{line}"
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            # Compiled under "<file>:<line>" so a failure's traceback names the block that failed.
            exec(compile(with_checked_prints(code, name, line), where, "exec"), namespace)
        if shown is not None and not matches(shown, printed.getvalue()):
            pytest.fail(f"{where}: the example's output differs from the ```text block after it "
                        f"(-shown, +printed):\n{output_diff(shown, printed.getvalue())}", pytrace=False)


@pytest.mark.parametrize("path", DOC_FILES, ids=doc_id)
def test_python_blocks_run(path, tmp_path, monkeypatch):
    text = path.read_text(encoding="utf-8")
    assert python_blocks(text), f"{doc_id(path)} has no ```python block; every page shows at least one runnable example"
    monkeypatch.chdir(tmp_path)
    with CollatorRegistry.get_instance().scoped():
        run_page(text, doc_id(path))


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


def test_a_comment_that_drifted_from_the_code_fails():
    namespace = {"__check_print__": check_print}
    exec(compile(with_checked_prints("print(1 + 1)  # 2\nprint('a b c')  # a ... c\n", "x.md", 1), "x", "exec"),
         namespace)
    with pytest.raises(AssertionError, match=r"x.md:2: the comment shows '3', but the code printed '2'"):
        exec(compile(with_checked_prints("x = 1\nprint(1 + 1)  # 3\n", "x.md", 1), "x", "exec"), namespace)
    assert matches("rows: ...\nend", "rows: 1, 2\n3\nend  \n") and not matches("rows: 1", "rows: 2")


PAGE = """# A page

Some prose.

```python
print("rows: 3")
print("batches: 2")
```

```text
rows: 3
batches: {batches}
```

```python
print("not output")
```

Prose before it, so this block is not output:

```text
anything
```
"""


def test_an_output_block_that_drifted_from_the_code_fails():
    run_page(PAGE.format(batches=2), "x.md")
    run_page(PAGE.format(batches="..."), "x.md")
    assert output_diff("a ...\nb: 1\nc", "a 7\nb: 2\nc\nd") == ("--- shown in the docs\n+++ printed by the example\n"
                                                               "@@ -1,3 +1,4 @@\n a ...\n-b: 1\n+b: 2\n c\n+d")
    with pytest.raises(pytest.fail.Exception) as failure:
        run_page(PAGE.format(batches=5), "x.md")
    assert str(failure.value) == ("x.md:6: the example's output differs from the ```text block after it "
                                  "(-shown, +printed):\n--- shown in the docs\n+++ printed by the example\n"
                                  "@@ -1,2 +1,2 @@\n rows: 3\n-batches: 5\n+batches: 2")


def test_every_output_block_follows_its_example():
    blocks = python_blocks(PAGE.format(batches=2))
    assert [(line, shown) for line, _, shown in blocks] == [(6, "rows: 3\nbatches: 2\n"), (16, None)]
