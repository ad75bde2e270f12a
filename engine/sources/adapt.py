"""Adapters from the user's data to one map-style interface with batched fetch and cheap views.

Every source answers ``__getitems__(indices)`` with a :class:`RowBatch` (or, once the loader asks for columns,
a :class:`collators.columns.ColumnBatch` fetched column-wise), which carries the batch's ``rng_seed`` from the
sampler to the collator. ``view(indices)`` selects a split without copying rows.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from collators.columns import SpanColumn
from engine.sources._arrow_fetch import ArrowBatchFetcher
from engine.sources.bad_rows import first_readable
from engine.sources.files import is_path_data, load_paths
from engine.sources.kinds import ACCEPTED, TupleRows, columns_dataset, is_column_dict, tuple_fields
from engine.sources.rows import ColumnarSource, MapSource
from engine.sources.shards.listing import Shards, is_url
from engine.sources.shards.source import ShardedSource

try:  # datasets is a dependency, but sources of other kinds must not need it at import time
    import datasets as hf_datasets
except ImportError:  # pragma: no cover
    hf_datasets = None


class HFSource(ColumnarSource):
    """A Hugging Face ``datasets.Dataset``: batches fetched column-wise from Arrow, splits via ``select`` (no copy).

    Handing columns, ``__getitems__`` answers a :class:`collators.columns.ColumnBatch`: the token columns
    straight from Arrow's flat buffers. Datasets with a format (``with_format('torch')``) or hidden columns get a
    :class:`RowBatch`, and so does a split with a per-row transform (a transform needs rows).
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self._fetchers: list[ArrowBatchFetcher] = []  # one, built on first use; shared with this source's copies
        self._columnar = ArrowBatchFetcher.supports(dataset)

    def __len__(self) -> int:
        return len(self.dataset)

    def columnar(self) -> bool:
        return self._columnar

    def _fetch(self, positions: list[int]) -> list[dict[str, Any]]:
        columns = self.dataset[positions]
        names = list(columns)
        return [dict(zip(names, values)) for values in zip(*(columns[name] for name in names))]

    def fetch_columns(self, positions: Sequence[int]) -> dict[str, Any]:
        """The rows at ``positions`` as ``{column: RaggedColumn | list}``: token columns flat, others formatted."""
        if not self._fetchers:
            self._fetchers.append(ArrowBatchFetcher(self.dataset))
        return self._fetchers[0].gather(positions)

    @property
    def _fetcher(self) -> ArrowBatchFetcher | None:
        """The column fetcher, once built (shared by the copies a loader hands columns from, so the row spans a
        process keeps are computed once per process, however many loaders read this source)."""
        return self._fetchers[0] if self._fetchers else None

    def view(self, positions: np.ndarray) -> HFSource:
        source = HFSource(self.dataset.select(positions))
        source.hands_columns = self.hands_columns
        base = getattr(self, "positions", None)  # dataset indices of the view's rows, named in errors and seeds
        source.positions = base[positions] if base is not None else np.asarray(positions, dtype=np.int64)
        source.origins = self.origins
        return source

    @property
    def column_names(self) -> list[str]:
        return list(self.dataset.column_names)

    def without_columns(self, names: Sequence[str]) -> HFSource:
        """A copy of this source (its split, role and transform) without the columns ``names``."""
        source = copy.copy(self)
        source.dataset = self.dataset.remove_columns(list(names))
        source._fetchers, source._columnar = [], ArrowBatchFetcher.supports(source.dataset)
        return source

    def __getstate__(self) -> dict[str, Any]:
        # The fetcher holds numpy views of Arrow buffers: rebuilt in each worker rather than pickled as copies.
        return {**self.__dict__, "_fetchers": []}


class TorchSource(MapSource):
    """Any map-style torch ``Dataset`` (``__getitem__`` + ``__len__``), optionally through an index view."""

    def __init__(self, dataset: Dataset, positions: np.ndarray | None = None) -> None:
        self.dataset = dataset
        self.positions = positions

    def __len__(self) -> int:
        return len(self.positions) if self.positions is not None else len(self.dataset)

    def _fetch(self, positions: list[int]) -> list[Any]:
        if self.positions is not None:
            positions = self.positions[positions].tolist()
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is not None:
            return list(getitems(positions))
        return [self.dataset[i] for i in positions]

    def view(self, positions: np.ndarray) -> TorchSource:
        base = self.positions[positions] if self.positions is not None else np.asarray(positions, dtype=np.int64)
        return TorchSource(self.dataset, base)


class TensorListSource(ColumnarSource):
    """A list of tensors held as one flat buffer plus offsets: no per-row Python objects for workers to copy.

    Rows come back as views into the buffer (bare tensors, or ``{key: tensor}`` when ``key`` is set).
    """

    def __init__(self, tensors: Sequence[torch.Tensor], key: str | None = None) -> None:
        first = tensors[0]
        for index, tensor in enumerate(tensors):
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(
                    f"train_data is a list of tensors, but item {index} is a {type(tensor).__name__}; "
                    f"every item must be a torch.Tensor (wrap other data in a torch Dataset)"
                )
            if tensor.dtype != first.dtype or tensor.dim() != first.dim():
                raise TypeError(
                    f"train_data is a list of tensors of mixed kinds: item 0 is {first.dtype} with {first.dim()} "
                    f"dims, item {index} is {tensor.dtype} with {tensor.dim()} dims; convert them to one dtype "
                    f"and rank"
                )
        self.key = key
        self.buffer = torch.cat([t.reshape(-1) for t in tensors]) if len(tensors) else first.reshape(-1)
        self.shapes = torch.tensor([list(t.shape) for t in tensors], dtype=torch.long).reshape(len(tensors), -1)
        sizes = torch.tensor([t.numel() for t in tensors], dtype=torch.long)
        self.offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
        self.positions: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.positions) if self.positions is not None else len(self.shapes)

    def columnar(self) -> bool:
        """1-D integer rows (token ids): the text collator pads them straight from the buffer (the same result as
        from the rows); other rows keep the row path."""
        return not (self.buffer.dtype.is_floating_point or self.buffer.dtype in (torch.bool, torch.complex64,
                                                                               torch.complex128)
                    or self.shapes.shape[1] != 1)

    def fetch_columns(self, positions: Sequence[int]) -> dict[str, Any]:
        """``{key: SpanColumn}`` of the rows at ``positions`` (key ``input_ids`` for bare rows): spans of the buffer,
        nothing copied."""
        rows = np.asarray(positions, dtype=np.int64)
        if self.positions is not None:
            rows = self.positions[rows]
        return {self.key or "input_ids": SpanColumn(self.buffer.numpy(), *self._spans(rows))}

    def _spans(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where ``rows`` (indices into the rows given) start in the buffer, and their lengths."""
        offsets = self.offsets.numpy()
        return offsets[rows], offsets[rows + 1] - offsets[rows]

    @property
    def column_names(self) -> list[str]:
        return [self.key or "input_ids"]

    def _row(self, index: int) -> torch.Tensor:
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        return self.buffer[start:end].view(self.shapes[index].tolist())  # a list: 0-d rows too

    def _fetch(self, positions: list[int]) -> list[Any]:
        if self.positions is not None:
            positions = self.positions[positions].tolist()
        rows = [self._row(i) for i in positions]
        return rows if self.key is None else [{self.key: row} for row in rows]

    def view(self, positions: np.ndarray) -> TensorListSource:
        clone = object.__new__(TensorListSource)
        clone.__dict__.update(self.__dict__)
        base = self.positions[positions] if self.positions is not None else np.asarray(positions, dtype=np.int64)
        clone.positions = base
        return clone


def is_hf_dataset(data: Any) -> bool:
    return hf_datasets is not None and isinstance(data, hf_datasets.Dataset)


def as_source(data: Any, *, key: str | None = None, spec: Any = None, what: str = "train_data",
              on_error: str = "raise") -> MapSource:
    """Adapt ``data`` (HF Dataset, map-style torch Dataset, list of tensors, DataFrame, tuple rows, a dict of
    columns, or paths to files) to a :class:`MapSource`; anything else is refused with the kinds accepted.

    A torch dataset's first row is read to see its fields; one that fails is named with the fix, or with
    ``on_error`` 'skip'/'warn' the first row that reads is used (:func:`engine.sources.bad_rows.first_readable`)."""
    if isinstance(data, MapSource):
        return data
    if isinstance(data, Shards) or is_url(data):  # streamed a row group at a time through the local cache
        return ShardedSource.from_shards(data if isinstance(data, Shards) else Shards(data))
    if is_hf_dataset(data):
        return HFSource(data)
    if type(data).__name__ == "DataFrame" and type(data).__module__.startswith("pandas"):
        return HFSource(hf_datasets.Dataset.from_pandas(data, preserve_index=False))  # Arrow, no row copies
    if is_column_dict(data, spec, what):
        return TorchSource(columns_dataset(data))
    if is_path_data(data):
        return HFSource(load_paths(data, what))  # .csv, .json(l), .parquet or a folder, read by datasets into Arrow
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
    if isinstance(data, Dataset) or (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        if spec is None or not len(data):
            return TorchSource(data)
        first = first_readable(data.__getitem__, len(data), what, on_error)
        fields = tuple_fields(data[first], spec)  # reads a row
        source = TorchSource(TupleRows(data, fields, spec.target_field) if fields else data)
        source.first_index = first
        return source
    raise TypeError(f"{what} should be {ACCEPTED}, but got {type(data).__name__}")
