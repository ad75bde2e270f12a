"""The row counts (and, for the stream format, the offsets) of an Arrow IPC shard's record batches, read from the
messages' metadata alone: no batch's body is read.

The file format's footer lists every record batch's block (offset, metadata length, body length) but not its row
count, which is in the batch's own metadata message; pyarrow gives it only by reading the whole batch. So the footer
and each batch's metadata (a few hundred bytes) are read here, and parsed as the flatbuffers they are (``Footer``,
``Message``, ``RecordBatch`` of the Arrow format, ``format/File.fbs`` and ``Message.fbs``). The stream format has no
footer: its messages are walked one after another, each body skipped, and each record batch's offset kept, so a row
group is read from its offset rather than from the stream's start.
"""

from __future__ import annotations

from typing import Any

CONTINUATION = b"\xff\xff\xff\xff"
MAGIC = b"ARROW1"
DICTIONARY_BATCH, RECORD_BATCH = 2, 3
"""``MessageHeader`` union types of the Arrow format."""


def _int(data: bytes, at: int, size: int, signed: bool = False) -> int:
    return int.from_bytes(data[at:at + size], "little", signed=signed)


def _field(data: bytes, table: int, index: int) -> int | None:
    """The position of field ``index`` of the flatbuffer table at ``table``, or None when it is absent."""
    vtable = table - _int(data, table, 4, signed=True)
    slot = 4 + 2 * index
    if slot >= _int(data, vtable, 2):
        return None
    offset = _int(data, vtable + slot, 2)
    return table + offset if offset else None


def _message(metadata: bytes) -> tuple[int, int, int]:
    """``(header type, body length, rows)`` of an IPC ``Message`` flatbuffer (rows: -1 unless a record batch)."""
    root = _int(metadata, 0, 4)
    kind_at, header_at, body_at = _field(metadata, root, 1), _field(metadata, root, 2), _field(metadata, root, 3)
    kind = metadata[kind_at] if kind_at is not None else 0
    body = _int(metadata, body_at, 8, signed=True) if body_at is not None else 0
    rows = -1
    if kind == RECORD_BATCH and header_at is not None:
        header = header_at + _int(metadata, header_at, 4)
        length_at = _field(metadata, header, 0)
        rows = _int(metadata, length_at, 8, signed=True) if length_at is not None else 0
    return kind, body, rows


def _unprefixed(data: bytes) -> bytes:
    """A message's flatbuffer without its prefix (continuation marker and length, or the length alone)."""
    return data[8:] if data[:4] == CONTINUATION else data[4:]


def file_rows(handle: Any, size: int) -> list[int] | None:
    """The row count of each record batch of an Arrow IPC file (the file format), from its footer and each batch's
    metadata; None when ``handle`` holds no such file (the stream format)."""
    if size < 10 + len(MAGIC):
        return None
    handle.seek(size - 10)
    tail = handle.read(10)
    if tail[4:] != MAGIC:
        return None
    length = _int(tail, 0, 4, signed=True)
    handle.seek(size - 10 - length)
    footer = handle.read(length)
    root = _int(footer, 0, 4)
    batches_at = _field(footer, root, 3)
    if batches_at is None:
        return []
    vector = batches_at + _int(footer, batches_at, 4)
    rows = []
    for number in range(_int(footer, vector, 4)):
        block = vector + 4 + 24 * number  # struct Block { offset: long; metaDataLength: int; bodyLength: long }
        handle.seek(_int(footer, block, 8, signed=True))
        rows.append(_message(_unprefixed(handle.read(_int(footer, block + 8, 4, signed=True))))[2])
    return rows


def stream_index(handle: Any) -> tuple[list[int], list[int]] | None:
    """``(rows, offsets)`` of each record batch of an Arrow IPC stream, walking its messages' metadata and skipping
    their bodies; None when it holds dictionary batches (whose batches need the dictionaries read before them)."""
    rows, offsets, position = [], [], 0
    while True:
        handle.seek(position)
        first = handle.read(4)
        prefix = 8 if first == CONTINUATION else 4
        length = _int(handle.read(4), 0, 4, signed=True) if prefix == 8 else _int(first, 0, 4, signed=True)
        if len(first) < 4 or length <= 0:  # the end of the stream (a zero length), or of the file
            return rows, offsets
        kind, body, count = _message(handle.read(length))
        if kind == DICTIONARY_BATCH:
            return None
        if kind == RECORD_BATCH:
            rows.append(count)
            offsets.append(position)
        position += prefix + length + body
