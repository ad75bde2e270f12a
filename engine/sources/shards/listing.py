"""Shards of a corpus, named once: Parquet or Arrow IPC files in a local folder or in object storage.

:class:`Shards` is what a user gives (a URL or path, or a list of them, with the ``storage_options`` of the
store); :func:`list_shards` turns it into a :class:`ShardListing`: every file with its size and version (ETag, or
size and modification time for local files) and every row group with its row count, read from the Parquet footers
alone (no row is read). The listing is a few arrays of one entry per row group, so the parent's state does not
grow with the number of rows, and its fingerprint names the corpus in a saved state.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.core.checks import check_int
from engine.sources.shards.object_stores import ArrowStore, adlfs_only, arrow_store, gcsfs_only, s3fs_only

SHARD_SUFFIXES = {".parquet": "parquet", ".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow"}
"""The file kinds a shard may be, by suffix: Parquet, or Arrow IPC (the file or the stream format)."""

URL_SCHEMES = ("s3://", "gs://", "gcs://", "az://", "abfs://", "abfss://", "hf://", "file://", "memory://",
               "http://", "https://")
"""URL schemes read through ``fsspec`` (each needs its fsspec backend: s3fs, gcsfs, adlfs, huggingface_hub)."""


def is_url(value: Any) -> bool:
    """Whether ``value`` is a string that names object storage (``s3://...``) rather than a local path."""
    return isinstance(value, str) and value.lower().startswith(URL_SCHEMES)


def is_shard_data(value: Any) -> bool:
    """Whether data given to a module is a sharded corpus: a :class:`Shards` or a URL in object storage."""
    return isinstance(value, Shards) or is_url(value)


@dataclass(frozen=True)
class Shards:
    """A sharded corpus to stream: a folder or prefix, a glob, or a list of Parquet / Arrow IPC files, local or in
    object storage, read a row group at a time through a local cache.

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


def filesystem(shards: Shards, *, own_retries: bool = False) -> tuple[Any, list[str]]:
    """``(filesystem, paths)`` of ``shards``' URLs (one store for all of them): ``s3://``, ``gs://``, ``az://`` through
    pyarrow's own clients (:func:`~engine.sources.shards.object_stores.arrow_store`) when every storage option has an
    equivalent there, else through ``fsspec`` (s3fs, gcsfs, adlfs, ...).

    ``own_retries``: a filesystem of its own (not fsspec's shared instance) that makes each request once, for a
    caller that retries and counts attempts itself (the client would otherwise retry some errors unseen)."""
    import fsspec

    store = arrow_store(shards.url_list, shards.storage_options, own_retries=own_retries)
    if store is not None:
        return store
    options = dict(shards.storage_options or {}, **({"skip_instance_cache": True} if own_retries else {}))
    systems, paths = [], []
    for url in shards.url_list:
        try:
            system, path = fsspec.core.url_to_fs(url, **options)
        except ImportError as error:
            scheme = url.split("://", 1)[0].lower()
            needs = {"s3": ("S3", s3fs_only, "s3fs: pip install 'universal-datamodule[s3]'"),
                     "gs": ("GCS", gcsfs_only, "gcsfs: pip install gcsfs"),
                     "gcs": ("GCS", gcsfs_only, "gcsfs: pip install gcsfs"),
                     "az": ("Azure", adlfs_only, "adlfs: pip install adlfs"),
                     "abfs": ("Azure", adlfs_only, "adlfs: pip install adlfs")}.get(scheme)
            raise ImportError(f"reading {url!r} needs fsspec's backend for its scheme ({error})" + (
                f": storage options {needs[1](shards.storage_options)} have no equivalent in pyarrow's {needs[0]} "
                f"client, so they need {needs[2]}, or leave them out" if needs else "")) from error
        systems.append(system)
        paths.append(path)
    if len({type(system) for system in systems}) > 1:
        raise ValueError(f"Shards' urls should all be in one store, but got {shards.url_list[:4]}")
    if own_retries and isinstance(getattr(systems[0], "retries", None), int):
        systems[0].retries = 1  # s3fs counts attempts: one, no retry of its own
    _share_models(systems[0])
    return systems[0], paths


_MODELS: dict[str, Any] = {}
"""``{"loader": botocore's data loader}`` of the first S3 client this process connected (inherited by the loader
workers it forks): the service models it parsed, which a new session would parse again."""


def _share_models(system: Any) -> None:
    """Give an s3fs filesystem that has no session yet one whose service models come from :data:`_MODELS`: each
    reader's filesystem (one per process, the loader workers' included) then connects without parsing them again,
    on the way to its first fetch. Other filesystems, or no models yet, are left as they are."""
    loader = _MODELS.get("loader")
    if loader is None or getattr(system, "session", False) is not None or not isinstance(
            getattr(system, "kwargs", None), dict):
        return
    from aiobotocore.session import AioSession

    session = AioSession(**system.kwargs)  # as s3fs makes its own
    session.register_component("data_loader", loader)
    system.session = session


def _keep_models(system: Any) -> None:
    """Keep the data loader of ``system``'s session (an s3fs filesystem that has connected) in :data:`_MODELS`."""
    session = getattr(system, "session", None)
    if "loader" not in _MODELS and hasattr(session, "get_component"):
        _MODELS["loader"] = session.get_component("data_loader")


def _kind(path: str) -> str | None:
    return SHARD_SUFFIXES.get(os.path.splitext(path)[1].lower())


def _expand(system: Any, paths: list[str], urls: list[str]) -> list[str]:
    """The shard files that ``paths`` name: files as given, globs expanded, folders searched, in name order."""
    found: list[str] = []
    for path, url in zip(paths, urls):
        pattern = any(char in path for char in "*?[")
        matches = sorted(system.glob(path) if pattern else system.find(path))  # find: a folder's files, or the file
        if not matches and not pattern and not system.exists(path):
            raise FileNotFoundError(f"no such file or folder: {url!r}; Shards should name Parquet or Arrow files, a "
                                    f"folder or prefix holding them, or a glob")
        files = [match for match in matches if _kind(match)]
        if not files:
            others = sorted({os.path.splitext(match)[1] or match for match in matches})[:5]
            raise ValueError(f"{url!r} holds no shard: Shards read {', '.join(SHARD_SUFFIXES)} files, but found "
                             f"{others or 'nothing'}; write the corpus as Parquet (dataset.to_parquet, "
                             f"df.to_parquet, ray's write_parquet)")
        found.extend(files)
    kinds = {_kind(path) for path in found}
    if len(kinds) > 1:
        raise ValueError(f"Shards should be of one kind, but got both Parquet and Arrow files (e.g. {found[0]!r} "
                         f"and {next(p for p in found if _kind(p) != _kind(found[0]))!r}); keep one kind")
    return found


FOOTERS: OrderedDict[tuple[str, str], Any] = OrderedDict()
"""``{(path, version): Parquet footer}`` of the last :data:`KEPT_FOOTERS` shards this process listed: loader
workers forked from it read their row groups without reading those footers again."""

KEPT_FOOTERS = 64


def _read_footer(system: Any, path: str, kind: str) -> tuple[list[int], Any, int, str]:
    """``(row counts of the row groups, schema, size, version)`` of one shard, reading its footer only."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with system.open(path, "rb") as handle:
        info = opened_info(system, path, handle)
        size, version = int(info.get("size") or 0), file_version(info)
        if kind == "parquet":
            metadata = pq.ParquetFile(handle).metadata
            FOOTERS[(path, version)] = metadata
            while len(FOOTERS) > KEPT_FOOTERS:
                FOOTERS.popitem(last=False)
            rows = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
            return rows, metadata.schema.to_arrow_schema(), size, version
        reader = open_ipc(handle)
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)] if isinstance(
            reader, pa.ipc.RecordBatchFileReader) else list(reader)
        return [batch.num_rows for batch in batches], reader.schema, size, version


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


def file_version(info: dict[str, Any]) -> str:
    """What changes when a file is replaced: its generation (GCS) or ETag in object storage, else its size and
    modification time."""
    for key in ("generation", "ETag", "etag", "md5Hash", "version_id", "VersionId"):
        if info.get(key):
            return str(info[key]).strip('"')
    return f"{info.get('size')}:{info.get('mtime') or info.get('LastModified') or info.get('last_modified')}"


def list_shards(shards: Shards) -> ShardListing:
    """Name every shard and row group of ``shards``: footers are read in parallel threads, no row is read.

    Raises:
        FileNotFoundError: a path or URL that names nothing.
        ValueError: no shard file found, shards of two kinds, a shard with no rows, or shards whose columns differ.
    """
    system, paths = filesystem(shards)
    files = _expand(system, paths, shards.url_list)
    kinds = [_kind(path) or "parquet" for path in files]
    with ThreadPoolExecutor(max_workers=min(16, len(files))) as pool:
        footers = list(pool.map(lambda item: _read_footer(system, *item), zip(files, kinds)))
    _keep_models(system)
    protocol = system.protocol if isinstance(system.protocol, str) else system.protocol[0]
    schema = footers[0][1]
    for path, (_, other, _, _) in zip(files, footers):
        if not other.equals(schema):
            raise ValueError(f"every shard should have the columns of the first ({files[0]!r}: "
                             f"{', '.join(f'{f.name}: {f.type}' for f in schema)}), but {path!r} has "
                             f"{', '.join(f'{f.name}: {f.type}' for f in other)}; write the shards with one schema")
    group_shard, group_index, counts = [], [], []
    for shard, (rows, _, _, _) in enumerate(footers):
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
        group_start=np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]), schema=schema, protocol=protocol)
