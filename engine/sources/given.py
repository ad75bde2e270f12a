"""What a module was given: each role's data adapted to a source and checked against the spec at construction
(:func:`take_inputs`, before any data is read in bulk, so a mistake is reported at the call that made it), then
tokenized, fingerprinted and split at setup (:func:`prepare_inputs`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from engine.options import check_data_arguments
from engine.sources.adapt import MapSource, TorchSource, as_source
from engine.sources.inputs import check_inputs, token_field
from engine.sources.kinds import is_hf_dataset_dict, unpack_dataset_dict
from engine.sources.lengths import describe_truncation, truncation_of
from engine.sources.preprocess import prepare_source, prepare_stream
from engine.sources.streams import EpochStream, check_stream_options, is_hf_stream, peek_rows, stream_fingerprint
from engine.sources.transforms import RowTransform
from engine.splits import SplitPlan, plan_splits, split_views
from engine.state import data_fingerprint
from task_spec import TaskSpec

ROLES = ("train", "val", "test", "predict")


def take_inputs(train_data: Any, *, val_data: Any, test_data: Any, predict_data: Any, task_spec: Any,
                tokenizer: Any, val_split: float | int, test_split: float | int, shuffle: bool | None, seed: int,
                uneven: str, multi_config: Any = None) -> tuple[dict[str, MapSource], Any]:
    """``(sources by role, stream or None)``: the data adapted and checked; a stream's train entry is a peek.

    A ``DatasetDict`` is unpacked into its splits; a ``datasets.IterableDataset`` is kept aside as the stream
    (its first row is checked here, the stream itself is wrapped at setup).
    """
    if task_spec is not None and not isinstance(task_spec, TaskSpec):
        raise TypeError(f"task_spec should be a TaskSpec, but got {type(task_spec).__name__}: {task_spec!r}")
    if multi_config is not None:
        raise ValueError("multi_config applies to several named datasets (train_data={name: data}), but "
                         "train_data is a single dataset; drop multi_config")
    if is_hf_dataset_dict(train_data):
        train_data, val_data, test_data = unpack_dataset_dict(train_data, val_data, test_data)
    check_data_arguments(has_train=train_data is not None, has_predict=predict_data is not None,
                         val_data=val_data, test_data=test_data, val_split=val_split, test_split=test_split,
                         uneven=uneven)
    stream = train_data if is_hf_stream(train_data) else None
    if stream is not None:
        check_stream_options(val_split=val_split, test_split=test_split, shuffle=shuffle)
        train_data = None
    key = task_spec.input_fields[0] if task_spec is not None else None
    given = {role: as_source(data, key=key, spec=task_spec, what=f"{role}_data")
             for role, data in zip(ROLES, (train_data, val_data, test_data, predict_data)) if data is not None}
    if stream is not None:
        given["train"] = TorchSource(peek_rows(stream, 1))  # checked below, replaced at setup
    for role, source in given.items():
        check_inputs(source, task_spec, tokenizer, f"{role}_data", require_target=role != "predict")
    if train_data is not None:  # validates the split arguments now, before any work
        plan_splits(len(given["train"]), val_split=val_split, test_split=test_split, seed=seed)
    return given, stream


def prepare_inputs(given: dict[str, MapSource], stream: Any, task_spec: Any, tokenizer: Any, *,
                   val_split: float | int, test_split: float | int, seed: int, rank: int, world_size: int,
                   transforms: Mapping[str, RowTransform | None] | None = None,
                   ) -> tuple[dict[str, Any], str | None, SplitPlan | None]:
    """``(sources by role, data fingerprint, split plan)``: raw text tokenized once, the train data split, and
    each split (its own copy of the source, views cut by ``val_split`` included) given its ``transforms[role]``."""
    sources = {role: prepare_source(source, task_spec, tokenizer) for role, source in given.items()}
    if stream is not None:
        train = EpochStream(prepare_stream(stream, task_spec, tokenizer), rank=rank, world_size=world_size)
        others = {role: source for role, source in sources.items() if role != "train"}
        return {**_for_roles(others, transforms), "train": train}, stream_fingerprint(stream), None
    if "train" not in sources:
        return _for_roles(sources, transforms), None, None
    plan = plan_splits(len(sources["train"]), val_split=val_split, test_split=test_split, seed=seed)
    sources.update(split_views(sources["train"], plan, val=bool(val_split), test=bool(test_split)))
    return _for_roles(sources, transforms), data_fingerprint(given["train"]), plan


def _for_roles(sources: dict[str, MapSource], transforms: Mapping[str, Any] | None) -> dict[str, MapSource]:
    """Each source as its own copy serving its split (named in errors) with that split's transform."""
    return {role: source.for_role(role, (transforms or {}).get(role)) for role, source in sources.items()}


def log_truncation(train: Any, task_spec: Any, max_length: int | None) -> dict[str, int] | None:
    """Measure what truncation to ``max_length`` drops from the training rows and say it once in the log: long
    rows are never cut without a word. None where it cannot be read from the columns."""
    key = token_field(task_spec) if task_spec is not None else None
    report = truncation_of(train, key, max_length) if train is not None else None
    if report is not None and report["long_rows"]:
        logging.getLogger("engine").warning(describe_truncation(report, max_length))  # type: ignore[arg-type]
    return report
