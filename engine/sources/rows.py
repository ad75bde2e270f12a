"""The base of every source, :class:`MapSource`: the defaults of the :class:`~engine.sources.protocol.Source`
protocol, and batched reads that name a failing row, leave it out (``on_error``), or pass each row through its
split's transform, seeded by (seed, epoch, dataset index)."""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from collators.columns import ColumnBatch, RowBatch
from engine.core.rng import hash_into
from engine.core.stage_times import stamp
from engine.sources.bad_rows import READ_FIX, named_error, read_skipping, transform_skipping
from engine.sources.protocol import EpochBlocks
from engine.sources.transforms import RowTransform, TransformFailed

SAMPLED_ROWS = 16
"""Rows a source's default fingerprint reads, evenly spaced."""


class MapSource(Dataset):
    """The base of every source, meeting :class:`~engine.sources.protocol.Source` with defaults: subclasses
    implement ``_fetch(positions)``, ``__len__`` and ``view``, and override what they know better (their
    fingerprint, their rows' lengths, an epoch order, read-ahead, counters, labels)."""

    role = "data"
    """The split this source serves (train, val, test, predict), named in errors."""
    on_error = "raise"
    """What a failing row does: 'raise' names it in an error; 'skip' and 'warn' leave it out of its batch."""
    transform: RowTransform | None = None
    """The split's per-row transform, applied after the rows are read (set by :meth:`for_role`)."""

    def __getitem__(self, index: int) -> Any:
        return self._fetch([index])[0] if self.transform is None else self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> RowBatch:
        positions = list(indices)
        start = time.perf_counter()
        try:
            rows = RowBatch(self._fetch(positions))
        except Exception as error:  # find the row (only now: no per-row cost on the way that works)
            if self.on_error == "raise":
                raise self.row_error(positions, error) from error
            kept, positions, skipped = read_skipping(self, positions, error)
            rows = RowBatch(kept)
            rows.skipped = skipped
        fetched = time.perf_counter()
        if self.transform is not None:
            rows, positions = self.transformed(rows, positions, getattr(indices, "epoch", None) or 0)
            stamp(rows, "decode", time.perf_counter() - fetched)
        stamp(rows, "fetch", fetched - start)
        rows.rng_seed, rows.role = getattr(indices, "rng_seed", None), self.role
        rows.indices = self.user_indices(positions)  # the user's rows, named if the batch fails to collate
        rows.positions = positions
        if self.on_error != "raise":  # a row that fails to collate (a corrupt image) is left out too, named
            rows.on_error, rows.places = self.on_error, self.row_places(positions)
        return rows

    def row_places(self, positions: Sequence[int]) -> list[str] | None:
        """Where each of ``positions`` lies, as a record of a row left out names it (a shard and a sample's key);
        None when the row's index says it all."""
        return None

    def row_error(self, positions: list[int], error: Exception) -> Exception:
        """An error naming the first of ``positions`` whose read fails (the batch when none fails alone)."""
        for position in positions:
            try:
                self._fetch([position])
            except Exception as single:  # the failing row, with its own exception
                return named_error(single, f"reading row {self.user_index(position)} of the {self.role} data "
                                           f"failed; {READ_FIX}")
        return named_error(error, f"reading rows {self.user_indices(positions[:8])} of the {self.role} data failed")

    def transformed(self, rows: RowBatch, positions: list[int], epoch: int) -> tuple[RowBatch, list[int]]:
        """``(rows, positions)`` after this split's transform, seeded by (seed, epoch, dataset index). A failing row
        is named in an error, or with ``on_error`` 'skip'/'warn' left out and recorded like a row that failed to read.
        """
        try:
            out = RowBatch(self.transform(rows, [self.dataset_index(position) for position in positions], epoch,
                                          reread=lambda place: self._fetch([positions[place]])[0]))
        except TransformFailed as failed:
            if self.on_error == "raise":
                seeds = [self.dataset_index(position) for position in positions]
                row = self.user_index(positions[seeds.index(failed.index)]) if failed.index in seeds else failed.index
                raise named_error(failed.error, f"{self.transform.argument} failed on row {row} of the "
                                                f"{self.role} data; fix the transform or that row") from failed.error
            kept, kept_positions, skipped = transform_skipping(self, rows, positions, epoch)
            out, positions = RowBatch(kept), kept_positions
            out.skipped = [*(rows.skipped or []), *skipped]
            return out, positions
        out.skipped = rows.skipped
        return out, positions

    def for_role(self, role: str, transform: RowTransform | None) -> MapSource:
        """A shallow copy of this source serving split ``role`` with its own ``transform`` (data shared)."""
        source = copy.copy(self)
        source.role, source.transform = role, transform
        return source

    origins: np.ndarray | None = None
    """Rows cut by the long-row policy (windows of ``long_rows='split'``, rows cut by 'truncate'): the index in
    the data the user gave of the row each of this source's underlying rows was cut from; None when each row is
    the user's own."""

    first_index = 0
    """The first row that reads, which construction's checks of the rows' fields look at (see ``as_source``)."""

    def first_row(self) -> Any:
        """The row construction checks the fields of: row 0, or with ``on_error`` 'skip'/'warn' the first that
        reads."""
        return self[self.first_index]

    def dataset_index(self, position: int) -> int:
        """The index in the data the user gave of this source's ``position`` (a split is a view)."""
        positions = getattr(self, "positions", None)
        return int(positions[position]) if positions is not None else position

    def user_index(self, position: int) -> int:
        """The user's row that this source's ``position`` is (or was cut from, for a window): what errors and
        skipped-row records name. :meth:`dataset_index`, which seeds a row's transform, counts windows apart."""
        index = self.dataset_index(position)
        return int(self.origins[index]) if self.origins is not None else index

    def user_indices(self, positions: Sequence[int]) -> list[int]:
        """:meth:`user_index` of each of ``positions``, in one numpy gather (a batch's rows, named on error)."""
        return self.user_index_array(positions).tolist()

    def user_index_array(self, positions: Sequence[int]) -> np.ndarray:
        """:meth:`user_indices` as an array (int64)."""
        base = getattr(self, "positions", None)
        indices = base[np.asarray(positions, dtype=np.int64)] if base is not None else np.asarray(positions)
        return np.asarray(self.origins[indices] if self.origins is not None else indices, dtype=np.int64)

    def _fetch(self, positions: list[int]) -> list[Any]:
        raise NotImplementedError

    def view(self, positions: np.ndarray) -> MapSource:
        """A source over ``positions`` of this one (a split), sharing the underlying data."""
        raise NotImplementedError

    # The rest of the Source protocol, with the defaults of a source that knows nothing more about its rows.

    lengths_from = "a pass over its rows"
    """How :meth:`lengths` reads the rows' lengths, as the report says it."""
    reads_ahead = False
    """Whether batches name the rows of coming batches for this source to fetch in the background."""
    fork_safe = True
    """Whether loader workers forked from a process that has read this source read it correctly."""
    shuffle_window: int | None = None
    """The window its epoch order shuffles rows within (see :meth:`epoch_blocks`), which a saved state records;
    None without an order of its own."""

    def fingerprint(self) -> str:
        """A digest of :data:`SAMPLED_ROWS` evenly spaced rows as stored (no transform), and of their count."""
        return sampled_rows_digest(self._fetch, len(self))

    def lengths(self, key: str | None) -> np.ndarray | None:
        """None: this source's lengths are known only by reading every row."""
        return None

    def epoch_blocks(self) -> EpochBlocks | None:
        """None: no order of its own; the sampler permutes the rows."""
        return None

    def read_ahead(self, positions: Sequence[int]) -> None:
        """Nothing to fetch ahead (see :attr:`reads_ahead`)."""

    def handing_columns(self) -> MapSource:
        """This source: it answers rows."""
        return self

    def parts(self) -> list[tuple[str | None, MapSource]]:
        """``[(None, self)]``: one source, not a mixture."""
        return [(None, self)]

    def counters(self) -> tuple[Hashable, dict[str, Any]] | None:
        """None: no reader of its own to report on."""
        return None

    def labels(self, field: str) -> np.ndarray | None:
        """None: the labels are known only by reading the rows."""
        return None

    def class_names(self, field: str) -> list[str] | None:
        """None: no names for the classes of ``field``."""
        return None


def sampled_rows_digest(read: Any, count: int, rows: int = SAMPLED_ROWS) -> str:
    """A digest of ``count`` and of the rows ``read([position])`` gives at ``rows`` evenly spaced positions. A row
    that fails to read hashes as its exception's type (a source with ``on_error='skip'`` still fingerprints)."""
    digest = hashlib.blake2b(count.to_bytes(8, "little"), digest_size=12)
    for position in sampled_positions(count, rows):
        try:
            value = read([position])[0]
        except Exception as error:  # the user's reader: any exception, recorded by its type
            value = f"unreadable: {type(error).__name__}"
        hash_into(digest, value)
    return digest.hexdigest()


def sampled_positions(count: int, rows: int = SAMPLED_ROWS) -> list[int]:
    """``rows`` evenly spaced positions among ``count`` (all of them when there are fewer)."""
    return sorted({int(p) for p in np.linspace(0, count - 1, num=min(count, rows))}) if count else []


class ColumnarSource(MapSource):
    """A source that can read a batch as columns. Once a loader whose collator reads columns asks for them
    (:meth:`handing_columns`), ``__getitems__`` fetches a :class:`collators.columns.ColumnBatch`, which
    ``TextCollator`` pads straight from the flat buffers; otherwise, and for a split with a per-row transform (a
    transform needs rows) or a source whose :meth:`columnar` says no, it answers rows."""

    hands_columns = False
    """Whether ``__getitems__`` answers columns (set on a copy by :meth:`handing_columns`)."""

    def columnar(self) -> bool:
        raise NotImplementedError

    def fetch_columns(self, positions: Sequence[int]) -> dict[str, Any]:
        raise NotImplementedError

    def spans(self) -> tuple[str, np.ndarray, np.ndarray, np.ndarray] | None:
        """``(column, values, starts, lengths)`` where every row is one column's span of one flat buffer, held in
        memory: row ``i`` is ``values[starts[i]:starts[i] + lengths[i]]`` (what a mixed batch's rows are copied
        from, in one compiled gather over its sources); None where a batch is read otherwise."""
        return None

    def handing_columns(self) -> ColumnarSource:
        """A shallow copy of this source whose batches are fetched as columns (data and fetcher shared: not
        ``copy.copy``, which would go through ``__getstate__`` and leave the fetcher behind)."""
        source = object.__new__(type(self))
        source.__dict__.update(self.__dict__, hands_columns=True)
        return source

    def __getitems__(self, indices: Sequence[int]) -> RowBatch | ColumnBatch:
        if not self.hands_columns or self.transform is not None or not self.columnar():
            return super().__getitems__(indices)
        positions = list(indices)
        start = time.perf_counter()
        try:
            columns = self.fetch_columns(positions)
        except Exception:
            rows = super().__getitems__(indices)  # names the failing row, or leaves it out (on_error)
            if rows.skipped:
                return rows
            raise  # every row reads on its own: the column read itself failed
        batch = ColumnBatch(columns, len(positions), rng_seed=getattr(indices, "rng_seed", None), role=self.role,
                            indices=self.user_indices(positions))
        stamp(batch, "fetch", time.perf_counter() - start)
        return batch


def empty_rows_error(rows: list[int], count: int, key: str | None, role: str) -> ValueError:
    """The refusal of token rows of length 0 (``rows``: the first few of ``count``, as indices in the data given)."""
    plural = count > 1
    more = f" (and {count - 5} more)" if count > 5 else ""
    return ValueError(f"{key or 'the row'!r} should hold at least one token in every row, but row"
                      f"{'s' if plural else ''} {', '.join(map(str, rows))}{more} of the {role} data "
                      f"{'hold' if plural else 'holds'} 0 tokens; padded, an empty row is all padding and "
                      f"gives NaN in attention: filter empty rows out of the data (e.g. dataset.filter(lambda row: "
                      f"len(row[{key or 'input_ids'!r}]) > 0))")
