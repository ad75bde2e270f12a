"""The columns protocol: how a batch fetched column-wise by the engine's source stage reaches the collators.

A source that can read whole columns (Arrow tables, a flat buffer of token ids) answers a batch with a
:class:`ColumnBatch`: ``{column: RaggedColumn | SpanColumn | list}`` already fetched, plus the batch's seed and
where its rows came from. Collators that read columns (``TextCollator``) pad straight from those flat buffers;
nothing here reads data or calls back into a source.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from collators._layout_index import span_index

__all__ = ["ColumnBatch", "RaggedColumn", "RowBatch", "SpanColumn", "numpy_of"]


def numpy_of(array: Any) -> np.ndarray:
    """``array.to_numpy(zero_copy_only=False)`` for a pyarrow integer or boolean array: an integer array without
    nulls as a read-only view of its data buffer (no copy, as ``to_numpy`` gives it). pyarrow's ``to_numpy``
    imports pandas at its first call, over a second that a fresh loader worker would add to its first batch."""
    import pyarrow as pa

    kind = array.type
    if not pa.types.is_integer(kind) or array.null_count or len(array) == 0:
        return array.to_numpy(zero_copy_only=False)
    dtype = np.dtype(f"{'u' if pa.types.is_unsigned_integer(kind) else ''}int{kind.bit_width}")
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


class RowBatch(list):
    """The rows of one batch, plus the seed its random choices derive from (None outside the engine) and where
    they came from (``role``, and ``indices``: their indices in the data the user gave, not positions in a split),
    so an error in collation can name them."""

    rng_seed: int | None = None
    role: str = "data"
    indices: list[int] | None = None
    """The user's rows: each row's index in the data given (a window's: the row it was cut from)."""
    positions: list[int] | None = None
    """The rows' positions in the source that read them (rows left out by ``on_error`` are not among them)."""
    sources: list[str] | None = None
    """A mixture's batch: the source of each row (its ``indices`` are rows of that source); None otherwise."""
    skipped: list[Any] | None = None
    """Rows left out because their read failed (``on_error='skip'`` or ``'warn'``): the engine's ``SkippedRow``
    records; None when all read."""
    reader_counts: dict[str, Any] | None = None
    """In a loader worker reading shards: its reader's counts since its previous batch, for the parent's source
    (``add_worker_counts``); a mixture's are ``{name: counts}`` of its sharded sources."""


class RaggedColumn(NamedTuple):
    """A column of variable-length rows stored flat: row ``i`` is ``values[offsets[i]:offsets[i + 1]]``.

    The layout of an Arrow ``ListArray`` (``offsets`` has one entry more than there are rows), in numpy arrays
    or 1-D tensors. Nothing is copied until the padded batch is written.

    Example:
        >>> RaggedColumn(np.array([5, 6, 7, 8]), np.array([0, 3, 4])).rows()
        [[5, 6, 7], [8]]
    """

    values: Any
    offsets: Any

    def rows(self) -> list[list[Any]]:
        """The rows as Python lists (what the row path would have received)."""
        values, offsets = np.asarray(self.values), np.asarray(self.offsets).tolist()
        return [values[start:end].tolist() for start, end in zip(offsets[:-1], offsets[1:])]


class SpanColumn(NamedTuple):
    """A column of variable-length rows that are spans of one larger buffer: row ``i`` is
    ``values[starts[i] : starts[i] + lengths[i]]``.

    What a batch fetched from a flat token buffer or an Arrow column is before anything is copied: the collator
    writes each row's kept tokens straight into the padded batch (one gather), so tokens cut by truncation are
    never read. ``values``, ``starts`` and ``lengths`` are 1-D numpy arrays.

    Example:
        >>> SpanColumn(np.array([5, 6, 7, 8, 9]), np.array([3, 0]), np.array([2, 1])).rows()
        [[8, 9], [5]]
    """

    values: Any
    starts: Any
    lengths: Any

    def rows(self) -> list[list[Any]]:
        """The rows as Python lists (what the row path would have received)."""
        return [self.values[start:start + length].tolist()
                for start, length in zip(self.starts.tolist(), self.lengths.tolist())]

    def ragged(self) -> RaggedColumn:
        """The rows copied into a new flat buffer + offsets (one fancy index, no per-row Python objects)."""
        index, offsets = span_index(self.starts, self.lengths)
        return RaggedColumn(self.values[index], offsets)


def _column_rows(value: Any) -> list[Any]:
    """A column's per-row values, as the row path gives them."""
    return value.rows() if isinstance(value, (RaggedColumn, SpanColumn)) else list(value)


class ColumnBatch:
    """One batch handed over as columns by the source stage.

    ``columns`` is ``{column: RaggedColumn | SpanColumn | list}`` in the data's column order, every column as long
    as the batch. ``rng_seed`` is the seed the batch's random choices derive from; ``role`` and ``indices`` say
    where the rows came from, so an error in collation can name them. Read as a sequence it is the row dicts (built
    from the columns on first use); it pickles as a plain list of those rows, leaving the buffers behind.

    Example:
        >>> batch = ColumnBatch({"input_ids": RaggedColumn(np.array([5, 6, 7]), np.array([0, 2, 3]))}, 2)
        >>> list(batch)
        [{'input_ids': [5, 6]}, {'input_ids': [7]}]
    """

    skipped: Any = None
    """Rows left out because their read failed (the engine's ``on_error``); None when all read."""

    def __init__(self, columns: Mapping[str, Any], size: int, *, rng_seed: int | None = None, role: str = "data",
                 indices: list[int] | None = None) -> None:
        self.columns = dict(columns)
        self.size = size
        self.rng_seed, self.role, self.indices = rng_seed, role, indices
        self._rows: list[dict[str, Any]] | None = None

    def to_columns(self) -> dict[str, Any]:
        """The columns (see ``TextCollator.collate_columns``)."""
        return self.columns

    def rows(self) -> list[dict[str, Any]]:
        """The row dicts, built from the columns once."""
        if self._rows is None:
            names = list(self.columns)
            values = [_column_rows(self.columns[name]) for name in names]
            self._rows = [dict(zip(names, row)) for row in zip(*values)] if names else [{}] * self.size
        return self._rows

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: Any) -> Any:
        return self.rows()[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.rows())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (list, tuple, ColumnBatch)) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # mutable-sequence semantics, like the list it stands for

    def __reduce__(self) -> Any:
        columns = {name: _column_rows(value) for name, value in self.columns.items()}
        return _restore, (columns, self.size, self.rng_seed, self.role, self.indices, self.skipped)

    def __repr__(self) -> str:
        return f"ColumnBatch(rows={self.size}, columns={list(self.columns)}, rng_seed={self.rng_seed})"


def _restore(columns: dict[str, list[Any]], size: int, rng_seed: int | None, role: str, indices: list[int] | None,
             skipped: Any) -> ColumnBatch:
    batch = ColumnBatch(columns, size, rng_seed=rng_seed, role=role, indices=indices)
    batch.skipped = skipped
    return batch
