"""TextFileDataset: raw text documents (one per line, or one per file) as ``{'text': str}``, in any loading mode."""

from __future__ import annotations

import codecs
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.datasets.base import DEFAULT_BLOCK_ROWS, DEFAULT_CACHE_BYTES, FileDataset
from engine.datasets.modes import LoadingMode
from engine.datasets.streaming import StreamingMixin

__all__ = ["StreamingTextFileDataset", "TextFileDataset"]

_SCAN_BYTES = 8 * 2**20
"""Bytes scanned at a time when indexing lines, so indexing a large file needs little memory."""
_WHITESPACE = np.frombuffer(b" \t\n\r\x0b\x0c", dtype=np.uint8)
_UNITS = ("line", "file")


class TextFileDataset(FileDataset):
    """Documents from text files, as ``{'text': str}`` rows for the text collator (raw text + tokenizer).

    With ``unit='line'`` each line is a document: construction scans the files once for line offsets (held as
    numpy arrays, so a worker copies no Python object per line) and a read seeks straight to the lines asked
    for. The line ending (``\\n`` or ``\\r\\n``) is not part of the text. With ``unit='file'`` each file is one
    document, read whole, line endings as in the file (no newline translation).

    Blank lines: with ``skip_blank=True`` (the default) lines, or with ``unit='file'`` files, that are empty or
    hold only whitespace are not documents (so row ``i`` is the ``i``-th non-blank line); ``skip_blank=False``
    keeps them as rows (``''`` for an empty line), so row ``i`` is line ``i``. Text is returned as in the file,
    other whitespace included.

    Args:
        paths_or_dir: A text file, a folder (its files ending in ``extensions``, recursively, sorted by path), or a
            sequence of files (read in the order given).
        mode: A :class:`LoadingMode` (or its name); STREAMING returns a :class:`StreamingTextFileDataset`.
        unit: ``'line'`` or ``'file'``: what one document is.
        skip_blank: Leave out blank (empty or whitespace-only) documents; see above.
        encoding: The files' encoding; must encode ``'\\n'`` as the byte 10 (UTF-8, Latin-1, ASCII, ...).
        extensions: File endings taken from a folder, case-insensitive.
        cache_bytes: CACHED mode's byte budget per process.
        block_rows: STREAMING's rows per block.

    Raises:
        FileNotFoundError: A path does not exist.
        ValueError: No text files, no documents, or an invalid argument; a document that is not valid
            ``encoding`` (named by file and byte offset) when it is read.

    Example:
        >>> ds = TextFileDataset("corpus/", unit="line")  # doctest: +SKIP
        >>> ds[0]  # doctest: +SKIP
        {'text': 'the first line'}
    """

    def __init__(
        self,
        paths_or_dir: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        mode: LoadingMode | str = LoadingMode.LAZY,
        unit: str = "line",
        skip_blank: bool = True,
        encoding: str = "utf-8",
        extensions: Sequence[str] = (".txt",),
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        block_rows: int = DEFAULT_BLOCK_ROWS,
    ) -> None:
        if unit not in _UNITS:
            raise ValueError(f"unit should be 'line' (a document per line) or 'file' (per file), but got unit={unit!r}")
        codecs.lookup(encoding)  # an unknown encoding raises LookupError naming it
        if "\n".encode(encoding) != b"\n":
            raise ValueError(f"encoding={encoding!r} does not write '\\n' as one byte 10, so lines cannot be found "
                             f"by byte offset; convert the files to UTF-8")
        self.unit, self.skip_blank, self.encoding = unit, bool(skip_blank), encoding
        self.paths = _text_files(paths_or_dir, tuple(ext.lower() for ext in extensions))
        spans = [_file_spans(path, unit, self.skip_blank) for path in self.paths]
        self._file_ids = np.concatenate([np.full(len(s), i, dtype=np.int32) for i, s in enumerate(spans)])
        self._spans = np.concatenate(spans).reshape(-1, 2)
        if len(self._spans) == 0:
            blank = "blank " if self.skip_blank else ""
            raise ValueError(f"the text files hold only {blank}documents, so the dataset would be empty: "
                             f"{[str(p) for p in self.paths[:5]]}{' ...' if len(self.paths) > 5 else ''}")
        self._init_mode(len(self._spans), mode, cache_bytes, block_rows)

    def _decode(self, data: bytes, index: int) -> str:
        try:
            return data.decode(self.encoding)
        except UnicodeDecodeError as error:
            path, start = self.paths[self._file_ids[index]], int(self._spans[index, 0])
            raise ValueError(f"{str(path)!r}: the document at byte {start} is not valid {self.encoding} "
                             f"({error.reason}); pass encoding=... matching the file") from None

    def _read_rows(self, indices: np.ndarray) -> list[dict[str, str]]:
        if len(indices) == 0:
            return []
        texts: list[Any] = [None] * len(indices)
        order = np.argsort(indices, kind="stable")  # file order: one open per file, forward reads
        files = self._file_ids[indices[order]]
        for group in np.split(order, np.flatnonzero(np.diff(files)) + 1):
            wanted = indices[group]
            spans = self._spans[wanted]
            with open(self.paths[self._file_ids[wanted[0]]], "rb") as file:
                first, last = int(spans[0, 0]), int(spans[-1, 1])
                if last - first <= 2 * int((spans[:, 1] - spans[:, 0]).sum()) + 65536:  # one read covers them
                    file.seek(first)
                    data = file.read(last - first)
                    chunks = [data[s - first:e - first] for s, e in spans.tolist()]
                else:
                    chunks = []
                    for start, stop in spans.tolist():
                        file.seek(start)
                        chunks.append(file.read(stop - start))
            for position, index, chunk in zip(group.tolist(), wanted.tolist(), chunks):
                texts[position] = self._decode(chunk, index)
        return [{"text": text} for text in texts]

    def _cache_rows(self, indices: np.ndarray, rows: list[dict[str, str]]) -> None:
        if codecs.lookup(self.encoding).name not in ("utf-8", "ascii"):
            super()._cache_rows(indices, rows)
            return
        # A document decoded from UTF-8 (or ASCII) bytes re-encodes to those bytes, so its byte span is its size.
        spans = self._spans[indices]
        self.cache.put_many(list(zip(indices.tolist(), rows)), (spans[:, 1] - spans[:, 0]).tolist())

    def _load_all(self) -> None:
        lengths = self._spans[:, 1] - self._spans[:, 0]
        self._offsets = np.concatenate([[0], np.cumsum(lengths)])
        self._buffer = np.empty(int(self._offsets[-1]), dtype=np.uint8)
        for file_id, path in enumerate(self.paths):
            rows = np.flatnonzero(self._file_ids == file_id)
            if len(rows) == 0:
                continue
            data = np.fromfile(path, dtype=np.uint8)
            for row, (start, stop) in zip(rows.tolist(), self._spans[rows].tolist()):
                self._buffer[self._offsets[row]:self._offsets[row + 1]] = data[start:stop]

    def _memory_rows(self, indices: np.ndarray) -> list[dict[str, str]]:
        buffer, offsets = self._buffer, self._offsets
        return [{"text": self._decode(buffer[offsets[i]:offsets[i + 1]].tobytes(), i)} for i in indices.tolist()]

    def _describe(self) -> str:
        return f"{len(self.paths)} file(s), unit={self.unit!r}"


def _text_files(paths_or_dir: Any, extensions: tuple[str, ...]) -> list[Path]:
    if isinstance(paths_or_dir, (str, os.PathLike)):
        root = Path(paths_or_dir)
        if root.is_dir():
            paths = sorted(path for path in root.rglob("*") if path.is_file() and path.suffix.lower() in extensions
                           and not any(part.startswith(".") for part in path.relative_to(root).parts))
            if not paths:
                raise ValueError(f"{str(root)!r} holds no files ending in {extensions}; pass extensions=... or files")
            return paths
        candidates = [root]
    else:
        candidates = [Path(path) for path in paths_or_dir]
        if not candidates:
            raise ValueError("paths_or_dir is an empty sequence; give at least one text file")
    for path in candidates:
        if not path.is_file():
            raise FileNotFoundError(f"text file not found: {str(path)!r}")
    return candidates


def _file_spans(path: Path, unit: str, skip_blank: bool) -> np.ndarray:
    """``[n, 2]`` int64 byte ranges (end exclusive, line ending left out) of the documents in one file."""
    size = path.stat().st_size
    if unit == "file":
        blank = skip_blank and (size == 0 or not np.isin(np.fromfile(path, dtype=np.uint8), _WHITESPACE,
                                                          invert=True).any())
        return np.zeros((0, 2), dtype=np.int64) if blank else np.array([[0, size]], dtype=np.int64)
    newlines, carriage, solid = [], [], []  # "\n" positions; whether "\r" precedes each; non-blank bytes before
    total, previous = 0, 0  # the byte before the file: not "\r"
    with open(path, "rb") as file:
        for offset in range(0, size, _SCAN_BYTES):
            chunk = np.frombuffer(file.read(_SCAN_BYTES), dtype=np.uint8)
            found = np.flatnonzero(chunk == 10)
            cumulative = np.cumsum(np.isin(chunk, _WHITESPACE, invert=True), dtype=np.int64)
            newlines.append(found + offset)
            carriage.append(np.where(found > 0, chunk[np.maximum(found - 1, 0)], previous) == 13)
            solid.append(cumulative[found] + total)
            total, previous = total + int(cumulative[-1]), int(chunk[-1])
    empty = np.zeros(0, dtype=np.int64)
    breaks = np.concatenate([*newlines, empty])
    starts = np.concatenate([[0], breaks + 1])
    ends = np.concatenate([breaks - np.concatenate([*carriage, empty]), [size]])
    solid_in_line = np.diff(np.concatenate([[0], *solid, [total]]))
    if starts[-1] == size:  # the file ends with a newline (or is empty): no line after the last one
        starts, ends, solid_in_line = starts[:-1], ends[:-1], solid_in_line[:-1]
    keep = solid_in_line > 0 if skip_blank else np.ones(len(starts), dtype=bool)
    return np.stack([starts[keep], ends[keep]], axis=1).astype(np.int64)


class StreamingTextFileDataset(StreamingMixin, TextFileDataset):
    """:class:`TextFileDataset` with ``mode=STREAMING``: an ``IterableDataset`` reading each block of documents in
    one forward read, in file order, each document once across workers and ranks."""


TextFileDataset._streaming_class = StreamingTextFileDataset
