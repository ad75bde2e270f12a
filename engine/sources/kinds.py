"""The kinds of data a module takes beyond datasets and tensor lists, and how each is read: tuple rows mapped onto
the spec's fields, a dict of columns, a ``DatasetDict``'s splits by their common names (paths to files are read
in ``files.py``)."""

from __future__ import annotations

import sys
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from engine.sources.files import is_path_data
from engine.sources.shards.listing import Shards, is_url


def is_hf_dataset_dict(data: Any) -> bool:
    hf_datasets = sys.modules.get("datasets")  # a DatasetDict exists only once datasets is imported
    return hf_datasets is not None and isinstance(data, hf_datasets.DatasetDict)


ACCEPTED = ("a datasets.Dataset or DatasetDict, a datasets.IterableDataset (a stream), a map-style torch Dataset "
            "(rows as dicts or (input, target) tuples), a list of tensors, a pandas DataFrame, a dict of "
            "equal-length columns (tensors, arrays or lists with one value per row), a path (str or pathlib.Path, "
            "or a list of them) to .csv, .json, .jsonl or .parquet files or to a folder of images or audio files, "
            "or {name: one of these} for several datasets")


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
        row = read_row(self.dataset, index)
        if len(row) != len(self.fields):
            raise ValueError(f"row {index} is a tuple of {len(row)} values, but the spec's fields are {self.fields}; "
                             f"give rows as dicts, or set TaskSpec.input_fields/target_field to match")
        return {name: _as_tensor_image(value, index, name, is_target=name == self.target)
                for name, value in zip(self.fields, row)}


def read_row(dataset: Any, index: int) -> Any:
    """Row ``index`` of a map-style dataset: ``dataset[index]``, or through its batched ``__getitems__`` when it has
    one (a user's source may define only that)."""
    getitems = getattr(dataset, "__getitems__", None)
    return getitems([index])[0] if getitems is not None else dataset[index]


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


COLUMN_NAMES = frozenset({
    "input_ids", "attention_mask", "token_type_ids", "special_tokens_mask", "position_ids", "labels", "label",
    "decoder_input_ids", "decoder_attention_mask", "pixel_values", "input_values", "features", "text", "source",
    "target", "image", "audio",
})
"""Keys that name a column wherever they appear (beside the spec's fields): a dict of lists of tensors under
them is one dataset's columns."""

COLUMNS, DATASETS = "columns", "datasets"


def _value_kind(value: Any) -> str:
    """'column' (a tensor, array or list of values: one per row), 'dataset' (a kind a module reads as one
    dataset), 'either' (a list of tensors: a ragged column, or a dataset of tensor rows), or 'neither'."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return "column" if value.ndim >= 1 else "neither"
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(item, torch.Tensor) for item in value):
            return "either"
        return "dataset" if is_path_data(value) else "column"
    if is_path_data(value) or is_url(value) or isinstance(value, Shards) or is_hf_dataset_dict(value) or isinstance(
            value, Dataset) or (
            type(value).__module__.split(".")[0] in ("datasets", "pandas")):
        return "dataset"
    if hasattr(value, "__getitem__") and hasattr(value, "__len__") and not isinstance(value, (str, bytes, Mapping)):
        return "dataset"  # a map-style dataset that does not subclass torch's
    return "neither"


def read_dict(data: Mapping[str, Any], spec: Any = None, *, what: str = "train_data",
              ambiguous: str | None = None, mixed: Collection[str] | None = None) -> str:
    """How a dict given as data is read: :data:`COLUMNS` (one dataset's columns) or :data:`DATASETS`
    (``{name: dataset}``). A ``DatasetDict`` is neither: it holds splits.

    The rule, value by value: a tensor, array or list of values is a column, and is never a dataset; a Dataset,
    DataFrame or path is a dataset, and is never a column. So a dict of columns is one dataset, and a dict of
    datasets is several, whatever the keys. A list of tensors is either (a ragged column, or a dataset of tensor
    rows): a dict of only such lists is columns when every key names a column (the spec's fields, or
    :data:`COLUMN_NAMES`) and the lists have equal lengths, named datasets when no key does, and otherwise
    ``ambiguous`` decides (``MultiDataModule`` passes :data:`DATASETS`), else it is refused naming both readings.
    ``mixed``: the sources a ``mix=`` weighs; a dict of lists of tensors whose keys are exactly those is named
    datasets, even when its keys are also column names.

    Raises:
        ValueError: a dict that mixes columns and datasets, or that reads both ways with no ``ambiguous``.
        TypeError: a value that is neither a column nor a dataset.
    """
    kinds = {key: _value_kind(value) for key, value in data.items()}
    for key, kind in kinds.items():
        if kind == "neither":
            raise TypeError(f"{what}[{key!r}] should be a column (a tensor, array or list with one value per row) or "
                            f"a dataset, but got {type(data[key]).__name__}: {data[key]!r:.60}")
    columns = [key for key, kind in kinds.items() if kind == "column"]
    datasets = [key for key, kind in kinds.items() if kind == "dataset"]
    if columns and datasets:
        raise ValueError(f"{what} mixes columns ({', '.join(map(repr, columns))}) and datasets "
                         f"({', '.join(map(repr, datasets))}); give one dataset's columns (a tensor, array or list "
                         f"with one value per row under each key) or {{name: dataset}}")
    if columns:
        return COLUMNS
    if datasets:
        return DATASETS
    if mixed is not None and set(data) == set(mixed):  # mix= names exactly these keys: sources, not columns
        return DATASETS
    names = set(COLUMN_NAMES)
    if spec is not None and not isinstance(spec, Mapping):
        names.update((*spec.input_fields, spec.target_field))
    named = [key for key in data if key in names]
    lengths = {len(value) for value in data.values()}
    if len(named) == len(data) and len(lengths) == 1:
        return COLUMNS
    if not named:
        return DATASETS
    if ambiguous is not None:
        return ambiguous
    keys = ", ".join(f"{key!r}: ..." for key in data)
    other = next(key for key in data if key not in names)
    sizes = f"every value has {lengths.pop()} items" if len(lengths) == 1 else "but the values' lengths differ"
    raise ValueError(
        f"{what}={{{keys}}} reads two ways: as one dataset's columns ({sizes}) or as named datasets (every value is "
        f"a list of tensors), and its keys do not decide ({named[0]!r} names a column, {other!r} does not); for "
        f"columns, pass datasets.Dataset.from_dict({what}) or torch.utils.data.StackDataset(**{what}), or a "
        f"TaskSpec whose input_fields/target_field name the keys; for named datasets, use "
        f"MultiDataModule({what}, ...)"
    )


def is_column_dict(data: Any, spec: Any, what: str = "train_data") -> bool:
    """Whether ``data`` is one dataset's columns (see :func:`read_dict`), not several named datasets."""
    if not isinstance(data, dict) or not data or is_hf_dataset_dict(data):
        return False
    return read_dict(data, spec, what=what) == COLUMNS


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


def is_named_datasets(train_data: Any, task_spec: Any = None, *, ambiguous: str | None = None,
                      mixed: Collection[str] | None = None) -> bool:
    """Whether ``train_data`` is ``{name: data}`` (several datasets): not a ``DatasetDict`` of splits, and not one
    dataset's columns (see :func:`read_dict`; ``ambiguous`` reads a dict that could be either, ``mixed`` names the
    sources of a ``mix=``)."""
    if not isinstance(train_data, Mapping) or is_hf_dataset_dict(train_data):
        return False
    return not train_data or read_dict(train_data, task_spec, ambiguous=ambiguous, mixed=mixed) == DATASETS
