"""Row groups of shards, fetched once into a local cache and memory-mapped from there.

A row group is fetched from its shard (a ranged read through ``fsspec``), checked against the listing (a shard
that disappeared or was replaced since is named, never read as other data), written to the cache folder as an
Arrow IPC file (:mod:`engine.sources.shards.decode`: one decode at a time per process, a few record batches), and
memory-mapped: every loader worker reads the same pages, which the OS can drop and reload, so
a worker's private memory does not grow with the rows it has read. The cache holds at most ``cache_bytes``; the
least recently used row groups leave first. A resumed run finds what it fetched before and fetches nothing again.

Transient failures (HTTP 5xx, throttling, a dropped connection, a timeout) are retried with exponential backoff
and counted in :attr:`RowGroupReader.stats`; a failure that persists raises naming the shard, the row group and
the attempts.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from engine.sources.shards import decode as shard_decode
from engine.sources.shards import tars
from engine.sources.shards.filesystems import filesystem
from engine.sources.shards.listing import (
    FOOTERS,
    ShardListing,
    file_version,
    named_error,
    open_ipc,
    opened_info,
)
from engine.sources.shards.object_stores import arrow_transient

OPEN_GROUPS = 64
"""Row groups a process keeps open (memory-mapped, so this costs address space, not private memory)."""

FETCH_THREADS = 4
"""Row groups a process fetches at once: a batch's missing row groups (a shuffle window spans several) and the
next batch's, read ahead. The latency of a fetch is the store's round trip, so they overlap; each holds its row
group's bytes until it is decoded, one decode at a time."""

CACHE_FORMAT = "2"
"""Part of every cache file's name: raised when the cached layout changes, so old files are not read."""

log = logging.getLogger("engine")


class ShardChanged(ValueError):
    """A shard differs from what was listed: reading it would serve other rows under the same indices."""


def default_shard_cache() -> Path:
    """``<HF_DATASETS_CACHE>/universal_datamodule/shards``: beside the ``datasets`` cache the user manages."""
    import datasets

    return Path(datasets.config.HF_DATASETS_CACHE) / "universal_datamodule" / "shards"


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` may pass on a retry: a server error (5xx), throttling (429), a dropped or refused
    connection, a timeout, a body cut short. A missing file, a refused permission or a changed shard is not."""
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError, ShardChanged)):
        return False
    arrow = arrow_transient(error)  # pyarrow's S3 and GCS clients name the error kind in its text
    if arrow is not None:
        return arrow
    status = _status(error)
    if status is not None:
        return status >= 500 or status == 429
    if isinstance(error, (OSError, ConnectionError, TimeoutError, EOFError)):
        return True
    module = type(error).__module__ or ""
    if module.startswith(("botocore", "aiohttp", "urllib3", "requests")):
        return True
    import pyarrow as pa

    return isinstance(error, pa.ArrowInvalid) and "end of" in str(error).lower()  # a body cut short


def _status(error: BaseException) -> int | None:
    """The HTTP status an error carries (botocore's ``response``, or an error chained from one), if any."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        response = getattr(error, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(status, int):
                return status
        status = getattr(error, "status", None)
        if isinstance(status, int) and 100 <= status < 600:
            return status
        error = error.__cause__ or error.__context__
    return None


class RowGroupReader:
    """Reads row groups of a :class:`ShardListing` through the local cache; one per process (not pickled)."""

    def __init__(self, listing: ShardListing) -> None:
        self.listing = listing
        shards = listing.shards
        self.folder = Path(shards.cache_dir) if shards.cache_dir is not None else default_shard_cache()
        self.budget = shards.cache_bytes
        self._system: Any = None
        self._open: OrderedDict[int, Any] = OrderedDict()
        self._pid = os.getpid()
        self._pending: dict[int, Future[Any]] = {}
        self._ragged: dict[tuple[int, str], shard_decode.RaggedView | None] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._footers: OrderedDict[int, Any] = OrderedDict()  # Parquet footers of the shards fetched from
        self.stats: Counter[str] = Counter()
        """This process's counts: ``fetched`` row groups, ``cache_hits``, ``retries``, ``bytes_fetched``,
        ``evicted``, ``read_ahead`` (row groups fetched ahead of their batch); ``bytes_fetched`` counts the bytes
        read from the store (a Parquet row group's column chunks as stored, an Arrow record batch's buffers)."""

    def _forked(self) -> None:
        """In a process forked from the one that built this reader (a loader worker), forget what belongs to the
        parent: its read-ahead threads (absent here: their futures would never finish) and its store client."""
        if self._pid != os.getpid():
            self._pid, self._system, self._pool, self._pending = os.getpid(), None, None, {}

    @property
    def system(self) -> Any:
        self._forked()
        if self._system is None:
            self._system = filesystem(self.listing.shards, own_retries=True)[0]
        return self._system

    def cache_path(self, group: int) -> Path:
        shard = int(self.listing.group_shard[group])
        key = f"{CACHE_FORMAT}\x00{self.listing.url(shard)}\x00{self.listing.versions[shard]}\x00" \
              f"{int(self.listing.group_index[group])}"
        return self.folder / f"{hashlib.blake2b(key.encode(), digest_size=16).hexdigest()}.arrow"

    def table(self, group: int) -> Any:
        """Row group ``group`` (an index into the listing's row groups) as a memory-mapped ``pyarrow.Table``."""
        self._forked()
        table = self._open.get(group)
        if table is not None:
            self._open.move_to_end(group)
            return table
        pending = self._pending.pop(group, None)
        fetched = False  # by this batch (open_together), rather than found in the cache or read ahead
        if pending is not None:  # waits; a failed fetch is fetched again below, raising or retrying as usual
            fetched = pending.exception() is None and pending.result() is True
        path = self.cache_path(group)
        table = self._mapped(path)
        if table is None:
            fetched = self._cache(group, path)
            table = self._mapped(path)
            self.stats["cache_hits"] += not fetched
            if table is None:  # evicted by another process at once: the cache is smaller than what is in use
                raise RuntimeError(f"the shard cache {self.folder} removed a row group as soon as it was written; "
                                   f"its cache_bytes={self.budget} is too small for the loader workers' shuffle "
                                   f"windows: raise Shards(cache_bytes=...)")
        else:
            self.stats["cache_hits"] += not fetched
        self._open[group] = table
        if len(self._open) > OPEN_GROUPS:
            closed, _ = self._open.popitem(last=False)
            for name in self.listing.schema.names:
                self._ragged.pop((closed, name), None)
        return table

    def ragged(self, group: int, column: str) -> shard_decode.RaggedView | None:
        """A :class:`~engine.sources.shards.decode.RaggedView` of ``column`` in row group ``group`` (numpy views of
        the memory-mapped file), or None when the column is not lists of integers without nulls."""
        key = (group, column)
        if key not in self._ragged:
            self._ragged[key] = shard_decode.ragged_view(self.table(group).column(column))
        return self._ragged[key]

    def open_together(self, groups: list[int]) -> None:
        """Open ``groups`` (a batch's), fetching the ones not cached side by side: a batch whose rows span a shuffle
        window's row groups waits for about one round trip to the store, not one per row group."""
        self._fetch_in_background(groups, self._fetch_now, least=2)
        for group in groups:
            self.table(group)

    def read_ahead(self, groups: list[int]) -> None:
        """Fetch ``groups`` into the cache in background threads, unless open, cached or already on the way."""
        self._fetch_in_background(groups, self._fetch_ahead, least=1)

    def _fetch_in_background(self, groups: list[int], fetch: Callable[[int], bool | None], least: int) -> None:
        """Submit ``fetch`` of each of ``groups`` not open, cached or on the way, when there are ``least`` of them."""
        self._forked()
        missing = [group for group in groups
                   if group not in self._open and group not in self._pending and not self.cache_path(group).exists()]
        if len(missing) < least:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=FETCH_THREADS, thread_name_prefix="shard-fetch")
        for group in missing:
            self._pending[group] = self._pool.submit(fetch, group)

    def _fetch_now(self, group: int) -> bool:
        """Fetch ``group`` for the batch that waits for it; whether this process fetched it."""
        path = self.cache_path(group)
        return not path.exists() and self._cache(group, path)

    def _fetch_ahead(self, group: int) -> None:
        if self._fetch_now(group):
            self.stats["read_ahead"] += 1

    def _cache(self, group: int, path: Path) -> bool:
        """Fetch row group ``group`` into the cache file ``path``, unless another process did while this one waited
        for its claim on the file (then False). Its bytes are fetched first (in parallel with other fetches: that
        is where the latency is), then decoded into the file one record batch at a time, one decode at a time in
        this process (:func:`~engine.sources.shards.decode.write_cache_file`), which gives its buffers back to the
        OS before the next starts. A loader worker's private memory then holds one decode's buffers at most."""
        shard, index = int(self.listing.group_shard[group]), int(self.listing.group_index[group])
        make_cache_folder(self.folder)
        with shard_decode.claimed(path):
            if path.exists():
                return False
            if self.listing.kinds[shard] == "parquet":
                stored = self._with_retries(group, lambda: self._row_group_bytes(shard, index))
                fetched = len(stored.data)
            elif self.listing.kinds[shard] == "tar":
                data, stored = self._with_retries(group, lambda: self._tar_group(shard, index))
                fetched = len(data)
                del data
            else:
                stored = self._with_retries(group, lambda: self._read(shard, index, None))
                fetched = stored.nbytes
            scratch = path.with_name(f".{path.stem}.{uuid.uuid4().hex}.tmp")
            try:
                shard_decode.write_cache_file(scratch, stored, index)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(scratch)
                raise
            del stored
            self.stats["fetched"] += 1
            self.stats["bytes_fetched"] += fetched
            self._store(path, scratch)
        return True

    def _mapped(self, path: Path) -> Any:
        """The cache file ``path`` memory-mapped, or None when it is not there. A file that does not read whole (cut
        short or damaged on disk: every file is written whole before it is renamed into place) is removed, so that
        its row group is fetched again."""
        import pyarrow as pa

        try:
            with pa.memory_map(str(path)) as source:
                table = pa.ipc.open_file(source).read_all()
            os.utime(path)  # the least recently used leave first
        except (FileNotFoundError, NotADirectoryError):  # not cached (a cache_dir under a file is named in _cache)
            return None
        except (pa.ArrowInvalid, OSError) as error:
            log.warning("the shard cache file %s is damaged (%s: %s); removed, its row group is fetched again",
                        path, type(error).__name__, error)
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            except OSError as failed:
                raise OSError(f"the shard cache file {path} is damaged ({type(error).__name__}: {error}) and could "
                              f"not be removed ({failed}); delete it (or the cache folder {self.folder}) and run "
                              f"again") from error
            return None
        return table

    def _store(self, path: Path, scratch: Path) -> None:
        """Put the written file ``scratch`` in place as ``path`` (on disk before it is renamed into place: readers, and
        a run after a crash, never see half of one), then remove the least recently used files past the budget."""
        shard_decode.sync_file(scratch)
        os.replace(scratch, path)
        self._evict(keep=path)

    def _evict(self, keep: Path) -> None:
        entries = []
        for entry in os.scandir(self.folder):
            if entry.name.endswith(".arrow"):
                try:
                    stat = entry.stat()
                except FileNotFoundError:
                    continue
                entries.append((stat.st_mtime, stat.st_size, entry.path))
        total = sum(size for _, size, _ in entries)
        for _, size, name in sorted(entries):
            if total <= self.budget:
                break
            if name == str(keep):
                continue
            with contextlib.suppress(FileNotFoundError):  # removed by another process
                os.remove(name)  # a process that has it memory-mapped keeps reading its pages
            total -= size
            self.stats["evicted"] += 1

    def _row_group_bytes(self, shard: int, index: int) -> Any:
        """The stored bytes of row group ``index`` of Parquet shard ``shard`` (one ranged read of its column
        chunks, after checking the shard is the one listed), with the shard's footer (read once per process)."""
        path = self.listing.files[shard]
        with self._opened(shard, cache_type="none") as handle:  # the footer's and the row group's ranges only
            metadata = self._footers.get(shard, FOOTERS.get((path, self.listing.versions[shard])))
            if metadata is None:
                import pyarrow.parquet as pq

                metadata = pq.read_metadata(handle)
                self._footers[shard] = metadata
                while len(self._footers) > OPEN_GROUPS:
                    self._footers.popitem(last=False)
            start, end = shard_decode.row_group_range(metadata, index)
            handle.seek(start)
            data = handle.read(end - start)
        if len(data) != end - start:  # a body cut short: transient, retried
            raise EOFError(f"read {len(data)} of the {end - start} bytes of row group {index} of {path!r}")
        return shard_decode.StoredRowGroup(metadata, start, data, int(self.listing.sizes[shard]),
                                           lambda first, last: self.system.cat_file(path, start=first, end=last))

    def _tar_group(self, shard: int, index: int) -> tuple[bytes, Any]:
        """``(bytes read, table)`` of row group ``index`` of tar shard ``shard``: one ranged read of its samples'
        members (after checking the shard is the one listed), cut into the columns of
        :func:`~engine.sources.shards.tars.group_table`."""
        tar = self.listing.tar_indexes[shard]
        start, end = tar.byte_range(index)
        end = min(end, int(self.listing.sizes[shard]))  # a member cut short by the tar's end: read what is there
        with self._opened(shard, cache_type="none") as handle:
            handle.seek(start)
            data = handle.read(end - start) if end > start else b""
        if len(data) != end - start:  # a body cut short: transient, retried
            raise EOFError(f"read {len(data)} of the {end - start} bytes of row group {index} of "
                           f"{self.listing.url(shard)!r}")
        return data, tars.group_table(tar, index, data, start, self.listing.schema, self.listing.url(shard))

    def lengths(self, group: int, column: str) -> Any:
        """The list lengths of ``column`` in row group ``group`` (read as :meth:`column` reads it)."""
        import pyarrow.compute as pc

        return pc.list_value_length(self.column(group, column)).to_numpy(zero_copy_only=False)

    def column(self, group: int, column: str) -> Any:
        """Column ``column`` of row group ``group``: from the cache when the row group is there, else reading only
        that column (Parquet; an Arrow shard's row group is fetched whole and cached)."""
        table = self._open.get(group) or self._mapped(self.cache_path(group))
        shard, index = int(self.listing.group_shard[group]), int(self.listing.group_index[group])
        if table is None and self.listing.kinds[shard] == "parquet":
            table = self._with_retries(group, lambda: self._read(shard, index, column))
        elif table is None:
            table = self.table(group)
        return table.column(column)

    def _with_retries(self, group: int, read: Callable[[], Any]) -> Any:
        """``read()`` of row group ``group``, with exponential backoff after a transient failure; a persistent one
        raises naming the shard, the row group and the attempts."""
        shards = self.listing.shards
        shard, index = int(self.listing.group_shard[group]), int(self.listing.group_index[group])
        attempts = shards.retries + 1
        for attempt in range(1, attempts + 1):
            try:
                return read()
            except (ShardChanged, FileNotFoundError):  # named by _opened, with the fix
                raise
            except Exception as error:  # sorted into transient (retried) and not (raised) below
                if not is_transient(error):
                    raise named_error(error, f"reading row group {index} of shard {self.listing.url(shard)!r} "
                                             f"failed, and another attempt cannot change it: check the store's "
                                             f"credentials and permissions (HTTP 403), that the object is there "
                                             f"(404), and that the shard is a whole {self.listing.kinds[shard]} "
                                             f"file (rewrite it, or remove it from the corpus)") from error
                if attempt == attempts:
                    raise OSError(
                        f"reading row group {index} of shard {self.listing.url(shard)!r} failed {attempts} times "
                        f"(retries={shards.retries}); last error: {type(error).__name__}: {error}. Check the store "
                        f"and the network, or raise Shards(retries=...)") from error
                self.stats["retries"] += 1
                wait = shards.retry_wait * 2 ** (attempt - 1)
                log.warning("reading shard %r failed (%s: %s); retry %d of %d in %.2f s", self.listing.url(shard),
                            type(error).__name__, error, attempt, shards.retries, wait)
                time.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover

    @contextlib.contextmanager
    def _opened(self, shard: int, **options: Any) -> Iterator[Any]:
        """Shard ``shard`` open for reading, after checking it is the one listed, from the headers its opening read
        (a shard gone or replaced raises: its rows would not be the rows listed)."""
        url = self.listing.url(shard)
        try:
            handle = self.system.open(self.listing.files[shard], "rb", **options)
        except FileNotFoundError:
            raise FileNotFoundError(f"shard {url!r} was listed but no longer exists; the corpus changed while it was "
                                    f"read: restore the shard, or build the data module again to list the corpus "
                                    f"anew (a saved state of the old corpus will then be refused)") from None
        with handle:
            version = file_version(opened_info(self.system, self.listing.files[shard], handle), handle)
            if version != self.listing.versions[shard]:
                raise ShardChanged(f"shard {url!r} changed since it was listed (version "
                                   f"{self.listing.versions[shard]!r}, now {version!r}); its rows would not be the "
                                   f"rows listed: restore the shard, or build the data module again to list the "
                                   f"corpus anew (a saved state of the old corpus will then be refused)")
            yield handle

    def _read(self, shard: int, index: int, column: str | None) -> Any:
        """Row group ``index`` of ``shard`` (only ``column`` if given), after checking the shard is the one listed."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.listing.kinds[shard] == "parquet":
            # no read-ahead cache: pyarrow asks for the row group's byte ranges (pre-buffered, coalesced), and
            # fsspec's default cache would read on from there to a block's end (50 MiB for s3fs: most of the shard)
            with self._opened(shard, cache_type="none") as handle:
                return pq.ParquetFile(handle).read_row_group(index, columns=None if column is None else [column],
                                                             use_threads=False)
        with self._opened(shard) as handle:
            offsets = self.listing.batch_offsets.get(shard)
            if offsets is not None:  # a stream: its batch read from its offset, not from the stream's start
                handle.seek(offsets[index])
                message = pa.ipc.read_message(handle if isinstance(handle, pa.NativeFile) else
                                              pa.PythonFile(handle, mode="r"))
                return pa.Table.from_batches([pa.ipc.read_record_batch(message, self.listing.schema)])
            reader = open_ipc(handle)
            if isinstance(reader, pa.ipc.RecordBatchFileReader):
                return pa.Table.from_batches([reader.get_batch(index)])
            return pa.Table.from_batches([next(b for position, b in enumerate(reader) if position == index)])


def make_cache_folder(folder: Path) -> None:
    """Create the shard cache ``folder``, refusing a path that is a file (or lies under one), naming the fix."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as error:
        raise NotADirectoryError(f"Shards' cache_dir should be a folder, but {str(folder)!r} is a file (or lies "
                                 f"under one); pass cache_dir=... naming a folder, or remove that file") from error
