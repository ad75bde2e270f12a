"""Compiled loops (numba) that write a padded ``[batch, width]`` int64 array in one pass.

A batch of token rows padded with numpy takes a dozen calls (a gather, a padding mask, masked writes, a copy
for the labels, a cast for the attention mask), each a C entry point of its own. In a training loop the step
in between evicts the caches, and each cold call then costs several microseconds before it touches the data:
on this project's 2-core machine those calls took 0.27-0.34 ms per batch of 64 rows after a matmul step, against
0.11-0.12 ms for these loops (``benchmarks/bench_loader_stages.py``). Each function is compiled on its first call
for the dtypes it meets, cached on disk (``cache=True``), and releases the GIL while it runs (``nogil``), so
the thread loader's work overlaps the step.

Row ``r`` keeps ``kept[r]`` elements, at the start of the row (right padding) or at its end (``left``); every
other position holds the pad value. Callers check the arguments (spans inside ``values``, ``kept <= width``).
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(nogil=True, cache=True)
def pad_spans(values: np.ndarray, starts: np.ndarray, kept: np.ndarray, left: bool, pad_value: int,
              out: np.ndarray) -> int:
    """Row ``r`` of ``out`` = ``values[starts[r]:starts[r] + kept[r]]``, padded with ``pad_value``.

    The rows of a shuffled batch lie far apart in a large buffer, each a cache and TLB miss. A first pass reads
    both ends of every row, so those misses are in flight together rather than one at a time behind each row's
    copy (20% less time per batch on random rows of a 28 MB buffer); what it read is returned only so that the
    pass is not optimized away.
    """
    rows, width = out.shape
    touched = 0
    for r in range(rows):
        if kept[r] > 0:
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
    return touched


@numba.njit(nogil=True, cache=True)
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


@numba.njit(nogil=True, cache=True)
def write_mask(kept: np.ndarray, left: bool, out: np.ndarray) -> None:
    """``out`` = 1 at kept positions and 0 at padding (an attention mask)."""
    rows, width = out.shape
    for r in range(rows):
        count = kept[r]
        at = width - count if left else 0
        for j in range(width):
            out[r, j] = 1 if at <= j < at + count else 0
