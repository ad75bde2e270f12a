"""WebDataset tar shards: each tar's members indexed once, so a sample is read by its index like a Parquet row.

A WebDataset tar (as ``webdataset``'s ``TarWriter`` and ``img2dataset`` write it) holds samples as consecutive
members that share a key: ``000017.jpg``, ``000017.txt``, ``000017.json``. The key is a member's path up to the
first dot of its base name, its extension the rest (``webdataset``'s own rule), and consecutive members with one key
make one sample. :func:`index_tar` walks the tar's headers once with :mod:`tarfile` (each member's data is skipped,
not read) and keeps where each member's data lies; the listing holds that index, so workers read a chunk of
:data:`TAR_GROUP_ROWS` samples as one ranged read, and the shard source serves them by index: seeded shuffles,
exact and elastic resume and every worker count hold as for Parquet. :func:`group_table` turns a chunk's bytes into
the Arrow table the local cache keeps (images stay encoded: decoding is the collator's, in the loader's workers).

A member's extension names its column (:data:`TAR_COLUMNS`): an image (``jpg``, ``png``, ``webp``, ...) is
``image`` (its encoded bytes), ``txt`` is ``text`` (a string), ``json`` is ``json`` (its text), ``cls`` is ``label``
(an integer); any other extension is a column of its own name holding the member's bytes. Every row also has
``__key__``.
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

TAR_GROUP_ROWS = 64
"""Samples of a tar read together (one ranged read) and cached as one row group."""

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm")
"""Member extensions read as the sample's ``image`` (compared lowercased)."""

TAR_COLUMNS = {**{extension: "image" for extension in IMAGE_EXTENSIONS}, "txt": "text", "json": "json",
               "cls": "label"}
"""The column of a member by its extension; another extension is a column of its own name (the member's bytes)."""

KEY = "__key__"
"""The column of each sample's key, as ``webdataset`` names it."""


def split_name(name: str) -> tuple[str, str]:
    """``(key, extension)`` of a member path: the path up to the first dot of its base name, and the rest
    (``a/b/0001.seg.png`` -> ``("a/b/0001", "seg.png")``), as ``webdataset`` groups members."""
    folder, _, base = name.rpartition("/")
    stem, dot, extension = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), (extension if dot else "")


def column_of(extension: str) -> str:
    """The column a member with ``extension`` fills (:data:`TAR_COLUMNS`)."""
    return TAR_COLUMNS.get(extension.lower(), extension)


def column_type(column: str) -> Any:
    import pyarrow as pa

    return {"text": pa.string(), "json": pa.string(), "label": pa.int64(), KEY: pa.string()}.get(column, pa.binary())


@dataclass
class TarIndex:
    """Where each sample of one tar lies: ``keys[i]`` is sample ``i``'s key; ``members[column]`` its member's
    ``(data offset, size)`` pairs, ``-1`` where the sample has none; ``damaged[i]`` says why a sample cannot be read
    whole (a member cut short by the tar's end)."""

    keys: list[str]
    members: dict[str, np.ndarray]
    extensions: dict[str, set[str]] = field(default_factory=dict)
    damaged: dict[int, str] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return len(self.keys)

    def group_rows(self) -> list[int]:
        """The row count of each of the tar's row groups (chunks of :data:`TAR_GROUP_ROWS` samples)."""
        return [min(TAR_GROUP_ROWS, self.rows - start) for start in range(0, self.rows, TAR_GROUP_ROWS)]

    def byte_range(self, group: int) -> tuple[int, int]:
        """``(start, end)`` of the bytes holding row group ``group``'s members (0, 0 when it has none)."""
        first, last = group * TAR_GROUP_ROWS, min((group + 1) * TAR_GROUP_ROWS, self.rows)
        spans = np.concatenate([pairs[first:last] for pairs in self.members.values()]) if self.members else None
        spans = spans[spans[:, 0] >= 0] if spans is not None else None
        if spans is None or not len(spans):
            return 0, 0
        return int(spans[:, 0].min()), int((spans[:, 0] + spans[:, 1]).max())


READ_AHEAD = 8 * 2**20
"""Bytes each read of a tar's headers fetches: a tar is walked in a few large reads, not a request per member."""


class _ReadAhead(io.RawIOBase):
    """A file read in blocks of :data:`READ_AHEAD` bytes from where a read starts: the small reads of ``tarfile``'s
    walk through the headers become a few ranged requests to object storage."""

    def __init__(self, handle: Any, size: int) -> None:
        super().__init__()
        self._handle, self._size, self._at = handle, size, 0
        self._start, self._block = 0, b""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self._at = offset + (0, self._at, self._size)[whence]
        return self._at

    def tell(self) -> int:
        return self._at

    def read(self, count: int = -1) -> bytes:
        count = self._size - self._at if count is None or count < 0 else min(count, self._size - self._at)
        if count <= 0:
            return b""
        if not (self._start <= self._at and self._at + count <= self._start + len(self._block)):
            self._handle.seek(self._at)
            self._start, self._block = self._at, self._handle.read(max(count, READ_AHEAD))
        data = self._block[self._at - self._start:self._at - self._start + count]
        self._at += len(data)
        return bytes(data)


def index_tar(handle: Any, size: int, url: str) -> TarIndex:
    """Index the tar open as ``handle`` (``size`` bytes): its members' headers are read, their data skipped.

    Raises:
        ValueError: the file is no tar, or a sample holds two members of one column (``0001.jpg`` and
            ``0001.png``, or one name twice), which would make its row ambiguous.
    """
    keys: list[str] = []
    spans: dict[str, list[tuple[int, int, int]]] = {}
    extensions: dict[str, set[str]] = {}
    damaged: dict[int, str] = {}
    seen: set[str] = set()
    try:
        archive = tarfile.open(fileobj=_ReadAhead(handle, size), mode="r:")  # noqa: SIM115 - closed below
    except tarfile.TarError as error:
        raise ValueError(f"shard {url!r} is not a readable tar file ({type(error).__name__}: {error}); write "
                         f"WebDataset shards with webdataset.TarWriter or img2dataset, or move it out of the "
                         f"corpus") from error
    with archive:
        for member in _members(archive, url):
            if not member.isfile():
                continue
            key, extension = split_name(member.name)
            if not extension or (key.startswith("__") and "/" not in key):  # webdataset skips these too
                continue
            if not keys or keys[-1] != key:
                keys.append(key)
                seen = set()
            column = column_of(extension)
            if column in seen:
                raise ValueError(f"sample {key!r} of shard {url!r} holds two members for its {column!r} column "
                                 f"(the second is {member.name!r}); give each sample one member per column (one "
                                 f"image, one .txt)")
            seen.add(column)
            extensions.setdefault(column, set()).add(extension.lower())
            spans.setdefault(column, []).append((len(keys) - 1, member.offset_data, member.size))
            if member.offset_data + member.size > size:
                missing = member.offset_data + member.size - size
                damaged.setdefault(len(keys) - 1, f"member {member.name!r} of sample {key!r} in shard {url!r} is cut "
                                                  f"short: it should hold {member.size} bytes, but the tar ends "
                                                  f"{missing} bytes before its end; rewrite the shard, or pass "
                                                  f"on_error='skip' to leave the sample out")
    members = {}
    for column, found in spans.items():
        pairs = np.full((len(keys), 2), -1, dtype=np.int64)
        rows = np.asarray([row for row, _, _ in found], dtype=np.int64)
        pairs[rows, 0] = [offset for _, offset, _ in found]
        pairs[rows, 1] = [length for _, _, length in found]
        members[column] = pairs
    return TarIndex(keys, members, extensions, damaged)


def _members(archive: tarfile.TarFile, url: str) -> Any:
    """The members of ``archive`` in order, up to the end of the file: a tar cut short ends at its last header
    (the member cut short by its end is found by its size, and refused when a batch reads its sample)."""
    while True:
        try:
            member = archive.next()
        except tarfile.ReadError as error:  # the end of the data, past a member cut short
            if not archive.members:
                raise ValueError(f"shard {url!r} is not a readable tar file ({error}); write WebDataset shards "
                                 f"with webdataset.TarWriter or img2dataset, or move it out of the corpus") from error
            return
        if member is None:
            return
        yield member


def tar_schema(indexes: list[TarIndex]) -> Any:
    """The columns of tars with these indexes: ``__key__`` then every column any of them holds, in name order."""
    import pyarrow as pa

    columns = sorted(set().union(*(index.members for index in indexes)))
    return pa.schema([pa.field(KEY, pa.string())] + [pa.field(name, column_type(name)) for name in columns])


def group_table(index: TarIndex, group: int, data: bytes, start: int, schema: Any, url: str) -> Any:
    """Row group ``group`` of a tar as an Arrow table of ``schema``, from ``data``: the tar's bytes from ``start``.
    A member cut short (a damaged sample, which the source refuses to serve) is null.

    Raises:
        ValueError: a ``txt`` or ``json`` member that is not UTF-8, or a ``cls`` member that is not an integer.
    """
    import pyarrow as pa

    first, last = group * TAR_GROUP_ROWS, min((group + 1) * TAR_GROUP_ROWS, index.rows)
    columns: dict[str, Any] = {KEY: pa.array(index.keys[first:last], pa.string())}
    for name in schema.names[1:]:
        pairs = index.members.get(name)
        values: list[Any] = []
        for row in range(first, last):
            offset, length = (int(pairs[row, 0]), int(pairs[row, 1])) if pairs is not None else (-1, -1)
            if offset < 0 or row in index.damaged:
                values.append(None)
                continue
            raw = data[offset - start:offset - start + length]
            values.append(_value(name, raw, index.keys[row], url))
        columns[name] = pa.array(values, column_type(name))
    return pa.table(columns, schema=schema)


def _value(column: str, raw: bytes, key: str, url: str) -> Any:
    try:
        if column in ("text", "json"):
            return raw.decode("utf-8")
        if column == "label":
            return int(raw.decode("utf-8").strip())
    except ValueError as error:
        raise ValueError(f"the {column!r} member of sample {key!r} in shard {url!r} cannot be read as "
                         f"{'an integer' if column == 'label' else 'UTF-8 text'} ({error}); rewrite that sample, or "
                         f"remove it from the shard") from error
    return raw
