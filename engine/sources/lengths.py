"""Row lengths read as cheaply as each source allows: what length-aware batching sorts and packs by."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.sources.adapt import HFSource, MapSource, TensorListSource, as_source
from engine.sources.mixed import MixedSource
from engine.sources.rows import empty_rows_error
from engine.sources.shards.source import ShardedSource


def lengths_of(source: Any, key: str | None = None) -> np.ndarray:
    """The length of every row's ``key`` field as a 1-D int64 array, read as cheaply as the source allows.

    Hugging Face data: ``pyarrow.compute.list_value_length`` on the column (offsets only, no token copy).
    :class:`TensorListSource`: from its shapes (dim 0). Other sources: ``len(row[key])`` row by row.

    Raises:
        KeyError: ``key`` is not a column / row key.
        TypeError: the field has no length (e.g. raw text, a scalar).
    """
    source = as_source(source)
    if isinstance(source, MixedSource):  # the sources of a mixture, one after another
        return np.concatenate([lengths_of(part, key) for part in source.sources])
    if isinstance(source, ShardedSource):
        return source.lengths(key)
    if isinstance(source, HFSource):
        return _hf_lengths(source.dataset, key)
    if isinstance(source, TensorListSource):
        if key is not None and source.key is not None and key != source.key:
            raise KeyError(f"the tensor list's rows hold the key {source.key!r}, but key={key!r} was asked for")
        lengths = source.shapes[:, 0].numpy() if source.shapes.shape[1] else np.ones(len(source.shapes), np.int64)
        return lengths.astype(np.int64)[source.positions] if source.positions is not None else lengths.copy()
    return _row_lengths(source, key)


def check_no_empty_rows(source: MapSource, key: str | None, role: str) -> None:
    """Refuse token rows of length 0 in ``source`` (a split), naming the first one by its index in the data the
    user gave: padded, such a row is all padding, and attention over a fully masked row gives NaN. Only sources
    whose lengths come without reading rows are checked (Arrow columns, tensor lists); others are not read here.
    Sharded data is checked batch by batch as its rows are read (:attr:`ShardedSource.token_key`), not by reading
    every shard's token column before the first batch."""
    if isinstance(source, ShardedSource):
        source.token_key = key
        return
    if not isinstance(source, (HFSource, TensorListSource)):
        return
    try:
        lengths = lengths_of(source, key)
    except (KeyError, TypeError):
        return
    empty = np.flatnonzero(lengths == 0)
    if not empty.size:
        return
    raise empty_rows_error([source.dataset_index(int(position)) for position in empty[:5]], int(empty.size), key, role)


def _hf_lengths(dataset: Any, key: str | None) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    if key is None or key not in dataset.column_names:
        raise KeyError(f"lengths need a list column of the dataset, but got key={key!r}; "
                       f"columns are {dataset.column_names}")
    column = dataset.data.table.column(key)  # the full table: a select() view maps through its indices below
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)
            or pa.types.is_fixed_size_list(column.type)):
        raise TypeError(f"column {key!r} is {column.type}, which has no per-row length; tokenize the text first "
                        f"(the module does this at setup) or name a list column such as 'input_ids'")
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64)
    indices = getattr(dataset, "_indices", None)  # datasets keeps select()/shuffle() as an index mapping
    if indices is not None:
        lengths = lengths[indices.column(0).to_numpy(zero_copy_only=False)]
    return lengths


def _row_lengths(source: MapSource, key: str | None, chunk: int = 1024) -> np.ndarray:
    if getattr(source, "transform", None) is not None:  # rows as stored: a transform augments, it sets no length
        source = source.for_role(source.role, None)
    # A row that fails to read (on_error='skip') measures 1: a sampler places it like a short row, and the batch
    # that reads it leaves it out and records it (a length of 0 would be refused as an empty row by packing).
    lengths = np.ones(len(source), dtype=np.int64)
    for start in range(0, len(source), chunk):
        positions = list(range(start, min(start + chunk, len(source))))
        rows = source.__getitems__(positions)
        for index, row in zip(getattr(rows, "positions", None) or positions, rows):  # the rows that were read
            if key is not None:
                if not hasattr(row, "keys") or key not in row:
                    found = sorted(row) if hasattr(row, "keys") else type(row).__name__
                    raise KeyError(f"row {index} has no {key!r} to measure (found {found}); pass the key of the "
                                   f"token field, or give lengths=... to the sampler directly")
                row = row[key]
            try:
                lengths[index] = len(row)
            except TypeError:
                raise TypeError(f"row {index}: {key or 'the row'!r} is a {type(row).__name__}, which has no "
                                f"length; length-aware batching needs sequences (token ids)") from None
    return lengths
