"""Adapters from the user's data to one map-style interface with batched fetch and cheap views.

Every source answers ``__getitems__(indices)`` with a :class:`RowBatch` (or, once the loader asks for columns,
a :class:`collators.columns.ColumnBatch` fetched column-wise), which carries the batch's ``rng_seed`` from the
sampler to the collator. ``view(indices)`` selects a split without copying rows.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch.utils.data import Dataset

from engine.sources.bad_rows import first_readable
from engine.sources.files import is_path_data, load_paths
from engine.sources.kinds import ACCEPTED, TupleRows, columns_dataset, is_column_dict, read_row, tuple_fields
from engine.sources.media import folder_columns
from engine.sources.protocol import Source, UserSource
from engine.sources.shards.listing import Shards, is_url
from engine.sources.shards.source import ShardedSource
from engine.sources.wrappers import HFSource, TensorListSource, TorchSource


def is_hf_dataset(data: Any) -> bool:
    # datasets (with pandas and pyarrow, seconds to import) is loaded wherever one of its datasets exists
    hf_datasets = sys.modules.get("datasets")
    return hf_datasets is not None and isinstance(data, hf_datasets.Dataset)


def as_source(data: Any, *, key: str | None = None, spec: Any = None, what: str = "train_data",
              on_error: str = "raise") -> Source:
    """Adapt ``data`` (HF Dataset, map-style torch Dataset, a user's source, list of tensors, DataFrame, tuple rows,
    a dict of columns, or paths to files) to a :class:`~engine.sources.protocol.Source`; anything else is refused
    with the kinds accepted. An object that meets the whole protocol is used as it is; a user's source that meets
    :class:`~engine.sources.protocol.UserSource` (``__len__`` and ``__getitems__``) is wrapped like a torch dataset.

    A torch dataset's first row is read to see its fields; one that fails is named with the fix, or with
    ``on_error`` 'skip'/'warn' the first row that reads is used (:func:`engine.sources.bad_rows.first_readable`)."""
    if isinstance(data, Source):  # a source already: built in, or a user's class that meets the whole protocol
        return data
    if isinstance(data, Shards) or is_url(data):  # streamed a row group at a time through the local cache
        return ShardedSource.from_shards(data if isinstance(data, Shards) else Shards(data))
    if is_hf_dataset(data):
        return HFSource(folder_columns(data, spec))  # an image folder's image and label read as a vision spec's
    if type(data).__name__ == "DataFrame" and type(data).__module__.startswith("pandas"):
        import datasets as hf_datasets

        return HFSource(hf_datasets.Dataset.from_pandas(data, preserve_index=False))  # Arrow, no row copies
    if is_column_dict(data, spec, what):
        return TorchSource(columns_dataset(data))
    if is_path_data(data):
        # .csv, .json(l), .parquet or a folder, read by datasets into Arrow (a folder's image and label columns as
        # a vision spec's fields)
        return HFSource(folder_columns(load_paths(data, what), spec))
    if isinstance(data, (str, bytes, int, float, dict)) or data is None:
        raise TypeError(f"{what} should be {ACCEPTED}, but got {type(data).__name__}: {data!r:.60}")
    if isinstance(data, (list, tuple)):
        if not data:
            raise ValueError("the data is an empty list; give at least one row")
        if isinstance(data[0], torch.Tensor):
            return TensorListSource(data, key=key)
        raise TypeError(
            f"a list given as data should hold torch.Tensors, but item 0 is a {type(data[0]).__name__}; "
            f"wrap other rows in a torch Dataset or a datasets.Dataset (Dataset.from_list(rows))"
        )
    if isinstance(data, torch.utils.data.IterableDataset):
        raise TypeError(
            "an IterableDataset has no length or random access, so it cannot be split or shuffled here; "
            "give a map-style Dataset (or a datasets.Dataset)"
        )
    if isinstance(data, (Dataset, UserSource)) or (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        if spec is None or not len(data):
            return TorchSource(data)
        first = first_readable(lambda index: read_row(data, index), len(data), what, on_error)
        fields = tuple_fields(read_row(data, first), spec)  # reads a row
        source = TorchSource(TupleRows(data, fields, spec.target_field) if fields else data)
        source.first_index = first
        return source
    raise TypeError(f"{what} should be {ACCEPTED}, but got {type(data).__name__}")
