"""``spec.replace``: merging changed mappings into the current ones, and the REMOVE marker that deletes a key."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from task_spec.choices import MAPPING_FIELDS


class _Remove:
    """The type of :data:`REMOVE`; a single instance that survives pickling and copying."""

    __slots__ = ()
    _instance: _Remove | None = None

    def __new__(cls) -> _Remove:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "REMOVE"

    def __reduce__(self) -> str:
        return "REMOVE"


REMOVE: Any = _Remove()
"""In ``spec.replace``, a mapping value that deletes its key (``additional_config={'max_seq_len': REMOVE}``),
or a whole mapping field's value that empties it (``preprocessing_config=REMOVE``)."""


def merge_changes(current: Any, field_names: tuple[str, ...], changes: dict[str, Any]) -> dict[str, Any]:
    """``changes`` with each mapping merged into ``current``'s (REMOVE deletes a key); other fields as given."""
    merged: dict[str, Any] = {}
    for name, value in changes.items():
        if name not in field_names:
            close = difflib.get_close_matches(name, field_names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(
                f"TaskSpec.replace() arguments should be TaskSpec fields ({', '.join(field_names)}), but got "
                f"{name}={value!r}{hint}"
            )
        if name not in MAPPING_FIELDS:
            if value is REMOVE:
                raise ValueError(
                    f"TaskSpec.{name} should be given a value in replace(); REMOVE only deletes mapping keys "
                    f"({', '.join(MAPPING_FIELDS)}), but got {name}=REMOVE"
                )
            merged[name] = value
        elif value is REMOVE:
            merged[name] = {}
        elif isinstance(value, Mapping):
            merged[name] = _merge(name, getattr(current, name), value)
        else:
            merged[name] = value  # not a mapping: TaskSpec's own check names the field and the type
    return merged


def _merge(name: str, current: Mapping[Any, Any], update: Mapping[Any, Any]) -> dict[Any, Any]:
    if not update:
        raise ValueError(
            f"TaskSpec.replace({name}=...) should name the keys to change, but got {name}={{}}, which changes "
            f"nothing because replace() merges mappings; to empty the mapping pass {name}=REMOVE, to delete "
            f"one key pass {name}={{key: REMOVE}}"
        )
    result = dict(current)
    for key, value in update.items():
        if value is not REMOVE:
            result[key] = value
        elif key in result:
            del result[key]
        else:
            raise ValueError(
                f"TaskSpec.replace({name}={{{key!r}: REMOVE}}) should delete a key the spec holds, but got "
                f"{key!r}, which {name} does not hold; its keys are {', '.join(map(repr, current)) or '(none)'}"
            )
    return result
