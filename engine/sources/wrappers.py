"""The sources that wrap the objects users hand over: a Hugging Face ``datasets.Dataset`` (:class:`HFSource`, read
column-wise from Arrow), any map-style dataset, the user's own sources included (:class:`TorchSource`), and a list of
tensors (:class:`TensorListSource`, one flat buffer). :func:`engine.sources.adapt.as_source` picks among them."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from collators.columns import SpanColumn
from engine.sources._arrow_fetch import ArrowBatchFetcher
from engine.sources.kinds import TupleRows
from engine.sources.rows import ColumnarSource, MapSource, sampled_rows_digest


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

    lengths_from = "Arrow list offsets"

    def fingerprint(self) -> str:
        """``datasets``' own fingerprint of the (selected) table: it changes with every transform of the data."""
        return str(getattr(self.dataset, "_fingerprint", ""))

    def lengths(self, key: str | None) -> np.ndarray:
        """``pyarrow.compute.list_value_length`` on the column ``key`` (offsets only, no token copy).

        Raises:
            KeyError: ``key`` is not a column.
            TypeError: the column has no per-row length (raw text, a scalar).
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        dataset = self.dataset
        if key is None or key not in dataset.column_names:
            raise KeyError(f"lengths need a list column of the dataset, but got key={key!r}; "
                           f"columns are {dataset.column_names}")
        column = dataset.data.table.column(key)  # the full table: a select() view maps through its indices below
        if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)
                or pa.types.is_fixed_size_list(column.type)):
            raise TypeError(f"column {key!r} is {column.type}, which has no per-row length; tokenize the text first "
                            f"(the module does this at setup) or name a list column such as 'input_ids'")
        return _through_indices(dataset, pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64))

    def labels(self, field: str) -> np.ndarray | None:
        """The integer column ``field`` from Arrow (None when there is no such integer column)."""
        import pyarrow as pa

        dataset = self.dataset
        if field not in dataset.column_names:
            return None
        column = dataset.data.table.column(field)
        if not pa.types.is_integer(column.type):
            return None
        return _through_indices(dataset, column.to_numpy(zero_copy_only=False).astype(np.int64))

    def class_names(self, field: str) -> list[str] | None:
        """The names of a ``datasets.ClassLabel`` column (as ``load_dataset('imagefolder')`` makes them)."""
        import datasets

        feature = getattr(self.dataset, "features", {}).get(field)
        return list(feature.names) if isinstance(feature, datasets.ClassLabel) else None

    def __getstate__(self) -> dict[str, Any]:
        # The fetcher holds numpy views of Arrow buffers: rebuilt in each worker rather than pickled as copies.
        return {**self.__dict__, "_fetchers": []}


def _through_indices(dataset: Any, values: np.ndarray) -> np.ndarray:
    """``values`` of the full table, mapped through the rows a ``select()``/``shuffle()`` view keeps."""
    indices = getattr(dataset, "_indices", None)  # datasets keeps select()/shuffle() as an index mapping
    return values[indices.column(0).to_numpy(zero_copy_only=False)] if indices is not None else values


TORCH_SAMPLED_ROWS = 64
"""Rows a torch dataset without a ``fingerprint()`` is read for one (every row of a smaller dataset), twice."""


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

    @property
    def lengths_from(self) -> str:  # type: ignore[override]
        return f"{type(self._user_dataset).__name__}.lengths()"

    def row_places(self, positions: Sequence[int]) -> list[str] | None:
        """The dataset's own ``row_places(indices)`` where it defines one (an image's file), else None."""
        own = getattr(self._user_dataset, "row_places", None)
        if not callable(own):
            return None
        indices = self.positions[list(positions)].tolist() if self.positions is not None else list(positions)
        return list(own(indices))

    @property
    def _user_dataset(self) -> Any:
        """The dataset the user gave (tuple rows are seen through :class:`~engine.sources.kinds.TupleRows`)."""
        return self.dataset.dataset if isinstance(self.dataset, TupleRows) else self.dataset

    def fingerprint(self) -> str:
        """The dataset's class, its own ``fingerprint()`` (or ``fingerprint`` attribute) where it has one, else a
        digest of :data:`TORCH_SAMPLED_ROWS` evenly spaced rows (every row of a smaller dataset), read twice: rows
        that differ between two reads are augmented at random, and then only the class and the length are used, so
        that the same data still resume."""
        dataset = self._user_dataset
        parts = [f"{type(dataset).__module__}.{type(dataset).__qualname__}"]
        own = getattr(dataset, "fingerprint", None)
        if callable(own):
            value = own()
            if not isinstance(value, str):
                raise TypeError(f"{type(dataset).__name__}.fingerprint() should return a str, but got "
                                f"{type(value).__name__}: {value!r:.60}")
            parts.append(value)
        elif own is not None:
            parts.append(repr(own))
        else:
            read = [sampled_rows_digest(self._fetch, len(self), TORCH_SAMPLED_ROWS) for _ in range(2)]
            first, second = read
            parts.append(first if first == second else "rows drawn at random")
        if self.positions is not None:
            parts.append(hashlib.blake2b(self.positions.tobytes(), digest_size=12).hexdigest())
        return "".join(parts)

    def lengths(self, key: str | None) -> np.ndarray | None:
        """The dataset's own ``lengths(key)`` where it defines one (a user's source), else None."""
        own = getattr(self._user_dataset, "lengths", None)
        if not callable(own):
            return None
        lengths = own(key)
        if lengths is None:
            return None
        lengths = np.asarray(lengths)
        size = len(self._user_dataset)
        if lengths.shape != (size,) or not np.issubdtype(lengths.dtype, np.integer):
            raise ValueError(f"{type(self._user_dataset).__name__}.lengths({key!r}) should return one integer per "
                             f"row ({size} rows), but got an array of shape {lengths.shape} and dtype {lengths.dtype}")
        lengths = lengths.astype(np.int64)
        return lengths[self.positions] if self.positions is not None else lengths


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

    def spans(self) -> tuple[str, np.ndarray, np.ndarray, np.ndarray] | None:
        """Every row's span of the flat buffer (a split's rows through its positions); None for rows that are not
        read as columns."""
        if not self.columnar():
            return None
        rows = self.positions if self.positions is not None else np.arange(len(self.shapes), dtype=np.int64)
        return (self.key or "input_ids", self.buffer.numpy(), *self._spans(rows))

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

    lengths_from = "flat-buffer shapes"

    def fingerprint(self) -> str:
        """A digest of every row: the flat buffer, the shapes and the view's positions (hashing is cheap here)."""
        digest = hashlib.blake2b(digest_size=12)
        for array in (self.buffer, self.shapes):
            digest.update(str(array.dtype).encode())
            digest.update(array.contiguous().view(torch.uint8).numpy().tobytes() if array.numel() else b"")
        digest.update(self.positions.tobytes() if self.positions is not None else b"-")
        return digest.hexdigest()

    def lengths(self, key: str | None) -> np.ndarray:
        """Each row's first dimension, from the shapes (1 for 0-d rows).

        Raises:
            KeyError: ``key`` is not the rows' key.
        """
        if key is not None and self.key is not None and key != self.key:
            raise KeyError(f"the tensor list's rows hold the key {self.key!r}, but key={key!r} was asked for")
        lengths = self.shapes[:, 0].numpy() if self.shapes.shape[1] else np.ones(len(self.shapes), np.int64)
        return lengths.astype(np.int64)[self.positions] if self.positions is not None else lengths.astype(np.int64)

    def view(self, positions: np.ndarray) -> TensorListSource:
        clone = object.__new__(TensorListSource)
        clone.__dict__.update(self.__dict__)
        base = self.positions[positions] if self.positions is not None else np.asarray(positions, dtype=np.int64)
        clone.positions = base
        return clone
