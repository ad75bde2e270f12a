"""Named sources of one task laid end to end, read as one source: what a mixture's sampler draws rows from.

Row ``offsets[s] + i`` of the mixed source is row ``i`` of source ``s``. A batch's rows are read from each source
in one batched read per source (its own errors, ``on_error`` and transforms), then put back in the batch's order.
When every source reads columns and the collator takes them, the batch is handed over as columns: each source's
token rows are gathered once and laid in the batch's order as spans of one buffer, which the collator pads
straight from. Evaluation splits of the sources are mixed sources too, read once in storage order.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from collators.columns import ColumnBatch, RaggedColumn, RowBatch, SpanColumn
from engine.core.rng import derive_seed
from engine.core.stage_times import stamp
from engine.sources.rows import ColumnarSource, MapSource
from engine.sources.shards.source import ShardedSource
from engine.sources.transforms import RowTransform


class MixedSource(ColumnarSource):
    """The sources ``{name: source}`` as one, in the order of their names as given."""

    def __init__(self, sources: Mapping[str, MapSource]) -> None:
        self.names = tuple(sources)
        self.sources = tuple(sources.values())
        self.offsets = np.r_[0, np.cumsum([len(source) for source in self.sources])].astype(np.int64)
        self._names = np.array(self.names, dtype=object)
        """The names as an array: a batch's ``sources`` in one gather."""
        self._sharded = self._counted()
        self._numbers = np.arange(len(self.sources) + 1)
        self._tables: list[_SpanTables | None] = []
        """The sources' spans, built on the first batch read as columns (shared with this source's copies)."""

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def on_error(self) -> str:  # type: ignore[override]
        return self.sources[0].on_error if self.sources else "raise"

    @on_error.setter
    def on_error(self, value: str) -> None:
        """What a failing row does, set on every source (each reads, names and leaves out its own rows)."""
        for source in self.sources:
            source.on_error = value

    @property
    def reads_ahead(self) -> bool:  # type: ignore[override]
        """Whether any source reads the rows of coming batches ahead (sources streamed from shards)."""
        return any(source.reads_ahead for source in self.sources)

    @property
    def fork_safe(self) -> bool:  # type: ignore[override]
        """Whether every source can be read by forked loader workers."""
        return all(source.fork_safe for source in self.sources)

    def parts(self) -> list[tuple[str | None, MapSource]]:
        """The named sources, in the mixture's order."""
        return list(zip(self.names, self.sources))

    def fingerprint(self) -> str:
        """A digest of the sources' names and fingerprints."""
        digest = hashlib.blake2b(digest_size=12)
        for name, source in zip(self.names, self.sources):
            digest.update(f"{name}\0{source.fingerprint()}\0".encode())
        return digest.hexdigest()

    def lengths(self, key: str | None) -> np.ndarray | None:
        """The sources' lengths end to end; None when one source's lengths mean reading its rows."""
        parts = [source.lengths(key) for source in self.sources]
        return None if any(part is None for part in parts) else np.concatenate(parts)

    def labels(self, field: str) -> np.ndarray | None:
        """The sources' label columns end to end; None when one source has none to read without its rows."""
        parts = [source.labels(field) for source in self.sources]
        return None if any(part is None for part in parts) else np.concatenate(parts)

    @property
    def sizes(self) -> list[int]:
        return [len(source) for source in self.sources]

    def locate(self, rows: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """``(source, row within it)`` of each of ``rows``."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= self.offsets[-1]):
            bad = int(rows[(rows < 0) | (rows >= len(self))][0])
            raise IndexError(f"row {bad} is out of range for the mixed source of {len(self)} rows")
        which = np.searchsorted(self.offsets, rows, side="right") - 1
        return which, rows - self.offsets[which]

    def _grouped(self, rows: Sequence[int]) -> tuple[np.ndarray, np.ndarray, list[tuple[int, np.ndarray]]]:
        """:meth:`locate`, and ``(source, places)`` of each source read: the places of the batch holding its rows,
        in the batch's order (one pass over the batch's few rows, not one scan of it per source)."""
        rows = np.asarray(rows, dtype=np.int64)
        which = np.searchsorted(self.offsets, rows, side="right") - 1
        numbers = which.tolist()
        if numbers and (min(numbers) < 0 or max(numbers) >= len(self.sources)):
            self.locate(rows)  # names the row out of range
        places: list[list[int]] = [[] for _ in self.sources]
        for place, number in enumerate(numbers):
            places[number].append(place)
        groups = [(number, np.asarray(place, dtype=np.int64)) for number, place in enumerate(places) if place]
        return which, rows - self.offsets[which], groups

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def columnar(self) -> bool:
        return all(isinstance(source, ColumnarSource) and source.transform is None and source.columnar()
                   for source in self.sources)

    def __getitems__(self, indices: Sequence[int]) -> RowBatch | ColumnBatch:
        """The batch at ``indices``; in a loader worker it carries, by name, what each sharded source's reader did
        since the worker's previous batch (``reader_counts``, for :meth:`add_worker_counts` in the parent)."""
        sent = {name: (source, source._unsent()) for name, source in self._sharded.items()}
        start = time.perf_counter()
        batch = self._read(indices)
        if not getattr(batch, "stage_s", None):  # columns merged from every source: one fetch
            stamp(batch, "fetch", time.perf_counter() - start)
        counts = {name: new for name, (source, before) in sent.items()
                  if before is not None and (new := source._since_sent(before))}
        if counts:
            batch.reader_counts = counts
        return batch

    def _counted(self) -> dict[str, ShardedSource]:
        """The sharded sources by name, one per reader: sources of one corpus share a reader and its counts, which
        are sent once, under the first one's name."""
        first: dict[int, tuple[str, ShardedSource]] = {}
        for name, source in zip(self.names, self.sources):
            if isinstance(source, ShardedSource):
                first.setdefault(id(source.reader), (name, source))
        return dict(first.values())

    def add_worker_counts(self, counts: Mapping[str, dict[str, int]]) -> None:
        """Add a loader worker's reader counts, ``{name: counts}``, each to its sharded source (the parent's loader
        iterator calls this as its batches arrive)."""
        for name, part in counts.items():
            self.sources[self.names.index(name)].add_worker_counts(part)

    def _read(self, indices: Sequence[int]) -> RowBatch | ColumnBatch:
        self._read_ahead(indices)
        if self.hands_columns:
            if not self._tables:
                self._tables.append(_SpanTables.of(self.sources) if self.columnar() else None)
            if self._tables[0] is not None:
                return self._gathered(indices, self._tables[0])
        if not (self.hands_columns and self.columnar()):
            return self._rows(indices)
        which, within, groups = self._grouped(indices)
        try:
            columns = self._merged_columns(groups, within, len(which))
        except Exception:  # noqa: BLE001 - the rows path names the failing row, or leaves it out
            return self._rows(indices)
        users = np.empty(len(which), dtype=np.int64)
        for number, places in groups:
            users[places] = self.sources[number].user_indices(within[places])
        batch = ColumnBatch(columns, len(which), rng_seed=getattr(indices, "rng_seed", None), role=self.role,
                            indices=users.tolist())
        batch.sources = self._names[which].tolist()
        return batch

    def _gathered(self, indices: Sequence[int], tables: _SpanTables) -> ColumnBatch:
        """The batch at ``indices`` as columns, where every source holds its rows as spans of one buffer: one
        compiled gather copies them into one buffer in the batch's order."""
        from engine.sources._span_copy import gather_spans

        rows = np.asarray(indices, dtype=np.int64)
        bad, buffer, at, counts, which, users = gather_spans(rows, self.offsets, tables.buffers, tables.starts,
                                                             tables.lengths, tables.users)
        if bad >= 0:
            self.locate(rows)  # names the row out of range
        batch = ColumnBatch({tables.column: SpanColumn(buffer, at, counts)}, len(rows),
                            rng_seed=getattr(indices, "rng_seed", None), role=self.role, indices=users.tolist())
        batch.sources = self._names[which].tolist()
        return batch

    def __getstate__(self) -> dict[str, Any]:
        # The span tables are a few arrays as long as the mixture: rebuilt in each worker rather than pickled.
        return {**self.__dict__, "_tables": []}

    def _read_ahead(self, indices: Sequence[int]) -> None:
        """Start each source's reads of its rows of a coming batch (:attr:`BatchIndices.ahead`)."""
        ahead = getattr(indices, "ahead", None)
        if ahead:
            self.read_ahead(ahead)

    def read_ahead(self, positions: Sequence[int]) -> None:
        """Start the reads of ``positions`` (a coming batch) in each source that reads ahead."""
        ahead_which, ahead_within = self.locate(positions)
        for number, source in enumerate(self.sources):
            if source.reads_ahead and (ahead_which == number).any():
                source.read_ahead(ahead_within[ahead_which == number].tolist())

    def _merged_columns(self, groups: list[tuple[int, np.ndarray]], within: np.ndarray, size: int
                        ) -> dict[str, Any]:
        """Each source's columns of its rows (one read per source), laid in the batch's order: token columns as
        spans of one buffer (one gather per source), other columns as lists."""
        parts = [self.sources[number].fetch_columns(within[places]) for number, places in groups]
        places = [places for _, places in groups]
        merged: dict[str, Any] = {}
        for name in parts[0]:
            values = [columns[name] for columns in parts]
            if all(isinstance(value, (RaggedColumn, SpanColumn)) for value in values):
                merged[name] = _spans_in_order(places, values, size)
            else:
                column: list[Any] = [None] * size
                for where, value in zip(places, values):
                    for place, item in zip(where.tolist(), value.rows() if hasattr(value, "rows") else value):
                        column[place] = item
                merged[name] = column
        return merged

    def _rows(self, indices: Sequence[int]) -> RowBatch:
        which, within = self.locate(list(indices))
        rows: list[Any] = [None] * len(which)
        kept = np.ones(len(which), dtype=bool)
        skipped, users = [], [0] * len(which)
        times: dict[str, float] = {}  # each stage summed over the sources read
        for number in np.unique(which).tolist():
            places = np.flatnonzero(which == number)
            part = _Indices(within[places].tolist())
            part.rng_seed, part.epoch = getattr(indices, "rng_seed", None), getattr(indices, "epoch", None)
            source = self.sources[number]  # a sharded source's reads are sent by this __getitems__, once per reader
            batch = source._read(part) if isinstance(source, ShardedSource) else source.__getitems__(part)
            positions = batch.positions if batch.positions is not None else list(part)
            for stage, seconds in (getattr(batch, "stage_s", None) or {}).items():
                times[stage] = times.get(stage, 0.0) + seconds
            users_read = batch.indices if batch.indices is not None else positions
            read = iter(zip(batch, positions, users_read))
            pending = next(read, None)
            left_out = {}
            for place, position in zip(places.tolist(), part):  # rows left out (on_error) are skipped in order
                if pending is not None and pending[1] == position:
                    rows[place], users[place] = pending[0], pending[2]
                    pending = next(read, None)
                else:
                    kept[place] = False
                    left_out[source.user_index(position)] = int(indices[place])
            skipped += [dataclasses.replace(record, mixed_row=left_out.get(record.index)) if left_out else record
                        for record in batch.skipped or []]  # the served counts leave these rows out
        out = RowBatch(row for row, keep in zip(rows, kept) if keep)
        out.rng_seed, out.role, out.on_error = getattr(indices, "rng_seed", None), self.role, self.on_error
        out.indices = [user for user, keep in zip(users, kept) if keep]
        out.sources = [self.names[number] for number, keep in zip(which.tolist(), kept) if keep]
        out.positions = [int(row) for row, keep in zip(np.asarray(indices), kept) if keep]
        out.skipped = skipped or None
        out.stage_s = times or None
        return out

    def for_role(self, role: str, transform: RowTransform | None) -> MixedSource:
        """This source serving split ``role``: each source named in errors as ``role`` and its name."""
        mixed = MixedSource({name: source.for_role(f"{role} {name!r}", _own_seeds(transform, name))
                             for name, source in zip(self.names, self.sources)})
        mixed.role, mixed.transform = role, None
        return mixed

    def view(self, positions: np.ndarray) -> MapSource:
        raise TypeError("a mixed source is not split further: each source is split on its own (val_split applies "
                        "to every source)")

    def first_row(self) -> Any:
        return self.sources[0].first_row()


@dataclasses.dataclass(frozen=True)
class _SpanTables:
    """Every row of a mixture's sources as a span of its source's buffer, end to end in the mixture's rows: what
    :func:`engine.sources._span_copy.gather_spans` reads a batch from (three int64 numbers a row)."""

    column: str
    buffers: tuple[np.ndarray, ...]
    starts: np.ndarray
    lengths: np.ndarray
    users: np.ndarray
    """The user's row (in its own source) of each row."""

    @classmethod
    def of(cls, sources: Sequence[MapSource]) -> _SpanTables | None:
        """The tables of ``sources``; None unless each holds its rows as spans of one column of one buffer, the
        same column and dtype in all (otherwise each source reads its rows, then they are copied in order)."""
        spans = [source.spans() for source in sources]
        if not spans or any(one is None for one in spans) or len({(one[0], one[1].dtype) for one in spans}) != 1:
            return None
        return cls(spans[0][0], tuple(np.ascontiguousarray(one[1]).reshape(-1) for one in spans),
                   np.concatenate([np.asarray(one[2], dtype=np.int64) for one in spans]),
                   np.concatenate([np.asarray(one[3], dtype=np.int64) for one in spans]),
                   np.concatenate([source.user_index_array(np.arange(len(source))) for source in sources]))


def _spans_in_order(places: list[np.ndarray], values: list[RaggedColumn | SpanColumn], size: int) -> SpanColumn:
    """Ragged or span columns of several sources as one :class:`SpanColumn` whose row ``places[k][i]`` is row
    ``i`` of ``values[k]``: the rows copied into one new buffer in the batch's order, each source's spans by one
    compiled copy (the text collator's numba, already loaded where columns are handed over)."""
    from engine.sources._span_copy import copy_spans

    spans = []
    lengths = np.empty(size, dtype=np.int64)
    for where, value in zip(places, values):
        if isinstance(value, SpanColumn):
            starts, counts = np.asarray(value.starts, dtype=np.int64), np.asarray(value.lengths, dtype=np.int64)
        else:
            offsets = np.asarray(value.offsets, dtype=np.int64)
            starts, counts = offsets[:-1], offsets[1:] - offsets[:-1]
        spans.append((np.asarray(value.values), starts, counts))
        lengths[where] = counts
    at = np.zeros(size, dtype=np.int64)
    np.cumsum(lengths[:-1], out=at[1:])
    buffer = np.empty(int(at[-1] + lengths[-1]) if size else 0, dtype=np.result_type(*(one for one, _, _ in spans)))
    for where, (one, starts, counts) in zip(places, spans):
        copy_spans(one, starts, counts, buffer, at[where])
    return SpanColumn(buffer, at, lengths)


def _own_seeds(transform: RowTransform | None, name: str) -> RowTransform | None:
    """``transform`` with seeds of source ``name``'s own: row ``i`` of two sources is augmented differently."""
    if transform is None:
        return None
    own = copy.copy(transform)
    own.seed = derive_seed(transform.seed, "mixture source", name)
    return own


class _Indices(list):
    """A source's part of a mixed batch, carrying the batch's seed and epoch to that source's read."""

    rng_seed: int | None = None
    epoch: int | None = None
