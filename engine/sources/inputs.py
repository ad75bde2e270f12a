"""Checks of the user's data against the TaskSpec, run at construction so errors point at the call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.sources.rows import MapSource
from engine.sources.shards.source import ShardedSource
from engine.sources.wrappers import HFSource, TensorListSource
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
    if isinstance(source, (HFSource, ShardedSource)):  # from the schema: a shard's row costs a row group's fetch
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
    if isinstance(source, ShardedSource):
        return source.holds_text(text_field)
    return isinstance(source.first_row()[text_field], str)


def check_length_batching(source: MapSource, spec: TaskSpec | None, batching: str, what: str = "train_data") -> None:
    """Refuse, at construction, length-aware batching of raw text that only the collator tokenizes (a torch
    ``Dataset``'s or a user's source's; a ``datasets.Dataset`` of raw text is tokenized at setup, so it has lengths):
    the samplers plan the epoch from every row's token count, which such rows do not have until a batch is read."""
    if batching == "plain" or spec is None:
        return
    for name, part in source.parts():
        where = what if name is None else f"{what}[{name!r}]"
        if isinstance(part, ShardedSource):
            key = spec.input_fields[0]
            import pyarrow as pa

            kind = part.listing.schema.field(key).type if key in part.column_names else None
            if (kind is not None and not part.holds_text(key)
                    and not (pa.types.is_list(kind) or pa.types.is_large_list(kind))):
                raise ValueError(f"batching={batching!r} plans each epoch from every row's length of {key!r}, "
                                 f"which {where} does not have (column {key!r} is {kind}: no per-row length); use "
                                 f"batching='plain'")
            continue
        if isinstance(part, TensorListSource):
            continue
        if isinstance(part, HFSource):  # its lengths are Arrow offsets: cheap to read now, as the sampler will
            if not needs_tokenizer(row_keys(part), spec, part):
                try:
                    part.lengths(spec.input_fields[0])
                except (KeyError, TypeError) as error:
                    raise ValueError(f"batching={batching!r} plans each epoch from every row's length of "
                                     f"{spec.input_fields[0]!r}, which {where} does not have ({error}); use "
                                     f"batching='plain'") from error
            continue
        keys, key = row_keys(part), spec.input_fields[0]
        if keys is not None and key in keys and isinstance(part.first_row()[key], (bytes, bytearray, dict)):
            raise ValueError(f"batching={batching!r} plans each epoch from every row's length of {key!r}, which "
                             f"{where} does not have (its rows hold encoded images there: no per-row length); "
                             f"use batching='plain'")
        if needs_tokenizer(keys, spec, part):
            raise ValueError(f"batching={batching!r} plans each epoch from every row's token count, but {where} "
                             f"({type(part.dataset).__name__ if hasattr(part, 'dataset') else type(part).__name__}) "
                             f"holds raw text, which the collator tokenizes a batch at a time; give the text as a "
                             f"datasets.Dataset (tokenized once at setup), tokenize it yourself, or use "
                             f"batching='plain'")


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
    supervised = spec.is_supervised and require_target and spec.target_field is not None  # None: contrastive pairs
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
    if spec.task_type in CLASS_TASKS and spec.target_field in keys:
        check_class_labels(source, spec, role)
    if raw_text and isinstance(source, HFSource):
        check_text_cells(source.dataset, [c for c in (text_field, target_text) if c in keys], role)


CLASS_TASKS = ("classification", "token_classification")
"""Task types whose labels are class ids."""


def class_names(source: MapSource | None, field: str) -> tuple[str, ...] | None:
    """The class names of a ``datasets.ClassLabel`` column ``field`` (per token: a list of ClassLabel), or None."""
    if not isinstance(source, HFSource) or field not in source.dataset.features:
        return None
    feature = source.dataset.features[field]
    feature = getattr(feature, "feature", feature)  # token classification: a list of ClassLabel
    return tuple(feature.names) if type(feature).__name__ == "ClassLabel" else None


def check_class_labels(source: MapSource, spec: TaskSpec, role: str) -> None:
    """Refuse string class labels now, before any text is tokenized (naming the first values and the fix), and a
    spec whose ``num_classes`` contradicts a ``ClassLabel`` column."""
    field = spec.target_field
    names = class_names(source, field)
    if names is not None:
        # the other splits' names are held to train's (check_same_classes), a more telling error
        if role == "train_data" and spec.num_classes is not None and spec.num_classes != len(names):
            raise ValueError(
                f"TaskSpec.num_classes should match {role}'s ClassLabel column {field!r} ({len(names)} classes: "
                f"{', '.join(map(repr, names))}), but got num_classes={spec.num_classes}; set "
                f"spec.replace(additional_config={{'num_classes': {len(names)}}}), or re-encode the column"
            )
        return
    if isinstance(source, HFSource):  # the column's first values, read without decoding the other columns
        values = source.dataset.select_columns([field]).select(range(min(len(source), 8)))[field]
    elif isinstance(source, ShardedSource) and not source.holds_text(field):
        values = []  # no string by the schema: no row group fetched to show one
    else:  # the row the construction checks read already: other rows may be costly (images) or unreadable
        values = [source.first_row()[field]]
    flat = [item for value in values for item in (value if isinstance(value, (list, tuple)) else [value])]
    strings = list(dict.fromkeys(item for item in flat if isinstance(item, str)))
    if strings:
        shown = ", ".join(map(repr, strings[:3])) + (", ..." if len(strings) > 3 or len(flat) > len(strings) else "")
        raise ValueError(
            f"{role}'s label column {field!r} should hold class ids (ints) for task_type={spec.task_type!r}, but "
            f"got strings: {shown}; encode them first: train = train.class_encode_column({field!r}), then each "
            f"other split with split = split.cast_column({field!r}, train.features[{field!r}]) so that all share "
            f"one mapping (a DatasetDict's class_encode_column encodes each split on its own), or map them to ids "
            f"yourself"
        )


def check_same_classes(given: Mapping[str, MapSource], spec: TaskSpec | None) -> tuple[str, ...] | None:
    """The train split's class names (a ``ClassLabel`` column), refusing another split whose names differ: its ids
    would mean other classes. None when the train data has no ClassLabel column."""
    if spec is None or spec.task_type not in CLASS_TASKS:
        return None
    names = class_names(given.get("train"), spec.target_field)
    for role, source in given.items():
        other = class_names(source, spec.target_field)
        if names is not None and other is not None and other != names:
            raise ValueError(
                f"{role}_data's ClassLabel column {spec.target_field!r} should have train_data's class names "
                f"{list(names)}, but got {list(other)}: its ids would mean other classes; encode it with train's: "
                f"split = split.cast_column({spec.target_field!r}, train.features[{spec.target_field!r}]) on the "
                f"string column"
            )
    return names


def class_maps(names: tuple[str, ...] | None) -> tuple[dict[int, str] | None, dict[str, int] | None]:
    """``(id2label, label2id)`` of class names (as a transformers config takes them), or ``(None, None)``."""
    if names is None:
        return None, None
    return dict(enumerate(names)), {name: index for index, name in enumerate(names)}


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
