"""The parts of ``docs/api.md`` made from the settings' declarations (:data:`engine.loading.settings.SETTINGS`):
``UniversalDataModule``'s signature, its settings table and ``DataLoaderConfig``'s signature.

Each part sits between ``<!-- generated: NAME -->`` and ``<!-- end generated -->``; ``python -m
engine.datamodule.settings_doc`` rewrites them (``--check``: exit 1 where they differ, rewriting nothing).
``tests/docs/test_settings_table.py`` fails while they differ.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from engine.datamodule.universal import UniversalDataModule
from engine.loading.config import DataLoaderConfig
from engine.loading.settings import BY_NAME, Setting

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
WIDTH = 118
"""The longest line of a generated signature, its indentation included."""
REGION = re.compile(r"^(?P<indent>[ ]*)<!-- generated: (?P<name>[^>]+?) -->\n.*?^[ ]*<!-- end generated -->$",
                    re.MULTILINE | re.DOTALL)


def shown(value: Any) -> str:
    """A default as the docs write it: strings in double quotes, the rest as ``repr``."""
    return f'"{value}"' if isinstance(value, str) else repr(value)


def signature_text(name: str, parameters: Iterable[str]) -> list[str]:
    """``name(p1, p2, ...)`` wrapped under its opening parenthesis, each line at most :data:`WIDTH` long."""
    lines, line = [], f"{name}("
    for index, parameter in enumerate(parameters):
        piece = parameter if index == 0 else f" {parameter}"
        if len(line) + len(piece) + 1 > WIDTH - 2 and index:
            lines.append(line.rstrip())
            line = " " * (len(name) + 1) + parameter
        else:
            line += piece
        line += ","
    return [*lines, line.rstrip(",") + ")"]


def module_signature() -> list[str]:
    """``UniversalDataModule``'s signature as written, its keyword-only marker included."""
    parameters, marked = [], False
    for parameter in inspect.signature(UniversalDataModule).parameters.values():
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and not marked:
            parameters.append("*")
            marked = True
        parameters.append(f"{parameter.name}={shown(parameter.default)}")
    return ["```text", *signature_text("UniversalDataModule", parameters), "```"]


def config_signature() -> list[str]:
    """``DataLoaderConfig``'s signature: its fields (the loader settings) and their defaults."""
    parameters = [f"{field.name}={shown(field.default)}" for field in dataclasses.fields(DataLoaderConfig)]
    return ["```text", *signature_text("DataLoaderConfig", parameters), "```"]


def in_a_checkpoint(setting: Setting) -> str:
    if not setting.recorded:
        return "given again"
    return "recorded; checked on resume" if setting.resume else "recorded"


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def settings_table() -> list[str]:
    """A row per keyword, in the signature's order: type, default, the values checked (by the declaration; "—":
    with the spec or the data, where the setting is resolved), what a checkpoint does with it, and its doc."""
    rows = ["| setting | type | default | values checked | in a checkpoint | what it is |",
            "|---|---|---|---|---|---|"]
    for name in inspect.signature(UniversalDataModule).parameters:
        setting = BY_NAME[name]
        checked = setting.check.describe() if setting.check is not None else "—"
        rows.append(f"| `{name}` | `{cell(setting.type)}` | `{cell(shown(setting.default))}` | {cell(checked)} | "
                    f"{in_a_checkpoint(setting)} | {cell(setting.doc)} |")
    return rows


PARTS: dict[str, Callable[[], list[str]]] = {
    "UniversalDataModule signature": module_signature,
    "settings table": settings_table,
    "DataLoaderConfig signature": config_signature,
}
"""The generated parts of ``docs/api.md``, by the name in their marker."""


def render(text: str) -> str:
    """``text`` (``docs/api.md``) with every generated part made again; an unknown part name is refused."""
    def part(match: re.Match[str]) -> str:
        indent, name = match["indent"], match["name"]
        if name not in PARTS:
            raise ValueError(f"docs/api.md names a generated part {name!r}, but the parts are {sorted(PARTS)}")
        body = [f"{indent}{line}" if line else "" for line in PARTS[name]()]
        return "\n".join([f"{indent}<!-- generated: {name} -->", *body, f"{indent}<!-- end generated -->"])

    return REGION.sub(part, text)


def main(argv: list[str] | None = None) -> int:
    """Rewrite the generated parts of ``docs/api.md``; with ``--check``, exit 1 where they differ instead."""
    argv = sys.argv[1:] if argv is None else argv
    text = API_DOC.read_text(encoding="utf-8")
    made = render(text)
    if made == text:
        return 0
    if "--check" in argv:
        print(f"{API_DOC} differs from the settings' declarations; run python -m engine.datamodule.settings_doc")
        return 1
    API_DOC.write_text(made, encoding="utf-8")
    print(f"rewrote the generated parts of {API_DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
