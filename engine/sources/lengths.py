"""Row lengths read as cheaply as each source allows: what length-aware batching sorts and packs by."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.sources.adapt import as_source
from engine.sources.rows import MapSource, empty_rows_error
from engine.sources.shards.source import ShardedSource


def lengths_of(source: Any, key: str | None = None, measure: Callable[[Any], int] | None = None) -> np.ndarray:
    """The length of every row's ``key`` field as a 1-D int64 array, read as cheaply as the source allows: the
    source's own :meth:`~engine.sources.protocol.Source.lengths` (Arrow offsets, tensor shapes, a shard's list
    offsets, a user's declared lengths), else each part of a mixture on its own, else ``len(row[key])`` row by row.
    ``measure`` (a collator's ``row_length``: a vision-language row counts its image tokens) measures each row
    instead, row by row.

    Raises:
        KeyError: ``key`` is not a column / row key.
        TypeError: the field has no length (e.g. raw text, a scalar).
    """
    source = as_source(source)
    parts = [part for _, part in source.parts()]
    if parts != [source]:  # a mixture: its sources one after another, each measured once, as it allows
        return np.concatenate([lengths_of(part, key, measure) for part in parts])
    lengths = source.lengths(key) if measure is None else None
    return lengths if lengths is not None else _row_lengths(source, key, measure=measure)


def check_no_empty_rows(source: MapSource, key: str | None, role: str) -> None:
    """Refuse token rows of length 0 in ``source`` (a split), naming the first one by its index in the data the
    user gave: padded, such a row is all padding, and attention over a fully masked row gives NaN. Only sources
    whose lengths come without reading rows are checked (Arrow columns, tensor lists, declared lengths); others are
    not read here. Sharded data is checked batch by batch as its rows are read (:attr:`ShardedSource.token_key`),
    not by reading every shard's token column before the first batch."""
    if isinstance(source, ShardedSource):
        source.token_key = key
        return
    try:
        lengths = source.lengths(key)
    except (KeyError, TypeError):
        return
    if lengths is None:
        return
    empty = np.flatnonzero(lengths == 0)
    if not empty.size:
        return
    raise empty_rows_error([source.dataset_index(int(position)) for position in empty[:5]], int(empty.size), key, role)


def _row_lengths(source: MapSource, key: str | None, chunk: int = 1024,
                 measure: Callable[[Any], int] | None = None) -> np.ndarray:
    if getattr(source, "transform", None) is not None:  # rows as stored: a transform augments, it sets no length
        source = source.for_role(source.role, None)
    # A row that fails to read (on_error='skip') measures 1: a sampler places it like a short row, and the batch
    # that reads it leaves it out and records it (a length of 0 would be refused as an empty row by packing).
    lengths = np.ones(len(source), dtype=np.int64)
    for start in range(0, len(source), chunk):
        positions = list(range(start, min(start + chunk, len(source))))
        rows = source.__getitems__(positions)
        for index, row in zip(getattr(rows, "positions", None) or positions, rows):  # the rows that were read
            if measure is not None:
                lengths[index] = measure(row)
                continue
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
