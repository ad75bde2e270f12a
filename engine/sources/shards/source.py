"""A sharded corpus as a map-style source: corpus row ``i`` lives in one row group of one shard.

The sources of the engine are map-style, and so is this one: the listing gives every row group's row count, so a
row's index maps to its row group with one search, and a batch is read from the few row groups its rows lie in
(:class:`~engine.sources.shards.reader.RowGroupReader`, through the local cache). Everything the engine keys by a
row's index then holds for shards as for data on disk: the samplers' seeded orders, exact and elastic resume,
the same batches at any number of workers, equal batches per rank, every batching mode. The training order keeps
reads local (:mod:`engine.sampling.blocks`): row groups in a seeded order, rows shuffled within a window.

``long_rows='split'`` makes a source of windows (:meth:`ShardedSource.windowed`): each window is a corpus row and
a span ``[start, end)`` of its per-token columns, three numpy arrays of a few bytes a window; the rows are read as
any others and cut as they are gathered, so no window is written anywhere.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

import numpy as np

from collators.columns import RaggedColumn, numpy_of
from engine.sources.protocol import EpochBlocks
from engine.sources.rows import ColumnarSource, empty_rows_error
from engine.sources.shards import tars
from engine.sources.shards.decode import save_array
from engine.sources.shards.listing import ShardListing, Shards, list_shards
from engine.sources.shards.object_stores import AZURE_SCHEMES
from engine.sources.shards.reader import RowGroupReader
from engine.sources.shards.text import TextTokens, text_lengths, tokenizer_hash


class Windows(NamedTuple):
    """Windows of corpus rows (``long_rows='split'``): window ``i`` is ``[starts[i], ends[i])`` of the columns
    ``per_token`` of corpus row ``rows[i]``; the other columns are the row's own."""

    rows: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    per_token: tuple[str, ...]


class ShardedSource(ColumnarSource):
    """The rows of a :class:`ShardListing`, read a row group at a time; ``positions`` views a split of them (of
    the windows, once :meth:`windowed`)."""

    token_key: str | None = None
    """The token column whose rows must not be empty (set at setup from the spec), checked as batches are read."""
    windows: Windows | None = None
    """The windows this source serves in place of the corpus rows (``long_rows='split'``); None: the rows."""
    text: TextTokens | None = None
    """Raw text that the collator tokenizes (set at setup when the shards hold text and no token column): the
    length-aware modes count its tokens (:mod:`engine.sources.shards.text`)."""

    def __init__(self, listing: ShardListing, positions: np.ndarray | None = None) -> None:
        self.listing = listing
        self.positions = positions
        self._readers: list[RowGroupReader] = []  # one per process, built on first use, shared with copies
        self._worker_counts: Counter[str] = Counter()  # what loader workers' readers did, shared with copies
        self._sent: tuple[int, Counter[str]] | None = None  # in a worker: (pid, counts already sent)

    @classmethod
    def from_shards(cls, shards: Shards) -> ShardedSource:
        return cls(list_shards(shards))

    def __len__(self) -> int:
        if self.positions is not None:
            return len(self.positions)
        return len(self.windows.rows) if self.windows is not None else self.listing.num_rows

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
        if self.positions is None and self.windows is None:
            return self.listing.fingerprint()
        import hashlib

        digest = hashlib.blake2b(self.listing.fingerprint().encode(), digest_size=12)
        for array in (self.positions, *(self.windows[:3] if self.windows is not None else ())):
            digest.update(array.tobytes() if array is not None else b"-")
        return digest.hexdigest()

    def _base(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """The indices of this source's ``positions`` among the corpus rows, or among the windows once windowed."""
        rows = np.asarray(positions, dtype=np.int64)
        size = len(self)
        if len(rows) and (rows.min() < 0 or rows.max() >= size):
            bad = rows[(rows < 0) | (rows >= size)][0]
            raise IndexError(f"row {int(bad)} is out of range for the {size} rows of the {self.role} data")
        return self.positions[rows] if self.positions is not None else rows

    def corpus_rows(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """The corpus indices of this source's ``positions`` (of the rows a window is cut from)."""
        base = self._base(positions)
        return self.windows.rows[base].astype(np.int64) if self.windows is not None else base

    def _spans(self, positions: Sequence[int]) -> tuple[list[int], list[int]]:
        """``(starts, ends)`` of the windows at ``positions`` (windowed sources only)."""
        base = self._base(positions)
        return self.windows.starts[base].tolist(), self.windows.ends[base].tolist()

    def windowed(self, rows: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                 per_token: Sequence[str]) -> ShardedSource:
        """A source of windows: this source's row at ``rows[i]`` cut to ``[starts[i], ends[i])`` in each of the
        ``per_token`` columns (:func:`engine.sources.long_rows.windows`). Errors name the row a window is from."""
        if self.text is not None:
            raise ValueError(f"long_rows='split' cuts token ids into windows, but the shards hold raw text in "
                             f"{self.text.text_field!r} (tokenized by the collator, batch by batch); tokenize the "
                             f"shards first (engine.tokenize_on_ray) into a token column, or use long_rows='truncate' "
                             f"or 'drop'")
        corpus = self.corpus_rows(rows)
        if self.windows is not None:  # windows of windows: spans within the spans
            first = np.asarray(self._spans(rows)[0], dtype=np.int64)
            starts, ends = first + starts, first + ends
        small = np.int32 if self.listing.num_rows < 2**31 else np.int64
        offsets = np.int32 if len(ends) == 0 or int(np.max(ends)) < 2**31 else np.int64
        source = self._sibling(None)
        source.token_key = self.token_key
        source.windows = Windows(corpus.astype(small), np.asarray(starts).astype(offsets),
                                 np.asarray(ends).astype(offsets), tuple(per_token))
        source.origins = source.windows.rows  # the user's row of each window: the corpus row it is cut from
        return source

    def group_of(self, rows: np.ndarray) -> np.ndarray:
        """The row group of each of the corpus ``rows`` (one binary search of the groups' first rows)."""
        return np.searchsorted(self.listing.group_start, rows, side="right") - 1

    def row_groups(self) -> np.ndarray:
        """The row group of each of this source's rows (what the training order keeps together)."""
        return self.group_of(self.corpus_rows(np.arange(len(self)))).astype(np.int32)

    def epoch_blocks(self) -> EpochBlocks:
        """The row groups, ordered by the seed and the epoch, with rows shuffled within ``shuffle_window``: a
        batch's reads stay within a few row groups."""
        return EpochBlocks(self.row_groups(), self.listing.shards.shuffle_window)

    reads_ahead = True
    lengths_from = "the shards' list offsets, read column by column"

    @property
    def fork_safe(self) -> bool:  # type: ignore[override]
        """False in Azure Blob Storage: its client (pyarrow's, through the Azure SDK's libcurl transport) keeps its
        connections in one pool per process, so workers forked after this process read the listing would send
        their requests on the same sockets and read each other's responses (corrupt row groups)."""
        return not any(str(url).lower().startswith(AZURE_SCHEMES) for url in self.listing.shards.url_list)

    @property
    def shuffle_window(self) -> int:
        """``Shards(shuffle_window=...)``: a saved state's identity holds it (another window, another order)."""
        return self.listing.shards.shuffle_window

    def counters(self) -> tuple[Hashable, dict[str, Any]]:
        """``(key, {shards, row_groups, rows, process, workers})``: the listing and :meth:`reader_counts`; the
        splits of one corpus share one reader, and so one key."""
        listing = self.listing
        return id(self._readers), {"shards": len(listing.files), "row_groups": listing.num_groups,
                                   "rows": listing.num_rows, **self.reader_counts()}

    def reader_counts(self) -> dict[str, dict[str, int]]:
        """What the shard reader did: ``{"process": ..., "workers": ...}``, each ``{fetched, cache_hits, retries,
        bytes_fetched, evicted, read_ahead}``. ``process``: this process's reader (a loader without workers, or with
        threads, reads here); ``workers``: the loader worker processes' readers, sent back with each batch (counts
        as of each worker's last batch: a read ahead still running when its worker stopped is not among them)."""
        keys = ("fetched", "cache_hits", "retries", "bytes_fetched", "evicted", "read_ahead")
        own = self.reader.stats
        return {"process": {key: int(own[key]) for key in keys},
                "workers": {key: int(self._worker_counts[key]) for key in keys}}

    def add_worker_counts(self, counts: dict[str, int]) -> None:
        """Add a loader worker's reader counts (the parent's loader iterator calls this as its batches arrive)."""
        self._worker_counts.update(counts)

    def _unsent(self) -> Counter[str] | None:
        """In a loader worker: the reader's counts already sent to the parent (at first, those a forked worker
        inherited, which are the parent's own); None in the parent."""
        from torch.utils.data import get_worker_info

        if get_worker_info() is None:
            return None
        if self._sent is None or self._sent[0] != os.getpid():
            self._sent = (os.getpid(), Counter(self.reader.stats))
        return self._sent[1]

    def _since_sent(self, sent: Counter[str]) -> dict[str, int]:
        """The reader's counts since ``sent`` (from :meth:`_unsent`, taken before the batch's reads began), which
        then holds them as sent: a worker's counts since its previous batch, each count sent once."""
        now = dict(self.reader.stats)  # a copy first: read-ahead threads add to the counts meanwhile
        new = {key: value - sent[key] for key, value in now.items() if value != sent[key]}
        sent.update(new)
        return new

    def __getitems__(self, indices: Sequence[int]) -> Any:
        sent = self._unsent()
        batch = self._read(indices)
        if sent is not None and (new := self._since_sent(sent)):
            batch.reader_counts = new
        return batch

    def _read(self, indices: Sequence[int]) -> Any:
        """The rows at ``indices``, their reads not sent to the parent (:meth:`__getitems__` and a mixture's
        ``__getitems__`` send them)."""
        # The batch's row groups first: a shard that fails to read (after its retries), changed or went is raised
        # as it is, naming the shard, rather than searched for row by row (each row would retry the fetch again).
        self.reader.open_together(self._groups(self.corpus_rows(list(indices))))
        ahead = getattr(indices, "ahead", None)
        if ahead:  # a later batch's row groups, fetched in the background while this batch is collated and used
            self.read_ahead(ahead)
        return super().__getitems__(indices)

    def read_ahead(self, positions: Sequence[int]) -> None:
        """Start fetching, in the background, the row groups of this source's ``positions`` (a coming batch)."""
        self.reader.read_ahead(self._groups(self.corpus_rows(positions)))

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
            pieces.append(self.reader.table(group).take(arrow_indices(local)))
        if not pieces:
            return self.listing.schema.empty_table()
        table = pa.concat_tables(pieces)
        return table.take(arrow_indices(np.argsort(order, kind="stable")))

    def _fetch(self, positions: list[int]) -> list[dict[str, Any]]:
        if self.listing.damaged:  # tar samples with a member cut short: refused, named (or left out, on_error)
            for row in self.corpus_rows(positions).tolist():
                if row in self.listing.damaged:
                    raise OSError(self.listing.damaged[row])
        rows = self._table(positions).to_pylist()
        if self.windows is not None:
            for name in self.windows.per_token:
                for row, cut in zip(rows, self._cut([row[name] for row in rows], positions)):
                    row[name] = cut
        if self.token_key is not None and self.token_key in self.listing.schema.names:  # raw text: no token column
            self._check_tokens(positions, [len(row.get(self.token_key) or ()) for row in rows])
        return rows

    def row_places(self, positions: Sequence[int]) -> list[str]:
        """Each row's shard and, in a tar, its sample's key (else its row within the shard): what a record of a row
        left out names."""
        rows = self.corpus_rows(positions)
        groups = self.group_of(rows)
        places = []
        for row, group in zip(rows.tolist(), groups.tolist()):
            shard, index = int(self.listing.group_shard[group]), int(self.listing.group_index[group])
            local = row - int(self.listing.group_start[group])
            tar = self.listing.tar_indexes.get(shard)
            where = (f"key {tar.keys[index * tars.TAR_GROUP_ROWS + local]!r}" if tar is not None
                     else f"row {local} of row group {index}")
            places.append(f"shard {self.listing.url(shard)!r} {where}")
        return places

    def _cut(self, values: list[Any], positions: Sequence[int]) -> list[Any]:
        """Each of ``values`` (a per-token column's lists) cut to its window."""
        return [value[start:end] for value, start, end in zip(values, *self._spans(positions))]

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
        local = rows - self.listing.group_start[groups]
        present, where = np.unique(groups, return_inverse=True)
        cut = self.windows.per_token if self.windows is not None else ()
        spans = self._spans(positions) if cut else None
        columns: dict[str, Any] = {}
        for name in self.column_names:
            views = [self.reader.ragged(int(group), name) for group in present]
            if any(view is None for view in views):  # not a list of integers without nulls
                continue
            starts, ends = np.empty(len(rows), dtype=np.int64), np.empty(len(rows), dtype=np.int64)
            for number, view in enumerate(views):
                mask = where == number
                starts[mask], ends[mask] = view.spans(local[mask])
            if name in cut:
                ends = starts + np.asarray(spans[1], dtype=np.int64)
                starts = starts + np.asarray(spans[0], dtype=np.int64)
            pieces = [views[number].values[start:end]
                      for number, start, end in zip(where.tolist(), starts.tolist(), ends.tolist())]
            lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
            offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            values = np.concatenate(pieces) if pieces else np.empty(0, np.int64)
            columns[name] = RaggedColumn(values, offsets)
            if name == self.token_key:
                self._check_tokens(positions, lengths)
        for name in self.column_names:
            if name not in columns and name not in cut and (plain := self._integers(name, present, where, local)):
                columns[name] = plain
        others = [name for name in self.column_names if name not in columns]
        if others:
            table = self._table(positions).select(others)
            columns.update({name: table.column(name).to_pylist() for name in others})
            columns.update({name: self._cut(columns[name], positions) for name in others if name in cut})
        return {name: columns[name] for name in self.column_names}

    def _integers(self, name: str, present: np.ndarray, where: np.ndarray, local: np.ndarray) -> list[int] | None:
        """An integer column without nulls at the rows (``local`` in the row groups ``present[where]``), as the
        Python ints ``to_pylist`` gives, read from numpy views of the row groups; None for any other column. The
        Table path (``take``) would import ``pyarrow.compute``, most of a second in a fresh loader worker."""
        import pyarrow as pa

        values = np.empty(len(local), dtype=np.int64)
        for number, group in enumerate(present.tolist()):
            column = self.reader.table(group).column(name)
            if not pa.types.is_integer(column.type) or column.type == pa.uint64() or column.null_count:
                return None  # uint64 past int64 stays on the Table path
            mask = where == number
            whole = np.concatenate([numpy_of(chunk) for chunk in column.chunks]) if column.num_chunks != 1 else (
                numpy_of(column.chunk(0)))
            values[mask] = whole[local[mask]]
        return values.tolist()

    def lengths(self, key: str | None) -> np.ndarray:
        """The length of every row's ``key`` list (int64), read column-only per row group and kept in the cache
        folder, so a resumed run reads none again; a window's length in a per-token column is its span's."""
        if self.windows is not None and key in self.windows.per_token:
            base = self._base(np.arange(len(self)))
            return (self.windows.ends[base] - self.windows.starts[base]).astype(np.int64)
        import pyarrow as pa

        names = self.column_names
        if self.text is not None and key not in names:  # raw text: its token counts, counted once
            saved = self.reader.folder / (f"lengths-{self.listing.fingerprint()}-{self.text.text_field}-tokens-"
                                          f"{tokenizer_hash(self.text.tokenizer)}.npy")
            lengths = text_lengths(self.reader, self.text, saved)
            return lengths if self.positions is None else lengths[self.positions]
        if key is None or key not in names:
            raise KeyError(f"lengths need a list column of the shards, but got key={key!r}; columns are {names}")
        kind = self.listing.schema.field(key).type
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
            raise TypeError(f"column {key!r} is {kind}, which has no per-row length; tokenize the corpus first "
                            f"(engine.sources.tokenizing.ray_tokenize) or name a list column such as 'input_ids'")
        saved = self.reader.folder / f"lengths-{self.listing.fingerprint()}-{key}.npy"
        if saved.exists():
            lengths = np.load(saved)
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=8) as pool:  # ranged reads of one column, in parallel
                lengths = np.concatenate(list(pool.map(lambda group: self.reader.lengths(group, key),
                                                       range(self.listing.num_groups))))
            lengths = lengths.astype(np.int32 if len(lengths) and lengths.max() < 2**31 else np.int64)
            save_array(saved, lengths)
        if self.positions is None and self.windows is None:
            return lengths.astype(np.int64)
        return lengths[self.corpus_rows(np.arange(len(self)))].astype(np.int64)

    def for_role(self, role: str, transform: Any) -> ShardedSource:
        """A copy serving split ``role`` with ``transform`` that keeps this source's reader and counts (``copy.copy``
        would go through ``__getstate__`` and leave them behind): every split of one corpus, and the reads of setup,
        count in one reader per process."""
        source = object.__new__(ShardedSource)
        source.__dict__.update(self.__dict__, role=role, transform=transform)
        return source

    def view(self, positions: np.ndarray) -> ShardedSource:
        base = self.positions[positions] if self.positions is not None else np.asarray(positions, dtype=np.int64)
        source = self._sibling(base)
        source.windows, source.origins = self.windows, self.origins
        return source

    def _sibling(self, positions: np.ndarray | None) -> ShardedSource:
        """A source over the same listing that shares this one's reader and worker counts."""
        source = ShardedSource(self.listing, positions)
        source._readers, source._worker_counts = self._readers, self._worker_counts
        source.hands_columns, source.text = self.hands_columns, self.text
        return source

    def __getstate__(self) -> dict[str, Any]:  # the reader's open tables are memory maps of this process
        return {**self.__dict__, "_readers": [], "_worker_counts": Counter(), "_sent": None}


def arrow_indices(positions: np.ndarray) -> Any:
    """``pyarrow.array(positions)`` (int64) built from the numpy buffer itself: ``pyarrow.array`` imports pandas
    (to recognize its objects) at its first call, over a second that a fresh loader worker would add to its first
    batch."""
    import pyarrow as pa

    values = np.ascontiguousarray(positions, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])
