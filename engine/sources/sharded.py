"""A sharded corpus as a map-style source: corpus row ``i`` lives in one row group of one shard.

The sources of the engine are map-style, and so is this one: the listing gives every row group's row count, so a
row's index maps to its row group with one search, and a batch is read from the few row groups its rows lie in
(:class:`~engine.sources.shard_reader.RowGroupReader`, through the local cache). Everything the engine keys by a
row's index then holds for shards as for data on disk: the samplers' seeded orders, exact and elastic resume,
the same batches at any number of workers, equal batches per rank, every batching mode. The training order keeps
reads local (:mod:`engine.sampling.blocks`): row groups in a seeded order, rows shuffled within a window.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from collators.columns import RaggedColumn
from engine.sources.rows import ColumnarSource, empty_rows_error
from engine.sources.shard_listing import ShardListing, Shards, list_shards
from engine.sources.shard_reader import RowGroupReader


class ShardedSource(ColumnarSource):
    """The rows of a :class:`ShardListing`, read a row group at a time; ``positions`` views a split of them."""

    token_key: str | None = None
    """The token column whose rows must not be empty (set at setup from the spec), checked as batches are read."""

    def __init__(self, listing: ShardListing, positions: np.ndarray | None = None) -> None:
        self.listing = listing
        self.positions = positions
        self._readers: list[RowGroupReader] = []  # one per process, built on first use, shared with copies

    @classmethod
    def from_shards(cls, shards: Shards) -> ShardedSource:
        return cls(list_shards(shards))

    def __len__(self) -> int:
        return len(self.positions) if self.positions is not None else self.listing.num_rows

    @property
    def reader(self) -> RowGroupReader:
        if not self._readers:
            self._readers.append(RowGroupReader(self.listing))
        return self._readers[0]

    @property
    def column_names(self) -> list[str]:
        return list(self.listing.schema.names)

    def holds_text(self, column: str) -> bool:
        """Whether ``column`` holds strings, or lists of them, by the shards' schema (no row is read)."""
        import pyarrow as pa

        kind = self.listing.schema.field(column).type
        while pa.types.is_list(kind) or pa.types.is_large_list(kind):
            kind = kind.value_type
        return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)

    def fingerprint(self) -> str:
        """The corpus's fingerprint (files, versions, row groups) and the split's rows: what a saved state names."""
        if self.positions is None:
            return self.listing.fingerprint()
        import hashlib

        return hashlib.blake2b(self.listing.fingerprint().encode() + self.positions.tobytes(),
                               digest_size=12).hexdigest()

    def corpus_rows(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """The corpus indices of this source's ``positions``."""
        rows = np.asarray(positions, dtype=np.int64)
        size = len(self)
        if len(rows) and (rows.min() < 0 or rows.max() >= size):
            bad = rows[(rows < 0) | (rows >= size)][0]
            raise IndexError(f"row {int(bad)} is out of range for the {size} rows of the {self.role} data")
        return self.positions[rows] if self.positions is not None else rows

    def group_of(self, rows: np.ndarray) -> np.ndarray:
        """The row group of each of the corpus ``rows`` (one binary search of the groups' first rows)."""
        return np.searchsorted(self.listing.group_start, rows, side="right") - 1

    def row_groups(self) -> np.ndarray:
        """The row group of each of this source's rows (what the training order keeps together)."""
        rows = self.positions if self.positions is not None else np.arange(self.listing.num_rows)
        return self.group_of(rows).astype(np.int32)

    def __getitems__(self, indices: Sequence[int]) -> Any:
        # The batch's row groups first: a shard that fails to read (after its retries), changed or went is raised
        # as it is, naming the shard, rather than searched for row by row (each row would retry the fetch again).
        for group in self._groups(self.corpus_rows(list(indices))):
            self.reader.table(group)
        ahead = getattr(indices, "ahead", None)
        if ahead:  # a later batch's row groups, fetched in the background while this batch is collated and used
            self.reader.read_ahead(self._groups(self.corpus_rows(ahead)))
        return super().__getitems__(indices)

    def _groups(self, rows: np.ndarray) -> list[int]:
        return np.unique(self.group_of(rows)).tolist()

    def _table(self, positions: Sequence[int]) -> Any:
        """The rows at ``positions`` as one ``pyarrow.Table``, in the order asked, read group by group."""
        import pyarrow as pa

        rows = self.corpus_rows(positions)
        groups = self.group_of(rows)
        order = np.argsort(groups, kind="stable")
        pieces, sorted_groups = [], groups[order]
        bounds = np.flatnonzero(np.diff(sorted_groups)) + 1
        for chunk in np.split(order, bounds) if len(order) else []:
            group = int(groups[chunk[0]])
            local = rows[chunk] - self.listing.group_start[group]
            pieces.append(self.reader.table(group).take(pa.array(local)))
        if not pieces:
            return self.listing.schema.empty_table()
        table = pa.concat_tables(pieces)
        return table.take(pa.array(np.argsort(order, kind="stable")))

    def _fetch(self, positions: list[int]) -> list[dict[str, Any]]:
        rows = self._table(positions).to_pylist()
        if self.token_key is not None:
            self._check_tokens(positions, [len(row.get(self.token_key) or ()) for row in rows])
        return rows

    def _check_tokens(self, positions: Sequence[int], lengths: Any) -> None:
        empty = np.flatnonzero(np.asarray(lengths) == 0)
        if empty.size:
            rows = [self.user_index(int(positions[i])) for i in empty[:5]]
            raise empty_rows_error(rows, int(empty.size), self.token_key, self.role)

    def columnar(self) -> bool:
        import pyarrow as pa

        return any(pa.types.is_list(field.type) or pa.types.is_large_list(field.type) for field in self.listing.schema)

    def fetch_columns(self, positions: Sequence[int]) -> dict[str, Any]:
        """``{column: RaggedColumn | list}`` of the rows at ``positions``: token columns gathered from numpy views of
        the memory-mapped row groups (one slice a row), others as Python values (as the row path gives them)."""
        rows = self.corpus_rows(positions)
        groups = self.group_of(rows)
        local = (rows - self.listing.group_start[groups]).tolist()
        groups = groups.tolist()
        columns: dict[str, Any] = {}
        for name in self.column_names:
            views = {group: self.reader.ragged(group, name) for group in dict.fromkeys(groups)}
            if any(view is None for view in views.values()):  # not a list of integers without nulls
                continue
            pieces = [views[group][1][views[group][0][row]:views[group][0][row + 1]]
                      for group, row in zip(groups, local)]
            lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
            offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            values = np.concatenate(pieces) if pieces else np.empty(0, np.int64)
            columns[name] = RaggedColumn(values, offsets)
            if name == self.token_key:
                self._check_tokens(positions, lengths)
        others = [name for name in self.column_names if name not in columns]
        if others:
            table = self._table(positions).select(others)
            columns.update({name: table.column(name).to_pylist() for name in others})
        return {name: columns[name] for name in self.column_names}

    def lengths(self, key: str | None) -> np.ndarray:
        """The length of every row's ``key`` list (int64), read column-only per row group and kept in the cache
        folder, so a resumed run reads none again."""
        import pyarrow as pa

        names = self.column_names
        if key is None or key not in names:
            raise KeyError(f"lengths need a list column of the shards, but got key={key!r}; columns are {names}")
        kind = self.listing.schema.field(key).type
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
            raise TypeError(f"column {key!r} is {kind}, which has no per-row length; tokenize the corpus first "
                            f"(engine.sources.ray_tokenize) or name a list column such as 'input_ids'")
        saved = self.reader.folder / f"lengths-{self.listing.fingerprint()}-{key}.npy"
        if saved.exists():
            lengths = np.load(saved)
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=8) as pool:  # ranged reads of one column, in parallel
                lengths = np.concatenate(list(pool.map(lambda group: self.reader.lengths(group, key),
                                                       range(self.listing.num_groups))))
            lengths = lengths.astype(np.int32 if len(lengths) and lengths.max() < 2**31 else np.int64)
            _save(saved, lengths)
        return (lengths[self.positions] if self.positions is not None else lengths).astype(np.int64)

    def view(self, positions: np.ndarray) -> ShardedSource:
        base = self.positions[positions] if self.positions is not None else np.asarray(positions, dtype=np.int64)
        source = ShardedSource(self.listing, base)
        source._readers = self._readers
        source.hands_columns = self.hands_columns
        source.origins = self.origins
        return source

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_readers": []}  # the reader's open tables are memory maps of this process


def _save(path: Path, array: np.ndarray) -> None:
    import uuid

    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.stem}.{uuid.uuid4().hex}.npy")
    np.save(scratch, array)
    scratch.replace(path)
