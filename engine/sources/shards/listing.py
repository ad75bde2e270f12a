"""Shards of a corpus, named once: Parquet or Arrow IPC files in a local folder or in object storage.

:class:`Shards` is what a user gives (a URL or path, or a list of them, with the ``storage_options`` of the
store); :func:`list_shards` turns it into a :class:`ShardListing`: every file with its size and version (ETag, or
for local files a hash of the content's ends) and every row group with its row count, read from the footers alone
(no row is read). The listing is a few arrays of one entry per row group, so the parent's state does not
grow with the number of rows, and its fingerprint names the corpus in a saved state.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter, OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.core.checks import check_int
from engine.sources.shards import ipc_index, tars
from engine.sources.shards.filesystems import filesystem, keep_models
from engine.sources.shards.object_stores import ArrowStore

SHARD_SUFFIXES = {".parquet": "parquet", ".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow", ".tar": "tar"}
"""The file kinds a shard may be, by suffix: Parquet, Arrow IPC (the file or the stream format), or a WebDataset
tar (:mod:`engine.sources.shards.tars`)."""

URL_SCHEMES = ("s3://", "gs://", "gcs://", "az://", "abfs://", "abfss://", "hf://", "file://", "memory://",
               "http://", "https://")
"""URL schemes read through ``fsspec`` (each needs its fsspec backend: s3fs, gcsfs, adlfs, huggingface_hub)."""


def is_url(value: Any) -> bool:
    """Whether ``value`` is a string that names object storage (``s3://...``) rather than a local path."""
    return isinstance(value, str) and value.lower().startswith(URL_SCHEMES)


def is_shard_data(value: Any) -> bool:
    """Whether data given to a module is a sharded corpus: a :class:`Shards` or a URL in object storage."""
    return isinstance(value, Shards) or is_url(value)


TAR_INDEXES: OrderedDict[tuple[str, str], tars.TarIndex] = OrderedDict()
"""``{(path, version): tar index}`` of the last :data:`KEPT_FOOTERS` tars this process indexed: listing a tar again
(another data module over the same corpus) reads none of its headers again."""


@dataclass(frozen=True)
class Shards:
    """A sharded corpus to stream: a folder or prefix, a glob, or a list of Parquet / Arrow IPC files or WebDataset
    tars, local or in object storage, read a row group at a time through a local cache.

    Args:
        urls: A local path or a URL (``s3://bucket/corpus/``, ``gs://...``, ``az://...``, ``hf://...``), a glob
            (``s3://bucket/corpus/*.parquet``), or a list of files. A folder or prefix is searched recursively;
            files are read in the order of their names.
        storage_options: The store's options, as ``s3fs`` and ``fsspec`` take them (``key``, ``secret``,
            ``client_kwargs={"endpoint_url": ...}``, ``anon``); credentials from the environment are used when not
            given. ``s3://``, ``gs://`` and ``az://`` are read through pyarrow's clients when every option has an
            equivalent there, else through s3fs, gcsfs or adlfs (``docs/sharded_data.md``).
        cache_dir: Folder of the local cache of fetched row groups (Arrow IPC files that every loader worker
            memory-maps); None: ``<HF_DATASETS_CACHE>/universal_datamodule/shards``.
        cache_bytes: The byte budget of that cache; the least recently used row groups are removed past it. It
            should hold a shuffle window's row groups for every loader worker.
        shuffle_window: Rows shuffled together: an epoch visits the row groups in a seeded order and shuffles rows
            within windows of this many rows (``docs/sharded_data.md`` measures how close that is to a full
            shuffle).
        retries: Attempts of a row group's fetch after a transient failure (HTTP 5xx, throttling, a dropped
            connection), with exponential backoff starting at ``retry_wait`` seconds.

    Example:
        >>> Shards("s3://my-bucket/corpus/", storage_options={"anon": True}).shuffle_window
        16384
    """

    urls: str | os.PathLike | Sequence[str | os.PathLike]
    storage_options: dict[str, Any] | None = None
    cache_dir: str | os.PathLike | None = None
    cache_bytes: int = 4 * 2**30
    shuffle_window: int = 16384
    retries: int = 5
    retry_wait: float = 0.2

    def __post_init__(self) -> None:
        urls = self.urls if isinstance(self.urls, (list, tuple)) else [self.urls]
        if not urls or not all(isinstance(url, (str, os.PathLike)) for url in urls):
            raise TypeError(f"Shards' urls should be a path or URL, or a non-empty list of them, but got "
                            f"urls={self.urls!r:.80}")
        if self.storage_options is not None and not isinstance(self.storage_options, dict):
            raise TypeError(f"storage_options should be a dict of fsspec options, but got "
                            f"{type(self.storage_options).__name__}")
        check_int("cache_bytes", self.cache_bytes, minimum=1)
        check_int("shuffle_window", self.shuffle_window, minimum=1)
        check_int("retries", self.retries, minimum=0)
        if self.cache_dir is not None and os.path.exists(self.cache_dir) and not os.path.isdir(self.cache_dir):
            raise NotADirectoryError(f"Shards' cache_dir should be a folder, but cache_dir="
                                     f"{os.fspath(self.cache_dir)!r} is a file; name a folder (it is created if "
                                     f"missing), or remove that file")
        if not isinstance(self.retry_wait, (int, float)) or self.retry_wait < 0:
            raise ValueError(f"retry_wait should be a non-negative number of seconds, but got "
                             f"retry_wait={self.retry_wait!r}")

    @property
    def url_list(self) -> list[str]:
        urls = self.urls if isinstance(self.urls, (list, tuple)) else [self.urls]
        return [os.fspath(url) for url in urls]


@dataclass
class ShardListing:
    """Every shard of a corpus and every row group, as listed once (in the parent; workers receive it pickled).

    ``group_start[g]`` is the corpus index of row group ``g``'s first row (one entry more than there are groups),
    ``group_shard[g]`` its shard and ``group_index[g]`` its number within the shard.
    """

    shards: Shards
    files: list[str]
    kinds: list[str]
    versions: list[str]
    sizes: list[int]
    group_shard: np.ndarray
    group_index: np.ndarray
    group_start: np.ndarray
    schema: Any
    protocol: str = "file"
    _fingerprint: str | None = field(default=None, repr=False)
    batch_offsets: dict[int, list[int]] = field(default_factory=dict, repr=False)
    """``{shard: offset of each record batch}`` of the Arrow IPC shards in the stream format (which has no footer to
    find a batch by), so a row group is read from its offset, not from the stream's start."""
    tar_indexes: dict[int, tars.TarIndex] = field(default_factory=dict, repr=False)
    """``{shard: where each sample's members lie}`` of WebDataset tar shards (:mod:`engine.sources.shards.tars`)."""
    damaged: dict[int, str] = field(default_factory=dict, repr=False)
    """``{corpus row: why it cannot be read}``: tar samples with a member cut short, refused when a batch reads them
    (named, or left out with ``on_error='skip'``)."""

    @property
    def num_rows(self) -> int:
        return int(self.group_start[-1])

    @property
    def num_groups(self) -> int:
        return len(self.group_shard)

    def group_rows(self) -> np.ndarray:
        return np.diff(self.group_start)

    def fingerprint(self) -> str:
        """A hash of the files, their versions and their row groups: other data, or data changed, differ."""
        if self._fingerprint is None:
            digest = hashlib.blake2b(digest_size=12)
            for name, version in zip(self.files, self.versions):
                digest.update(f"{name}\x00{version}\x00".encode())
            digest.update(self.group_start.tobytes())
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    def url(self, shard: int) -> str:
        """Shard ``shard``'s file as the user would write it (with its scheme), for errors."""
        name = self.files[shard]
        return name if self.protocol == "file" or "://" in name else f"{self.protocol}://{name}"


def named_error(error: BaseException, message: str) -> Exception:
    """An exception of ``error``'s own type whose text is ``message`` and ``error``'s, so ``except OSError`` (or
    ``PermissionError``) still works; an ``OSError`` when that type takes other arguments (botocore's)."""
    text = f"{message} ({type(error).__name__}: {error})"
    try:
        return type(error)(text)
    except Exception:
        return OSError(text)


def _kind(path: str) -> str | None:
    return SHARD_SUFFIXES.get(os.path.splitext(path)[1].lower())


IGNORED_PREFIXES = (".", "_")
"""Names skipped below a folder or glob, as ``pyarrow.dataset`` skips them (its ``ignore_prefixes`` default): hidden
files and the leftovers of Spark, Ray and Hadoop writers (``_temporary/``, ``_SUCCESS``, ``_committed_*``)."""


def _skipped(match: str, base: str) -> bool:
    """Whether ``match``, found below ``base`` (the folder searched, or a glob's fixed part), has a name below it
    starting with one of :data:`IGNORED_PREFIXES`. A file named as such is never skipped."""
    base = base.rstrip("/")
    relative = match[len(base):] if base and match.startswith(base + "/") else ""
    return any(part.startswith(IGNORED_PREFIXES) for part in relative.split("/") if part)


def _glob_base(path: str) -> str:
    """The folders of a glob before its first wildcard (``bucket/corpus`` of ``bucket/corpus/*/part-*.parquet``)."""
    parts = path.split("/")
    fixed = next(i for i, part in enumerate(parts) if any(char in part for char in "*?["))
    return "/".join(parts[:fixed])


def _expand(system: Any, paths: list[str], urls: list[str]) -> list[str]:
    """The shard files that ``paths`` name: files as given, globs expanded, folders searched, in name order.
    Below a folder or glob, names starting with ``.`` or ``_`` are skipped (:data:`IGNORED_PREFIXES`); a file
    named twice (a folder and a file in it) is refused."""
    found: list[str] = []
    for path, url in zip(paths, urls):
        pattern = any(char in path for char in "*?[")
        matches = sorted(system.glob(path) if pattern else system.find(path))  # find: a folder's files, or the file
        if not matches and not pattern and not system.exists(path):
            raise FileNotFoundError(f"no such file or folder: {url!r}; Shards should name Parquet or Arrow files, a "
                                    f"folder or prefix holding them, or a glob")
        base = _glob_base(path) if pattern else path
        kept = [match for match in matches if not _skipped(match, base)]
        files = [match for match in kept if _kind(match)]
        if not files:
            others = sorted({os.path.splitext(match)[1] or match for match in kept})[:5]
            skipped = len(matches) - len(kept)
            raise ValueError(f"{url!r} holds no shard: Shards read {', '.join(SHARD_SUFFIXES)} files, but found "
                             f"{others or 'nothing'}" + (f" (and skipped {skipped} file(s) whose names below it "
                                                          f"start with '.' or '_', as pyarrow.dataset does)"
                                                          if skipped else "")
                             + "; write the corpus as Parquet (dataset.to_parquet, df.to_parquet, ray's "
                               "write_parquet)")
        found.extend(files)
    if len(set(found)) < len(found):
        twice = next(file for file, count in Counter(found).items() if count > 1)
        raise ValueError(f"the shard {twice!r} is named twice by Shards' urls {urls[:6]} (a folder and a file in it, "
                         f"or two globs that match it): its rows would be read twice; name each file once")
    kinds = {_kind(path) for path in found}
    if len(kinds) > 1:
        raise ValueError(f"Shards should be of one kind, but got {' and '.join(sorted(kinds))} files (e.g. "
                         f"{found[0]!r} "
                         f"and {next(p for p in found if _kind(p) != _kind(found[0]))!r}); keep one kind")
    return found


FOOTERS: OrderedDict[tuple[str, str], Any] = OrderedDict()
"""``{(path, version): Parquet footer}`` of the last :data:`KEPT_FOOTERS` shards this process listed: loader
workers forked from it read their row groups without reading those footers again."""

KEPT_FOOTERS = 64


def _read_footer(system: Any, path: str, kind: str, url: str = "") -> tuple[list[int], Any, int, str, Any]:
    """``(row counts of the row groups, schema, size, version, record batch offsets)`` of one shard, reading its
    footer only (an Arrow IPC file's footer and batches' metadata; a stream's messages' metadata, whose record
    batches' offsets are returned; None for other shards). A tar's headers are read instead (its data skipped), and
    its :class:`~engine.sources.shards.tars.TarIndex` is returned in place of the offsets."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with system.open(path, "rb") as handle:
        info = opened_info(system, path, handle)
        size, version = int(info.get("size") or 0), file_version(info, handle)
        if kind == "tar":
            index = TAR_INDEXES.get((path, version))
            if index is None:
                handle.seek(0)
                index = tars.index_tar(handle, size, url or path)
                TAR_INDEXES[(path, version)] = index
                while len(TAR_INDEXES) > KEPT_FOOTERS:
                    TAR_INDEXES.popitem(last=False)
            return index.group_rows(), tars.tar_schema([index]), size, version, index
        if kind == "parquet":
            metadata = pq.ParquetFile(handle).metadata
            FOOTERS[(path, version)] = metadata
            while len(FOOTERS) > KEPT_FOOTERS:
                FOOTERS.popitem(last=False)
            rows = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
            return rows, metadata.schema.to_arrow_schema(), size, version, None
        reader = open_ipc(handle)
        if isinstance(reader, pa.ipc.RecordBatchFileReader):
            counted = ipc_index.file_rows(handle, size)
            if counted is None or len(counted) != reader.num_record_batches:  # not as the format says: read them
                counted = [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
            return counted, reader.schema, size, version, None
        index = ipc_index.stream_index(handle)
        if index is None:  # dictionary batches: the batches are read in order, from the start
            handle.seek(0)
            return [batch.num_rows for batch in open_ipc(handle)], reader.schema, size, version, None
        return index[0], reader.schema, size, version, index[1]


def opened_info(system: Any, path: str, handle: Any) -> dict[str, Any]:
    """The info of ``path``, open as ``handle``: from the headers its opening read where the handle keeps them
    (pyarrow's S3 files as ``metadata()``, fsspec's buffered files as ``details``), else the filesystem's (a local
    file's stat). One request fewer per shard opened in object storage."""
    if isinstance(system, ArrowStore):
        return system.opened_info(path, handle)
    details = getattr(handle, "details", None)
    return details if isinstance(details, dict) and details.get("size") is not None else system.info(path)


def open_ipc(handle: Any) -> Any:
    """An Arrow IPC reader of ``handle``: the file format, else the stream format (what ``datasets`` writes)."""
    import pyarrow as pa

    try:
        return pa.ipc.open_file(handle)
    except pa.ArrowInvalid:
        handle.seek(0)
        return pa.ipc.open_stream(handle)


def file_version(info: dict[str, Any], handle: Any = None) -> str:
    """What changes when a file is replaced: its generation (GCS) or ETag in object storage; else (a local file)
    its size and a hash of its end and start (:func:`content_digest`), read from ``handle``. Not its modification
    time: ``cp -p`` and ``rsync -a`` keep it over new content, and a copy on another machine has another one."""
    for key in ("generation", "ETag", "etag", "md5Hash", "version_id", "VersionId"):
        if info.get(key):
            return str(info[key]).strip('"')
    if handle is None:
        return f"{info.get('size')}:{info.get('mtime') or info.get('LastModified') or info.get('last_modified')}"
    return f"{info.get('size')}:{content_digest(handle, int(info.get('size') or 0))}"


EDGE_BYTES = 64 * 2**10
"""Bytes hashed at each end of a file without an ETag, beyond a Parquet footer (:func:`content_digest`)."""


def content_digest(handle: Any, size: int) -> str:
    """A hash of a file's content that is cheap to read: a Parquet file's whole footer (the metadata, whose row
    groups' offsets, sizes and column statistics change with the data) and its last and first 64 KiB; an Arrow IPC
    file's last and first 64 KiB (its footer, its schema and the edges of its data). ``handle`` is left at 0."""
    digest = hashlib.blake2b(digest_size=10)
    tail = min(size, EDGE_BYTES)
    handle.seek(size - tail)
    end = handle.read(tail)
    digest.update(end)
    if end[-4:] == b"PAR1" and len(end) >= 8:  # the footer's length precedes the magic
        footer = int.from_bytes(end[-8:-4], "little") + 8
        if tail < footer <= size:
            handle.seek(size - footer)
            digest.update(handle.read(footer - tail))
    handle.seek(0)
    digest.update(handle.read(min(size - tail, EDGE_BYTES)))
    handle.seek(0)
    return digest.hexdigest()


def list_shards(shards: Shards) -> ShardListing:
    """Name every shard and row group of ``shards``: footers are read in parallel threads, no row is read.

    Raises:
        FileNotFoundError: a path or URL that names nothing.
        ValueError: no shard file found, shards of two kinds, a shard with no rows, or shards whose columns differ.
    """
    try:
        system, paths = filesystem(shards)
        files = _expand(system, paths, shards.url_list)
    except (FileNotFoundError, ValueError, ImportError, TypeError):  # named already, with the fix
        raise
    except Exception as error:
        raise named_error(error, f"listing {shards.url_list[:4]} failed: check the URL, the store's credentials "
                                 f"and permissions and its endpoint (storage_options), and the network; a store "
                                 f"that does not answer fails after its timeouts (config_kwargs connect_timeout, "
                                 f"read_timeout)") from error
    kinds = [_kind(path) or "parquet" for path in files]
    protocol = system.protocol if isinstance(system.protocol, str) else system.protocol[0]

    def footer(path: str, kind: str) -> tuple[list[int], Any, int, str, list[int] | None]:
        import pyarrow as pa

        url = path if protocol == "file" or "://" in path else f"{protocol}://{path}"
        try:
            return _read_footer(system, path, kind, url)
        except FileNotFoundError as error:
            raise FileNotFoundError(f"shard {url!r} was listed but could not be opened ({error}); the corpus "
                                    f"changed while it was listed: list it again") from error
        except (pa.ArrowInvalid, OSError) as error:
            if not isinstance(error, pa.ArrowInvalid) and "thrift" not in str(error).lower():
                raise named_error(error, f"reading the footer of shard {url!r} failed: check the store's "
                                         f"credentials and permissions, and the network") from error
            # no Parquet or Arrow IPC file (ArrowInvalid), or a damaged footer (Parquet's: "Couldn't deserialize
            # thrift", an OSError)
            kinds_text = "Parquet" if kind == "parquet" else "Arrow IPC"
            raise ValueError(f"shard {url!r} is not a readable {kinds_text} file ({type(error).__name__}: {error}); "
                             f"its footer is damaged or it is another kind of file with a {kinds_text} name: "
                             f"rewrite it, or move it out of the corpus") from error
        except Exception as error:
            raise named_error(error, f"reading the footer of shard {url!r} failed: check the store's credentials "
                                     f"and permissions, and the network") from error

    with ThreadPoolExecutor(max_workers=min(16, len(files))) as pool:
        footers = list(pool.map(lambda item: footer(*item), zip(files, kinds)))
    keep_models(system)
    indexes = {shard: footer[4] for shard, footer in enumerate(footers) if kinds[shard] == "tar"}
    schema = tars.tar_schema(list(indexes.values())) if indexes else footers[0][1]
    for path, (_, other, _, _, _) in zip(files, footers if not indexes else []):  # tars: their columns' union
        if not other.equals(schema):
            raise ValueError(f"every shard should have the columns of the first ({files[0]!r}: "
                             f"{', '.join(f'{f.name}: {f.type}' for f in schema)}), but {path!r} has "
                             f"{', '.join(f'{f.name}: {f.type}' for f in other)}; write the shards with one schema")
    group_shard, group_index, counts, damaged = [], [], [], {}
    for shard, (rows, _, _, _, _) in enumerate(footers):
        if shard in indexes:
            first = sum(counts)
            damaged.update({first + row: why for row, why in indexes[shard].damaged.items()})
        for index, count in enumerate(rows):
            if count:
                group_shard.append(shard)
                group_index.append(index)
                counts.append(count)
    if not counts:
        raise ValueError(f"the shards of {shards.url_list[0]!r} hold 0 rows; give at least one row")
    return ShardListing(
        shards=shards, files=files, kinds=kinds, versions=[footer[3] for footer in footers],
        sizes=[footer[2] for footer in footers], group_shard=np.asarray(group_shard, dtype=np.int32),
        group_index=np.asarray(group_index, dtype=np.int32),
        group_start=np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]), schema=schema, protocol=protocol,
        batch_offsets={shard: footer[4] for shard, footer in enumerate(footers)
                       if footer[4] is not None and shard not in indexes},
        tar_indexes=indexes, damaged=damaged)
