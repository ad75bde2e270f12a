"""The kinds of data a module takes beyond datasets and tensor lists, and how each is read: tuple rows mapped onto
the spec's fields, a dict of columns, a ``DatasetDict``'s splits by their common names (paths to files are read
in ``files.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import Dataset


def is_hf_dataset_dict(data: Any) -> bool:
    try:
        import datasets as hf_datasets
    except ImportError:  # pragma: no cover
        return False
    return isinstance(data, hf_datasets.DatasetDict)


ACCEPTED = ("a datasets.Dataset or DatasetDict, a datasets.IterableDataset (a stream), a map-style torch Dataset "
            "(rows as dicts or (input, target) tuples), a list of tensors, a pandas DataFrame, a dict of equal-length "
            "column tensors keyed by the spec's fields, a path (str or pathlib.Path, or a list of them) to .csv, "
            ".json, .jsonl or .parquet files or to a folder of images or audio files, or {name: one of these} for "
            "several datasets")


class TupleRows(Dataset):
    """Rows given as tuples (torchvision datasets, ``TensorDataset``) seen as dicts keyed by the spec's fields:
    ``(input, target)`` -> ``{input_fields[0]: input, target_field: target}``; PIL images become CHW uint8.

    An input image is read as the vision collator reads PIL images (palette and alpha images become RGB); a target
    image keeps its values (a palette mask's class indices), as ``pil_to_tensor`` gives them."""

    def __init__(self, dataset: Any, fields: tuple[str, ...], target: str | None = None) -> None:
        self.dataset, self.fields, self.target = dataset, fields, target

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = self.dataset[index]
        if len(row) != len(self.fields):
            raise ValueError(f"row {index} is a tuple of {len(row)} values, but the spec's fields are {self.fields}; "
                             f"give rows as dicts, or set TaskSpec.input_fields/target_field to match")
        return {name: _as_tensor_image(value, index, name, is_target=name == self.target)
                for name, value in zip(self.fields, row)}


def _as_tensor_image(value: Any, index: int, name: str, *, is_target: bool) -> Any:
    if not type(value).__module__.startswith("PIL."):
        return value
    if is_target:
        from torchvision.transforms.v2.functional import pil_to_tensor

        return pil_to_tensor(value)
    from collators.images import to_chw

    return to_chw(value, index, name)


def tuple_fields(first: Any, spec: Any) -> tuple[str, ...] | None:
    """The field of each tuple position, when rows are tuples and the spec says which fields they are."""
    if not isinstance(first, tuple) or spec is None:
        return None
    fields = (*spec.input_fields, *([spec.target_field] if spec.target_field else []))
    if len(first) == 1:
        return fields[:1]
    if len(first) == 2 and spec.target_field:
        return (spec.input_fields[0], spec.target_field)
    if len(first) == len(fields):
        return fields
    raise ValueError(f"rows are tuples of {len(first)} values, but the spec's fields are {fields}; give rows as "
                     f"dicts, or set TaskSpec.input_fields/target_field so that their count matches")


def is_column_dict(data: Any, spec: Any) -> bool:
    """Whether ``data`` is one dataset's columns (keys among the spec's fields), not several named datasets."""
    if not isinstance(data, dict) or spec is None or is_hf_dataset_dict(data) or not data:
        return False
    if isinstance(spec, dict):
        return False
    return any(key in (*spec.input_fields, spec.target_field) for key in data)


def columns_dataset(columns: dict[str, Any]) -> Any:
    """Equal-length columns as rows ``{key: column[i]}`` without copying them (torch's ``StackDataset``)."""
    lengths = {key: len(column) for key, column in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"the columns should have equal lengths, but got {lengths}; give one value "
                         f"per row under each key")
    return torch.utils.data.StackDataset(**columns)


VALIDATION_NAMES = ("validation", "val", "valid", "dev", "eval")
"""Names a ``DatasetDict``'s validation split goes by (GLUE, SQuAD, many hub datasets)."""


def unpack_dataset_dict(data: Any, val_data: Any, test_data: Any) -> tuple[Any, Any, Any]:
    """The train, validation and test datasets of a ``DatasetDict``; explicit val/test data must not clash, and a
    split that would be ignored is refused rather than left out silently."""
    if "train" not in data:
        raise ValueError(f"the DatasetDict has no 'train' split; its splits are {list(data)}")
    found = [name for name in VALIDATION_NAMES if name in data]
    if len(found) > 1:
        raise ValueError(f"the DatasetDict has several validation splits {found}; pass one: "
                         f"UniversalDataModule(ds['train'], val_data=ds[{found[0]!r}], ...)")
    unknown = sorted(set(data) - {"train", "test", *VALIDATION_NAMES})
    if unknown:
        raise ValueError(f"the DatasetDict's splits {unknown} would be ignored (its splits are {list(data)}; known: "
                         f"train, test, {', '.join(VALIDATION_NAMES)}); pass them as val_data=/test_data= or drop them")
    val = data[found[0]] if found else None
    if val is not None and val_data is not None:
        raise ValueError(f"val_data was given, but the DatasetDict has a validation split {found[0]!r} too; pass one")
    return data["train"], val_data if val_data is not None else val, (
        test_data if test_data is not None else data.get("test")
    )


def is_named_datasets(train_data: Any, task_spec: Any = None) -> bool:
    """Whether ``train_data`` is ``{name: data}`` (several datasets): not a ``DatasetDict`` of splits, and not one
    dataset's columns (a dict whose keys are the spec's fields, such as ``{"input_ids": ..., "labels": ...}``)."""
    return (isinstance(train_data, Mapping) and not is_hf_dataset_dict(train_data)
            and not is_column_dict(train_data, task_spec))
