"""The two shapes a text batch arrives in, behind one interface: a list of row dicts, or columns.

:class:`RowInputs` reads row dicts (the ``__call__`` contract). :class:`ColumnInputs` reads whole columns:
token columns as flat values + offsets (a :class:`RaggedColumn` or a pyarrow list array), so a batch fetched
from Arrow is padded without one Python object per token or per row. Both answer the same questions (keys,
per-row values, flat token ids with row lengths) with the same results and the same errors, so the collator's
logic is written once. A column that is not plain integers (nulls, floats, nesting) is read as per-row Python
values and goes through the row-path checks, which raise the row path's errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from collators._kernels import first_span_outside
from collators._text_inputs import as_mapping_rows, column, flatten_ids
from collators.columns import RaggedColumn, SpanColumn, numpy_of


class RowInputs:
    """A batch given as row dicts (or bare id sequences, read as ``{'input_ids': row}``)."""

    origin: Any = None
    """The batch as the collator got it, whose ``role`` and ``indices`` name its rows in errors (None: unknown)."""

    def __init__(self, rows: Any, target_keys: tuple[str, ...] = ()) -> None:
        self.rows = as_mapping_rows(rows, target_keys)
        self.keys = list(self.rows[0])

    def __len__(self) -> int:
        return len(self.rows)

    def values(self, key: str) -> list[Any]:
        """The value of ``key`` in every row."""
        return column(self.rows, key)

    def none_rows(self, key: str) -> list[int]:
        """Indices of the rows whose ``key`` is None."""
        return [index for index, row in enumerate(self.rows) if row[key] is None]

    def ids(self, key: str, *, allow_bool: bool = False) -> tuple[Any, torch.Tensor]:
        """Every row's ids under ``key`` concatenated (a new array), and each row's length (int64 tensor)."""
        return flatten_ids(self.values(key), key, allow_bool=allow_bool)

    def spans(self, key: str, *, allow_bool: bool = False) -> None:
        """Row dicts hold no spans of a shared buffer: always None (see :meth:`ColumnInputs.spans`)."""
        return None


def _is_arrow(value: Any) -> bool:
    return type(value).__module__.startswith("pyarrow")


def _column_length(key: str, value: Any) -> int:
    if isinstance(value, RaggedColumn):
        return len(value.offsets) - 1
    if isinstance(value, SpanColumn):
        return len(value.starts)
    if isinstance(value, (list, tuple, np.ndarray, torch.Tensor)) or _is_arrow(value):
        return len(value)
    raise TypeError(
        f"column {key!r} should be a list of per-row values, a numpy array or tensor (first dimension = rows), a "
        f"pyarrow Array or ChunkedArray, a RaggedColumn(values, offsets) or a SpanColumn(values, starts, lengths), "
        f"but got {type(value).__name__}"
    )


def _arrow_ragged(array: Any) -> RaggedColumn | None:
    """Offsets and values of a pyarrow list array of plain integers or bools, or None when it is anything else."""
    import pyarrow as pa

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)) or array.null_count:
        return None
    values = array.values
    if values.null_count or not (pa.types.is_integer(values.type) or pa.types.is_boolean(values.type)):
        return None
    return RaggedColumn(numpy_of(values), numpy_of(array.offsets))


class ColumnInputs:
    """A batch given as ``{key: column}``; see :meth:`collators.text.TextCollator.collate_columns`."""

    origin: Any = None
    """The batch as the collator got it, whose ``role`` and ``indices`` name its rows in errors (None: unknown)."""

    def __init__(self, columns: Mapping[str, Any]) -> None:
        if not isinstance(columns, Mapping):
            raise TypeError(f"columns should be a mapping of column name to column, but got {type(columns).__name__}")
        self.columns = dict(columns)
        self.keys = list(self.columns)
        lengths = {key: _column_length(key, value) for key, value in self.columns.items()}
        self.size = next(iter(lengths.values()), 0)
        if self.size == 0:
            raise ValueError("rows should hold at least one row, but got an empty list (an empty batch)")
        for key, length in lengths.items():
            if length != self.size:
                raise ValueError(
                    f"column {key!r} has {length} rows but column {self.keys[0]!r} has {self.size}; every column "
                    f"of a batch should hold one entry per row"
                )
        self._ragged: dict[str, RaggedColumn | None] = {}
        self._spans: dict[str, SpanColumn] = {}

    def __len__(self) -> int:
        return self.size

    def _as_ragged(self, key: str) -> RaggedColumn | None:
        if key not in self._ragged:
            value = self.columns[key]
            if isinstance(value, SpanColumn):
                spans = self.spans(key)
                value = spans.ragged() if spans is not None else value
            if isinstance(value, RaggedColumn):
                ragged = RaggedColumn(np.asarray(value.values), np.asarray(value.offsets))
                if ragged.values.ndim != 1 or ragged.offsets.ndim != 1 or ragged.offsets.dtype.kind not in "iu":
                    raise TypeError(f"column {key!r}: a RaggedColumn needs 1-D values and 1-D integer offsets")
            else:
                ragged = _arrow_ragged(value) if _is_arrow(value) else None
            self._ragged[key] = ragged
        return self._ragged[key]

    def values(self, key: str) -> list[Any]:
        """Row ``i``'s value of ``key`` as a Python value (lists for token columns), as a row dict would hold it."""
        value = self.columns[key]
        if isinstance(value, (RaggedColumn, SpanColumn)):
            return value.rows()
        if _is_arrow(value):
            return value.to_pylist()
        if isinstance(value, (np.ndarray, torch.Tensor)):
            return value.tolist()
        return list(value)

    def none_rows(self, key: str) -> list[int]:
        """Indices of the rows whose ``key`` is None (null in Arrow); one vectorized test for Arrow columns."""
        value = self.columns[key]
        if isinstance(value, (RaggedColumn, SpanColumn, np.ndarray, torch.Tensor)):
            return []
        if _is_arrow(value):
            return np.flatnonzero(value.is_null().to_numpy(zero_copy_only=False)).tolist() if value.null_count else []
        return [index for index, item in enumerate(value) if item is None]

    def ids(self, key: str, *, allow_bool: bool = False) -> tuple[Any, torch.Tensor]:
        """Flat ids of ``key`` and each row's length, read straight from the offsets when the column allows it."""
        ragged = self._as_ragged(key)
        kinds = "iub" if allow_bool else "iu"
        if ragged is None or ragged.values.dtype.kind not in kinds:
            return flatten_ids(self.values(key), key, allow_bool=allow_bool)  # the row path's checks and errors
        offsets = ragged.offsets.astype(np.int64, copy=False)
        lengths = np.diff(offsets)
        if len(lengths) and lengths.min() < 0:
            raise ValueError(f"column {key!r}: RaggedColumn offsets should not decrease, but got {offsets.tolist()}")
        flat = ragged.values[offsets[0]:offsets[-1]]
        if flat.dtype.kind == "u" and flat.dtype.itemsize == 8:
            flat = flat.astype(np.int64)  # as np.array(list) + astype(int64) does on the row path
        return flat, torch.from_numpy(lengths)

    def spans(self, key: str, *, allow_bool: bool = False) -> SpanColumn | None:
        """``key`` as spans of integer values (bools with ``allow_bool``) without copying them, or None when the
        column is absent or given in another form (the caller then takes :meth:`ids`)."""
        value = self.columns.get(key)
        if not isinstance(value, SpanColumn):
            return None
        spans = self._spans.get(key)
        if spans is None:  # checked once per batch, however many times the collator asks
            spans = SpanColumn(np.asarray(value.values), np.asarray(value.starts, dtype=np.int64),
                               np.asarray(value.lengths, dtype=np.int64))
            if spans.values.ndim != 1 or spans.starts.ndim != 1 or spans.lengths.shape != spans.starts.shape:
                raise TypeError(f"column {key!r}: a SpanColumn needs 1-D values, starts and lengths of one size")
            if first_span_outside(len(spans.values), spans.starts, spans.lengths) >= 0:
                raise ValueError(f"column {key!r}: SpanColumn spans should lie inside values (length "
                                 f"{len(spans.values)}), but got starts={spans.starts.tolist()}, "
                                 f"lengths={spans.lengths.tolist()}")
            self._spans[key] = spans
        return spans if spans.values.dtype.kind in ("iub" if allow_bool else "iu") else None


def batch_inputs(rows: Any, target_keys: tuple[str, ...] = ()) -> RowInputs | ColumnInputs:
    """Columns when ``rows`` is a :class:`collators.columns.ColumnBatch` (fetched as columns by the source stage)
    or otherwise hands them over (``rows.to_columns()``), else rows.

    ``target_keys`` are the keys a batch may lack as a whole (prediction), named when only some rows lack them.
    ``rows`` is kept as the inputs' ``origin``, which names the rows in errors.
    """
    inputs: RowInputs | ColumnInputs | None = None
    to_columns = getattr(rows, "to_columns", None)
    if callable(to_columns) and not isinstance(rows, (Mapping, str, bytes)):
        columns = to_columns()
        if columns is not None:
            inputs = ColumnInputs(columns)
    inputs = inputs or RowInputs(rows, target_keys)
    inputs.origin = rows
    return inputs
