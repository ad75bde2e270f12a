"""Compiled copies (numba) of token spans into a batch's buffer: what a mixed batch's columns are gathered with.

A mixed batch's token rows come from several sources' buffers; the collator pads from one. Copying each row's
span with numpy takes a flat index as long as the batch's tokens (an ``arange``, a ``repeat``, a gather), whose
temporaries cost more than the copy itself; these loops copy each span straight to its place. Where every source
holds its rows as spans of one buffer in memory, :func:`gather_spans` reads a whole batch in one call. A loader
worker runs their numpy twins (a slice copy per row) unless it inherited them compiled
(:class:`collators.compiled.Loop`).
"""

from __future__ import annotations

import numpy as np

from collators.compiled import Loop


def copy_spans(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray, out: np.ndarray,
               at: np.ndarray) -> None:
    """``out[at[r]:at[r] + lengths[r]] = values[starts[r]:starts[r] + lengths[r]]`` for every row ``r``."""
    for r in range(len(starts)):
        out[at[r]:at[r] + lengths[r]] = values[starts[r]:starts[r] + lengths[r]]


def gather_spans(rows: np.ndarray, offsets: np.ndarray, buffers: tuple[np.ndarray, ...], starts: np.ndarray,
                 lengths: np.ndarray, users: np.ndarray
                 ) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rows ``rows`` of sources laid end to end (source ``s`` holds rows ``offsets[s]:offsets[s + 1]``, row
    ``r`` being ``buffers[s][starts[r]:starts[r] + lengths[r]]``), copied into one buffer in their order.

    Returns ``(bad, buffer, at, counts, which, user)``: row ``i`` is ``buffer[at[i]:at[i] + counts[i]]``, from
    source ``which[i]``, the user's row ``user[i]``; ``bad`` is the place of the first row out of range (nothing
    copied), or -1.
    """
    size, end = len(rows), offsets[-1]
    which = np.empty(size, dtype=np.int64)
    at = np.empty(size, dtype=np.int64)
    counts = np.empty(size, dtype=np.int64)
    user = np.empty(size, dtype=np.int64)
    total = 0
    for i in range(size):
        row = rows[i]
        if row < 0 or row >= end:
            return i, buffers[0][:0].copy(), at, counts, which, user
        source = 0
        while offsets[source + 1] <= row:
            source += 1
        which[i], at[i], counts[i], user[i] = source, total, lengths[row], users[row]
        total += lengths[row]
    out = np.empty(total, dtype=buffers[0].dtype)
    for i in range(size):
        row, place = rows[i], at[i]
        values = buffers[which[i]]
        start = starts[row]
        out[place:place + counts[i]] = values[start:start + counts[i]]
    return -1, out, at, counts, which, user


def copy_spans_twin(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray, out: np.ndarray,
                    at: np.ndarray) -> None:
    """:func:`copy_spans` in numpy: a slice copy per row."""
    for start, length, place in zip(starts.tolist(), lengths.tolist(), at.tolist()):
        out[place:place + length] = values[start:start + length]


def gather_spans_twin(rows: np.ndarray, offsets: np.ndarray, buffers: tuple[np.ndarray, ...], starts: np.ndarray,
                      lengths: np.ndarray, users: np.ndarray
                      ) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`gather_spans` in numpy: the sources found by one search, a slice copy per row."""
    outside = np.flatnonzero((rows < 0) | (rows >= offsets[-1]))
    if len(outside):
        nothing = np.empty(len(rows), dtype=np.int64)
        return int(outside[0]), buffers[0][:0].copy(), nothing, nothing, nothing, nothing
    which = np.searchsorted(offsets, rows, side="right").astype(np.int64) - 1
    counts = lengths[rows].astype(np.int64)
    at = np.cumsum(counts) - counts
    out = np.empty(int(counts.sum()), dtype=buffers[0].dtype)
    for source, start, count, place in zip(which.tolist(), starts[rows].tolist(), counts.tolist(), at.tolist()):
        out[place:place + count] = buffers[source][start:start + count]
    return -1, out, at, counts, which, users[rows].astype(np.int64)


copy_spans, gather_spans = Loop(copy_spans, copy_spans_twin), Loop(gather_spans, gather_spans_twin)
