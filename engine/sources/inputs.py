"""Checks of the user's data against the TaskSpec, run at construction so errors point at the call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.sources.adapt import HFSource, MapSource, TensorListSource
from task_spec import TaskSpec


def text_fields(spec: TaskSpec) -> tuple[str, str | None]:
    """The raw-text column of the inputs and, for seq2seq, of the targets."""
    config = spec.preprocessing_config
    default_source = "source" if spec.task_type == "seq2seq" else "text"
    target = config.get("target_text_field", "target") if spec.task_type == "seq2seq" else None
    return config.get("text_field", default_source), target


def token_field(spec: TaskSpec) -> str:
    """The input field raw text is tokenized into: ``input_ids`` when the spec reads it (a multimodal spec's
    ``("pixel_values", "input_ids")`` too), else the first input field."""
    return "input_ids" if "input_ids" in spec.input_fields else spec.input_fields[0]


def row_keys(source: MapSource) -> list[str] | None:
    """Column names of ``source``, or the keys of its first row; None when rows are not mappings."""
    if isinstance(source, HFSource):
        return source.column_names
    if isinstance(source, TensorListSource):
        return [source.key] if source.key is not None else None
    first = source.first_row()
    return list(first) if isinstance(first, Mapping) else None


def needs_tokenizer(keys: list[str] | None, spec: TaskSpec | None, source: MapSource) -> bool:
    """Whether rows hold raw text where the spec expects token ids."""
    if spec is None or spec.modality not in ("text", "multimodal") or keys is None:
        return False
    text_field, _ = text_fields(spec)
    if token_field(spec) in keys or text_field not in keys:
        return False
    if isinstance(source, HFSource):
        return True
    return isinstance(source.first_row()[text_field], str)


def check_inputs(
    source: MapSource, spec: TaskSpec | None, tokenizer: Any, role: str, *, require_target: bool = True
) -> None:
    """Raise a ValueError naming the problem and the fix if ``source`` cannot serve ``spec``.

    ``require_target=False`` (prediction data) checks the inputs only.
    """
    if len(source) == 0:
        raise ValueError(f"{role} is empty: it has 0 rows; give at least one row")
    if spec is None:
        return
    keys = row_keys(source)
    supervised = spec.is_supervised and require_target
    if keys is None:
        if supervised:
            raise ValueError(
                f"{role} rows are bare values without labels, but the task {spec.name!r} "
                f"(task_type={spec.task_type!r}) is supervised and needs {spec.target_field!r}; give rows as "
                f"dicts such as {{{spec.input_fields[0]!r}: ..., {spec.target_field!r}: ...}}"
            )
        return
    text_field, target_text = text_fields(spec)
    raw_text = needs_tokenizer(keys, spec, source)
    if raw_text and tokenizer is None:
        raise ValueError(
            f"{role} holds raw text in {text_field!r} but no tokenizer was given; pass tokenizer=... "
            f"(e.g. a transformers tokenizer) or give token ids under {token_field(spec)!r}"
        )
    missing = [f for f in spec.input_fields if f not in keys and not (raw_text and f == token_field(spec))]
    if missing:
        hint = f" or raw text under {text_field!r} with tokenizer=" if spec.modality == "text" else ""
        raise ValueError(
            f"{role} has no input field {missing[0]!r} required by the task {spec.name!r}; available fields: "
            f"{', '.join(map(repr, keys))}. Rename the field{hint}, or set TaskSpec.input_fields"
        )
    has_target = spec.target_field in keys or (raw_text and target_text in keys)
    if supervised and not has_target:
        raise ValueError(
            f"{role} has no labels: the task {spec.name!r} (task_type={spec.task_type!r}) needs the target field "
            f"{spec.target_field!r}, but the available fields are {', '.join(map(repr, keys))}. Rename the label "
            f"field or set TaskSpec.target_field"
        )
    if raw_text and isinstance(source, HFSource):
        check_text_cells(source.dataset, [c for c in (text_field, target_text) if c in keys], role)


def check_text_cells(dataset: Any, columns: list[str], role: str) -> None:
    """Refuse a raw-text column with empty (None) cells before the tokenizer meets one, naming the column, the
    first such row (its index in the data given) and the fix; read from Arrow's null counts, no row is built."""
    import pyarrow.compute as pc

    for column in columns:
        values = dataset.with_format("arrow")[column]
        if not values.null_count:
            continue
        first = pc.index(pc.is_null(values), True).as_py()
        more = f" (and {values.null_count - 1} more rows)" if values.null_count > 1 else ""
        raise ValueError(
            f"{column!r} should be a string in every row of {role}, but got {column}=None in row {first}{more}; "
            f"the tokenizer needs text in each row: filter those rows out (dataset.filter(lambda row: "
            f"row[{column!r}] is not None), or pandas df.dropna(subset=[{column!r}])) or fill them "
            f"(df[{column!r}].fillna(''))"
        )
