"""Index arithmetic behind :class:`collators._padding.PaddingLayout`: which positions of a padded row are real,
and where each row lies in a flat buffer.

All of it is numpy on small index arrays (one entry per row or per position), made once where it can be.
"""

from __future__ import annotations

import functools

import numpy as np


@functools.lru_cache(maxsize=64)
def positions_of(width: int) -> np.ndarray:
    """``arange(width)`` as int64, made once per width (read-only: it is shared)."""
    positions = np.arange(width, dtype=np.int64)
    positions.flags.writeable = False
    return positions


_MASK_TABLE_WIDTH = 1024


@functools.lru_cache(maxsize=1)
def _mask_tables() -> tuple[np.ndarray, np.ndarray]:
    """Row ``k`` of the first table is True at positions ``< k`` of ``_MASK_TABLE_WIDTH``; the second is the first
    with its columns reversed (True at the last ``k`` positions). Made once per process (2 MiB)."""
    width = _MASK_TABLE_WIDTH
    prefixes = np.arange(width)[None, :] < np.arange(width + 1)[:, None]
    return prefixes, np.ascontiguousarray(prefixes[:, ::-1])


def row_masks(kept: np.ndarray, width: int, padding_side: str) -> np.ndarray:
    """Boolean ``[rows, width]``, True at the ``kept[i]`` first (right padding) or last (left padding) positions
    of row ``i``: rows of a precomputed table for widths up to 1024 (one row copy, no comparison per position)."""
    if width > _MASK_TABLE_WIDTH:
        positions = positions_of(width)
        return positions < kept[:, None] if padding_side == "right" else positions >= (width - kept)[:, None]
    prefixes, suffixes = _mask_tables()
    return prefixes[kept, :width] if padding_side == "right" else suffixes[kept, _MASK_TABLE_WIDTH - width:]


def span_index(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The flat index of the spans ``[start, start + length)`` one after the other, and their offsets in it
    (one entry more than spans): ``values[index]`` concatenates the spans, with no per-span Python."""
    offsets = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return np.arange(offsets[-1], dtype=np.int64) + np.repeat(starts - offsets[:-1], lengths), offsets
