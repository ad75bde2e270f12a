"""A fetched row group decoded into a cache file: one decode at a time per process, a record batch at a time.

pyarrow's Parquet decoder holds the row group's pages, levels and values while it decodes (several times the
row group's decoded size), and those buffers are private memory of the process that decodes, a loader worker.
Here the row group's bytes are fetched first (:class:`StoredRowGroup`, in parallel with other fetches), then
decoded from memory under a lock of the process, in record batches of about :data:`DECODE_BYTES` that go
straight into the cache file, and the memory pool's unused pages go back to the OS before the next decode. The
cache file may then hold several record batches: its readers see a chunked table over one memory mapping.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

DECODE_BYTES = 1 << 18
"""Decoded bytes of one record batch written to a cache file (rows of a row group at its average row size)."""

_DECODING = threading.Lock()
"""Held while a row group is decoded and written: one decode at a time in this process."""


def _new_lock() -> None:
    global _DECODING
    _DECODING = threading.Lock()  # a thread of the parent may have held it when this process was forked


os.register_at_fork(after_in_child=_new_lock)


class StoredRowGroup(NamedTuple):
    """The stored bytes ``[start, start + len(data))`` of a Parquet shard of ``size`` bytes (a row group's column
    chunks), its footer's ``metadata``, and ``read(first, last)``: bytes of the shard outside them, from the store."""

    metadata: Any
    start: int
    data: bytes
    size: int
    read: Callable[[int, int], bytes]


def row_group_range(metadata: Any, index: int) -> tuple[int, int]:
    """``(start, end)``: the bytes of row group ``index``'s column chunks in its shard (footer ``metadata``)."""
    group = metadata.row_group(index)
    starts, ends = [], []
    for number in range(group.num_columns):
        chunk = group.column(number)
        first = chunk.data_page_offset
        if chunk.has_dictionary_page and chunk.dictionary_page_offset:
            first = min(first, chunk.dictionary_page_offset)
        starts.append(first)
        ends.append(first + chunk.total_compressed_size)
    return min(starts), max(ends)


class _StoredFile(io.RawIOBase):
    """A read-only file over a :class:`StoredRowGroup`: reads within its bytes are views of them, others (none
    expected) go to the store."""

    def __init__(self, stored: StoredRowGroup) -> None:
        super().__init__()
        self._stored, self._data, self._at = stored, memoryview(stored.data), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self._at = offset + (0, self._at, self._stored.size)[whence]
        return self._at

    def tell(self) -> int:
        return self._at

    def read(self, count: int = -1) -> Any:
        first = self._at
        last = self._stored.size if count is None or count < 0 else min(first + count, self._stored.size)
        self._at = last
        begin, end = first - self._stored.start, last - self._stored.start
        if begin >= 0 and end <= len(self._data):
            return self._data[begin:end]
        return self._stored.read(first, last)


@contextlib.contextmanager
def claimed(path: Path) -> Iterator[None]:
    """Hold the claim on the cache file ``path`` (an exclusive ``flock`` on a lock file beside it) while its row
    group is fetched: a process that wants the same row group (the other loader workers, which read batches of the
    same row groups) waits, then finds the file, rather than fetching and decoding it too. Without ``fcntl`` (not
    POSIX) there is no claim: each process fetches what it lacks."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - POSIX has it
        yield
        return
    lock = path.with_name(f".{path.stem}.lock")
    descriptor = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):  # a process that opens it later finds the file, or fetches
            os.remove(lock)
        os.close(descriptor)  # gives the claim back


def write_cache_file(path: Path, stored: StoredRowGroup | Any, index: int) -> None:
    """Write row group ``index`` (a Parquet shard's :class:`StoredRowGroup`, or an Arrow table) to the Arrow IPC
    file ``path``, holding this process's decode lock; its pool's unused pages go back to the OS before the lock
    is given back (the decoded buffers are in the heap of the thread that decoded, which alone can release them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with _DECODING:
        try:
            if isinstance(stored, StoredRowGroup):
                shard = pq.ParquetFile(_StoredFile(stored), metadata=stored.metadata, pre_buffer=False)
                group = stored.metadata.row_group(index)
                rows = max(1, group.num_rows * DECODE_BYTES // max(group.total_byte_size, 1))
                batches = shard.iter_batches(batch_size=rows, row_groups=[index], use_threads=False)
                schema = shard.schema_arrow
            else:
                batches, schema = stored.to_batches(), stored.schema
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
                for batch in batches:
                    writer.write_batch(batch)
                    del batch
                    pa.default_memory_pool().release_unused()  # the batch's pages, before the next is decoded
        finally:
            batches = None
            pa.default_memory_pool().release_unused()


def save_array(path: Path, array: np.ndarray) -> None:
    """Write ``array`` to ``path`` (``.npy``) through a scratch file renamed into place, so a reader never sees half
    of it (row lengths and token counts kept beside the cache)."""
    import uuid

    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.stem}.{uuid.uuid4().hex}.npy")
    np.save(scratch, array)
    scratch.replace(path)


class RaggedView(NamedTuple):
    """Where each row of a list column of a cached row group lies in ``values``, a numpy view of the memory-mapped
    file (no copy): one view over the file's record batches, ``offsets`` likewise; per batch, ``bounds`` (its first
    row, and the end), ``shift`` (a row's index in ``offsets`` minus its row) and ``base`` (its first value)."""

    values: Any
    offsets: Any
    bounds: Any
    shift: Any
    base: Any

    def spans(self, rows: Any) -> tuple[Any, Any]:
        """``(starts, ends)`` (int64) of ``rows`` (numbers within the row group) in :attr:`values`."""
        batch = np.searchsorted(self.bounds, rows, side="right") - 1
        positions = rows + self.shift[batch]
        base = self.base[batch]
        return self.offsets[positions].astype(np.int64) + base, self.offsets[positions + 1].astype(np.int64) + base


def ragged_view(column: Any) -> RaggedView | None:
    """A :class:`RaggedView` of a list-of-integers column without nulls, else None."""
    from collators.columns import numpy_of
    from engine.sources._arrow_buffers import list_of_ints, shared_view

    if not list_of_ints(column):
        return None
    chunks = [chunk for chunk in column.chunks if len(chunk)] or column.chunks[:1]
    values = [numpy_of(chunk.values) for chunk in chunks]  # not to_numpy: it imports pandas
    offsets = [numpy_of(chunk.offsets) for chunk in chunks]
    bounds = np.cumsum([0] + [len(chunk) for chunk in chunks], dtype=np.int64)
    if len(chunks) == 1:
        zero = np.zeros(1, dtype=np.int64)
        return RaggedView(values[0], offsets[0], bounds, zero, zero)
    value_views = shared_view(values, [chunk.values.buffers()[1] for chunk in chunks])
    offset_views = shared_view(offsets, [chunk.offsets.buffers()[1] for chunk in chunks])
    if value_views is None or offset_views is None:  # not one mapping (never for a cache file): one copy
        import pyarrow as pa

        return ragged_view(pa.chunked_array([column.combine_chunks()]))
    (whole_values, base), (whole_offsets, offset_base) = value_views, offset_views
    return RaggedView(whole_values, whole_offsets, bounds, offset_base - bounds[:-1], base)


def sync_file(path: Path) -> None:
    """Write ``path``'s pages to disk: the file is whole after a crash, and its pages are clean page cache that the
    OS may drop, no longer dirty pages charged to the process that wrote them (a loader worker) until written back."""
    descriptor = os.open(path, os.O_RDWR)
    try:
        getattr(os, "fdatasync", os.fsync)(descriptor)
    finally:
        os.close(descriptor)
