"""Compiled loops (numba) that write a padded ``[batch, width]`` int64 array in one pass.

A batch of token rows padded with numpy takes a dozen calls (a gather, a padding mask, masked writes, a copy
for the labels, a cast for the attention mask), each a C entry point of its own. In a training loop the step
in between evicts the caches, and each cold call then costs several microseconds before it touches the data.
With these loops the median ``next()`` of a ``num_workers=0`` loader right after a matmul step fell from 0.44 to
0.35 ms for 64 token rows (A/B in docs/performance.md). Each function is compiled on its first call for the
dtypes it meets (about 0.4 s), cached on disk (``cache=True``), and releases the GIL while it runs (``nogil``),
so the thread loader's work overlaps the step.

Row ``r`` keeps ``kept[r]`` elements, at the start of the row (right padding) or at its end (``left``); every
other position holds the pad value; ``kept <= width`` (the padding layout's kept lengths).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numba
import numpy as np


def compiled(function: Callable[..., Any]) -> Any:
    """``numba.njit(nogil=True, cache=True)(function)``. Where numba finds no writable place for its disk cache
    (neither beside this module nor in the user's cache folder, as in a read-only container) it says so, and the
    loops are compiled in every process instead (about 1 s at the first batch)."""
    try:
        return numba.njit(nogil=True, cache=True)(function)
    except RuntimeError as error:
        if "no locator available" not in str(error):
            raise
        warnings.warn(f"{error}: the padding loops will be compiled in every process (about 1 s at its first batch); "
                      f"set NUMBA_CACHE_DIR to a writable folder to compile them once", stacklevel=2)
        return numba.njit(nogil=True)(function)


@compiled
def pad_spans(values: np.ndarray, starts: np.ndarray, kept: np.ndarray, left: bool, pad_value: int,
              out: np.ndarray) -> tuple[int, int]:
    """Row ``r`` of ``out`` = ``values[starts[r]:starts[r] + kept[r]]``, padded with ``pad_value``.

    Returns ``(-1, _)``, or ``(r, _)`` for the first row whose span leaves ``values`` (nothing is then read or
    written). The rows of a shuffled batch lie far apart in a large buffer, each a cache and TLB miss: a first
    pass reads both ends of every row, so those misses are in flight together rather than one at a time behind
    each row's copy (20% less time per batch on random rows of a 28 MB buffer). What it read is the second
    value returned, only so that the pass is not optimized away.
    """
    rows, width = out.shape
    touched = 0
    for r in range(rows):
        if kept[r] > 0:
            if starts[r] < 0 or starts[r] + kept[r] > len(values):
                return r, touched
            touched ^= np.int64(values[starts[r]]) ^ np.int64(values[starts[r] + kept[r] - 1])
    for r in range(rows):
        count, start = kept[r], starts[r]
        at = width - count if left else 0
        for j in range(at):
            out[r, j] = pad_value
        for j in range(count):
            out[r, at + j] = values[start + j]
        for j in range(at + count, width):
            out[r, j] = pad_value
    return -1, touched


@compiled
def repad_rows(source: np.ndarray, kept: np.ndarray, left: bool, pad_value: int, out: np.ndarray) -> None:
    """``out`` = ``source`` (both padded the same way), with ``pad_value`` at every padded position."""
    rows, width = out.shape
    for r in range(rows):
        count = kept[r]
        at = width - count if left else 0
        for j in range(at):
            out[r, j] = pad_value
        for j in range(at, at + count):
            out[r, j] = source[r, j]
        for j in range(at + count, width):
            out[r, j] = pad_value


@compiled
def write_mask(kept: np.ndarray, left: bool, out: np.ndarray) -> None:
    """``out`` = 1 at kept positions and 0 at padding (an attention mask)."""
    rows, width = out.shape
    for r in range(rows):
        count = kept[r]
        at = width - count if left else 0
        for j in range(width):
            out[r, j] = 1 if at <= j < at + count else 0
