"""The layers above ``engine/sources/`` meet sources through the ``Source`` protocol, and the documents that describe
the layout and the public API match the code.

The import-linter ``forbidden`` contract (``pyproject.toml``) keeps loading, collation and the tools from importing
concrete sources; this file checks what a contract cannot: no ``isinstance`` against a class defined in
``engine/sources/`` anywhere above it, every built-in source meeting the protocol, and the docs naming each module
and the signatures as they are.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import engine
from engine import Mixture, Shards, Source, Stateful, UserSource
from engine.sources.adapt import as_source

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "engine"
ABOVE_SOURCES = ("collation", "loading", "tools", "datamodule", "multi", "sampling")


def source_classes() -> set[str]:
    """The names of the classes defined in ``engine/sources/``."""
    names = set()
    for path in (ENGINE / "sources").rglob("*.py"):
        names |= {node.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)}
    return names


def isinstance_targets(node: ast.Call) -> list[str]:
    """The class names an ``isinstance(x, C)`` or ``isinstance(x, (C, D))`` call checks against."""
    if not (isinstance(node.func, ast.Name) and node.func.id == "isinstance" and len(node.args) == 2):
        return []
    kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
    return [kind.id if isinstance(kind, ast.Name) else kind.attr for kind in kinds
            if isinstance(kind, (ast.Name, ast.Attribute))]


def test_nothing_above_sources_dispatches_on_a_concrete_source_class():
    concrete = source_classes() - {"Source", "UserSource", "EpochBlocks"}
    found = []
    for layer in ABOVE_SOURCES:
        for path in (ENGINE / layer).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call):
                    found += [f"{path.relative_to(ROOT)}:{node.lineno} {name}" for name in isinstance_targets(node)
                              if name in concrete]
    assert found == []


def test_the_forbidden_contract_names_the_concrete_source_modules():
    text = (ROOT / "pyproject.toml").read_text()
    contract = text[text.index('type = "forbidden"'):]
    for module in ("engine.sources.wrappers", "engine.sources.mixed", "engine.sources.shards.source"):
        assert f'"{module}"' in contract


def built_in_sources(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    rows = [torch.arange(2 + n % 5) for n in range(12)]
    pq.write_table(pa.table({"input_ids": [row.tolist() for row in rows]}), tmp_path / "part-0.parquet",
                   row_group_size=4)
    sources = {"tensors": as_source(rows),
               "torch": as_source(torch.utils.data.TensorDataset(torch.arange(12))),
               "hf": as_source(datasets.Dataset.from_dict({"input_ids": [row.tolist() for row in rows]})),
               "shards": as_source(Shards(str(tmp_path), cache_dir=tmp_path / "cache"))}
    from engine.sources.mixed import MixedSource

    sources["mixture"] = MixedSource({"a": sources["tensors"], "b": sources["hf"]})
    return sources


def test_every_built_in_source_meets_the_protocol_and_answers_it(tmp_path):
    for name, source in built_in_sources(tmp_path).items():
        assert isinstance(source, Source), name
        assert isinstance(source.fingerprint(), str) and source.fingerprint() == source.fingerprint(), name
        assert len(source.__getitems__([0, 1])) == 2, name
        assert source.parts()[0][1] is source or [part for _, part in source.parts()] == list(source.sources), name
        view = source.view([1, 2]) if name != "mixture" else source
        assert isinstance(view, Source), name


def test_the_stateful_parts_meet_stateful():
    import torch

    from engine import SeededBatchSampler, SkipReport
    from engine.loading.factory import DataLoaderFactory

    loader = DataLoaderFactory().create_dataloader([torch.arange(3)] * 4)
    for part in (loader, SeededBatchSampler(4, 2, seed=0), SkipReport("skip")):
        assert isinstance(part, Stateful), type(part).__name__
    report = SkipReport("skip")
    report.load_state_dict({"train": 3})
    assert report.state_dict() == {"train": 3}
    with pytest.raises(TypeError, match="a skip report's state should be"):
        report.load_state_dict(3)


def test_a_user_source_meets_user_source_and_is_valid_data():
    class Rows:
        def __len__(self):
            return 3

        def __getitems__(self, positions):
            return [{"input_ids": [1, 2, position + 3]} for position in positions]

    assert isinstance(Rows(), UserSource)
    source = as_source(Rows())
    assert isinstance(source, Source) and source.__getitems__([2])[0] == {"input_ids": [1, 2, 5]}


def module_paths() -> list[Path]:
    return sorted(path for path in ENGINE.rglob("*.py") if path.name != "__init__.py")


def test_the_architecture_page_names_every_module_of_the_engine_and_no_other():
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = [str(path.relative_to(ROOT)) for path in module_paths()
               if f"`{path.name}`" not in text and f"{path.relative_to(ROOT)}`" not in text]
    assert missing == [], "docs/architecture.md does not describe these modules"
    named = set(re.findall(r"`(engine/[\w/]+\.py)`", text))
    assert sorted(name for name in named if not (ROOT / name).exists()) == []
    folders = {path.parent.relative_to(ROOT) for path in module_paths()} - {Path("engine")}
    for folder in folders:
        assert f"{folder.name}/" in text, f"docs/architecture.md does not name the folder {folder}"


def documented_signature(name: str) -> list[tuple[str, str | None]]:
    """``[(parameter, default text or None)]`` of ``**`name`**: `name(...)``` in docs/api.md."""
    text = (ROOT / "docs" / "api.md").read_text()
    start = text.index(f"**`{name}`**: `{name}(") + len(f"**`{name}`**: `{name}(")
    depth, end = 1, start
    while depth:
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        end += 1
    inner = " ".join(text[start:end - 1].split())
    parts, depth, current = [], 0, ""
    for char in inner:
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(char, 0)
        current += char
    parts.append(current.strip())
    out = []
    for part in parts:
        if part == "*":
            continue
        key, _, default = part.partition("=")
        out.append((key.strip(), default.strip() or None))
    return out


@pytest.mark.parametrize("cls", [Shards, Mixture])
def test_the_api_page_shows_the_full_signature(cls):
    documented = documented_signature(cls.__name__)
    actual = inspect.signature(cls).parameters.values()
    assert [name for name, _ in documented] == [parameter.name for parameter in actual]
    for (name, text), parameter in zip(documented, actual):
        if parameter.default is inspect.Parameter.empty:
            assert text is None, name
            continue
        value = eval(text.replace(" GiB", " * 2**30"), {})  # noqa: S307 - the page's own default, e.g. 4 GiB
        assert value == parameter.default, f"{cls.__name__}({name}=...) is documented as {text}"


def test_the_readme_says_that_shards_in_object_storage_and_mixtures_exist():
    text = (ROOT / "README.md").read_text()
    assert "s3://" in text and "Shards" in text and "Mixture" in text and "docs/sources.md" in text


def test_every_public_name_is_exported():
    assert {"Source", "UserSource", "Stateful"} <= set(engine.__all__)
