"""Column-wise batch fetch from a ``datasets.Dataset``'s Arrow table: one gather per column, no per-row dicts.

``datasets`` answers ``dataset[indices]`` by slicing the table once per row (and, through a ``select`` view,
by reading the indices mapping once per row), then builds Python lists of every token. Here the token columns
(lists of integers) are read through zero-copy numpy views of their Arrow offsets and values: a batch is one
vectorized gather per column into a flat buffer + offsets, which the collators pad directly. Other columns
(labels, strings, decoded features) go through ``datasets``' own Python formatter, so their values are exactly
what the row path gives.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from collators.columns import RaggedColumn, SpanColumn, numpy_of
from engine.sources import _arrow_buffers
from engine.sources._arrow_buffers import list_of_ints, shared_view, uniform_value


class _RaggedIndex:
    """Where every row of one list column lies in a single numpy array of its values, without copying them.

    A column in one chunk is read through zero-copy views of its values and offsets. Chunks of a memory-mapped
    file share one mapping, so one view of the mapping covers them all. Chunks held apart in memory are copied
    once per process into one buffer when they hold at most 512 MiB of values; above that a batch is gathered with
    one slice per row. In one view or one buffer, a batch's spans are found from its rows' chunks (one search of
    the chunk bounds) and those chunks' offsets, with vectorized arithmetic. Nothing is kept per row: a worker's
    memory does not grow with the number of rows.

    A one-byte column whose values are all one number (the attention mask of a tokenizer's output) hands over
    its spans as spans of a zero-stride array of that number: the collator writes the padded column from the
    padding layout alone, without reading the column.
    """

    def __init__(self, column: Any) -> None:
        chunks = [chunk for chunk in column.chunks if len(chunk)]
        self.bounds = np.cumsum([0] + [len(chunk) for chunk in chunks], dtype=np.int64)
        offsets = [numpy_of(chunk.offsets) for chunk in chunks]  # slice-adjusted, zero-copy
        values = [numpy_of(chunk.values) for chunk in chunks]  # copies only bit-packed bools
        self.chunk_offsets, self.chunk_values = offsets, values
        self.values: np.ndarray | None = None
        self.position_shift: np.ndarray | None = None
        """Per chunk: a row's index in :attr:`offsets` minus its index in the column (None for one chunk)."""
        uniform = uniform_value(values)
        self.uniform = None if uniform is None else np.broadcast_to(uniform, (max(
            int(np.maximum.reduce(np.diff(array))) if len(array) > 1 else 0 for array in offsets),))
        """Every value of the column, repeated as long as its longest row (a read-only zero-stride view), or None."""
        if len(chunks) == 1:
            self.values, self.offsets, self.value_base = values[0], offsets[0], None
            return
        if not chunks:
            return
        value_views = shared_view(values, [chunk.values.buffers()[1] for chunk in chunks])
        offset_views = shared_view(offsets, [chunk.offsets.buffers()[1] for chunk in chunks])
        if value_views is not None and offset_views is not None:
            (self.values, self.value_base), (self.offsets, offset_base) = value_views, offset_views
        elif sum(array.nbytes for array in values) <= _arrow_buffers.COMBINE_LIMIT:
            sizes = np.asarray([len(array) for array in values], dtype=np.int64)
            self.values = np.concatenate(values)
            self.value_base = np.cumsum(sizes) - sizes
            self.offsets = np.concatenate(offsets)
            offset_base = self.bounds[:-1] + np.arange(len(chunks), dtype=np.int64)  # one extra entry each
        else:
            return
        self.position_shift = offset_base - self.bounds[:-1]

    def gather(self, rows: np.ndarray) -> SpanColumn | RaggedColumn:
        """The rows as spans of one values array (no copy), or, for large in-memory chunks, a new flat buffer."""
        if not len(rows) or not self.chunk_values:
            dtype = self.chunk_values[0].dtype if self.chunk_values else np.int64
            return SpanColumn(np.empty(0, dtype=dtype), np.zeros(len(rows), dtype=np.int64),
                              np.zeros(len(rows), dtype=np.int64))
        if self.values is None:
            return self._sliced(rows)
        starts, lengths = self._spans(rows)
        if self.uniform is not None:  # every row is a prefix of the one repeated value
            return SpanColumn(self.uniform, np.zeros(len(rows), dtype=np.int64), lengths)
        return SpanColumn(self.values, starts, lengths)

    def _spans(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where ``rows`` start in :attr:`values`, and their lengths (int64)."""
        if self.position_shift is None:
            positions, value_base = rows, 0
        else:
            chunk = np.searchsorted(self.bounds, rows, side="right") - 1
            positions = rows + self.position_shift[chunk]
            value_base = self.value_base[chunk]
        starts = self.offsets[positions].astype(np.int64)
        return starts + value_base, (self.offsets[positions + 1] - starts).astype(np.int64, copy=False)

    def _sliced(self, rows: np.ndarray) -> RaggedColumn:
        chunk = np.searchsorted(self.bounds, rows, side="right") - 1
        local = rows - self.bounds[chunk]
        pieces = [self.chunk_values[k][self.chunk_offsets[k][i]:self.chunk_offsets[k][i + 1]]
                  for k, i in zip(chunk.tolist(), local.tolist())]
        lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return RaggedColumn(np.concatenate(pieces), offsets)


def _as_int64(array: np.ndarray) -> np.ndarray:
    """``array`` as int64, viewed rather than copied where it is uint64 (row indices are far below 2**63)."""
    return array.view(np.int64) if array.dtype == np.uint64 else array.astype(np.int64, copy=False)


class ArrowBatchFetcher:
    """Gathers batches of rows of a plain-format ``datasets.Dataset`` as columns.

    Built lazily in each process (it holds numpy views of the Arrow buffers, which must not be pickled).
    :meth:`supports` says whether a dataset's rows would equal what this returns; datasets with a format
    (``with_format('torch')``, transforms) or hidden columns keep the row path.
    """

    def __init__(self, dataset: Any) -> None:
        from datasets.formatting import get_formatter

        self.dataset = dataset
        self.table = dataset.data.table
        indices = getattr(dataset, "_indices", None)
        # a view of the mapping, not a copy: a copy would be 8 bytes a row in every process
        self.indices = None if indices is None else _as_int64(indices.column(0).to_numpy())
        self.names = list(dataset.column_names)
        self.formatter = get_formatter(None, features=dataset.features)
        features = dataset.features
        self.ragged = {}
        from datasets.features.features import require_decoding

        for name in self.names:
            column = self.table.column(name)
            if not require_decoding(features[name]) and list_of_ints(column):
                self.ragged[name] = _RaggedIndex(column)

    @staticmethod
    def supports(dataset: Any) -> bool:
        """Plain Python format, every column visible, and an indices mapping this module understands."""
        fmt = dataset.format
        if fmt["type"] is not None or not dataset.column_names:
            return False
        if set(fmt["columns"]) != set(dataset.column_names) and not fmt["output_all_columns"]:
            return False
        indices = getattr(dataset, "_indices", None)
        mapped = dataset.data.num_rows if indices is None else indices.num_rows
        return mapped == len(dataset)  # guards against a datasets version that stores the mapping elsewhere

    def rows(self, positions: Any) -> np.ndarray:
        """Positions in the dataset (negative counts from the end, as ``datasets`` does) -> rows of the table."""
        positions = np.asarray(positions, dtype=np.int64).reshape(-1)
        size = len(self.dataset)
        low = positions.min() if len(positions) else 0
        if low < -size or (len(positions) and positions.max() >= size):
            bad = positions[(positions < -size) | (positions >= size)][0]
            raise IndexError(f"Invalid key: {int(bad)} is out of bounds for size {size}")
        positions = positions % size if low < 0 else positions
        return positions if self.indices is None else self.indices[positions]

    def gather(self, positions: Any) -> dict[str, Any]:
        """``{column: RaggedColumn | list}`` for the rows at ``positions``, in the dataset's column order."""
        rows = self.rows(positions)
        others = [name for name in self.names if name not in self.ragged]
        formatted = {}
        if others and len(rows):
            table = self.dataset.data.fast_gather(rows).select(others)
            formatted = self.formatter.format_batch(table)
        return {name: self.ragged[name].gather(rows) if name in self.ragged else formatted.get(name, [])
                for name in self.names}
