"""Compiled loops (numba): a padded ``[batch, width]`` int64 array written in one pass, and a uint8 image batch
scaled and normalized in one pass.

A batch of token rows padded with numpy takes a dozen calls (a gather, a padding mask, masked writes, a copy
for the labels, a cast for the attention mask), each a C entry point of its own. In a training loop the code
runs cold after each step (on a shared machine time alone evicts it), and each cold call then costs several
microseconds before it touches the data.
With these loops a batch is one cold entry instead of a dozen (``benchmarks/bench_loader_stages.py`` times the
loader right after a step). Each function is compiled on its first call for the dtypes it meets (about 0.4 s),
cached on disk (``cache=True``), and releases the GIL while it runs (``nogil``), so the thread loader's work
overlaps the step.

Row ``r`` keeps ``kept[r]`` elements, at the start of the row (right padding) or at its end (``left``); every
other position holds the pad value; ``kept <= width`` (the padding layout's kept lengths).
"""

from __future__ import annotations

import numpy as np

from collators.compiled import compiled

INT64_MAX, INT64_MIN = 2**63 - 1, -2**63
NOT_WRITTEN = np.empty((0, 0), dtype=np.int64)
"""The ``mask`` or ``labels`` of :func:`pad_spans` that it does not write."""


@compiled
def pad_spans(values: np.ndarray, starts: np.ndarray, kept: np.ndarray, left: bool, pad_value: int,
              out: np.ndarray, mask: np.ndarray, labels: np.ndarray, label_pad: int) -> tuple[int, int, int]:
    """Row ``r`` of ``out`` = ``values[starts[r]:starts[r] + kept[r]]``, padded with ``pad_value``; in the same
    pass, when they have a row per row of ``out`` (else they are ``NOT_WRITTEN``), ``mask`` = the attention mask
    (1 at kept positions, 0 at padding) and ``labels`` = ``out`` with ``label_pad`` at padding (causal-LM labels).

    Returns ``(-1, low, high)``: the smallest and largest kept value (``(INT64_MAX, INT64_MIN)`` when none is
    kept), so a vocabulary check needs no pass of its own; or ``(r, _, _)`` for the first row whose span leaves
    ``values``, and then nothing is written. The rows of a shuffled batch lie far apart in a large buffer, each a
    cache and TLB miss: a first pass reads both ends of every row, so those misses are in flight together rather
    than one at a time behind each row's copy.
    """
    rows, width = out.shape
    low, high = np.int64(INT64_MAX), np.int64(INT64_MIN)
    for r in range(rows):
        if kept[r] > 0:
            if starts[r] < 0 or starts[r] + kept[r] > len(values):
                return r, low, high
            first, last = np.int64(values[starts[r]]), np.int64(values[starts[r] + kept[r] - 1])
            low, high = min(low, first, last), max(high, first, last)
    with_mask, with_labels = mask.shape[0] == rows, labels.shape[0] == rows
    for r in range(rows):
        count = kept[r]
        at = width - count if left else 0
        kept_values = values[starts[r]:starts[r] + count]
        for j in range(count):  # the range in a loop of its own, the copy as slice writes (see _write_row)
            value = np.int64(kept_values[j])
            low, high = min(low, value), max(high, value)
        _write_row(out[r], at, kept_values, pad_value)
        if with_mask:
            _mask_row(mask[r], at, count)
        if with_labels:
            _write_row(labels[r], at, kept_values, label_pad)
    return -1, low, high


@compiled
def _write_row(row: np.ndarray, at: int, kept_values: np.ndarray, pad_value: int) -> None:
    """``row`` = ``kept_values`` from position ``at``, ``pad_value`` elsewhere: three slice writes, which numba
    turns into memset- and memcpy-like loops, rather than one loop that writes and tracks the kept range element by
    element (:func:`pad_spans` finds the range in a loop of its own)."""
    end = at + len(kept_values)
    row[:at] = pad_value
    row[at:end] = kept_values
    row[end:] = pad_value


@compiled
def _mask_row(row: np.ndarray, at: int, count: int) -> None:
    """A row of an attention mask: 1 at the ``count`` kept positions from ``at``, 0 at the padding."""
    row[:at] = 0
    row[at:at + count] = 1
    row[at + count:] = 0


@compiled
def first_span_outside(size: int, starts: np.ndarray, lengths: np.ndarray) -> int:
    """The first row whose span ``[starts[r], starts[r] + lengths[r])`` is not inside ``[0, size)`` (a negative
    length counts as outside), or -1: one call where numpy takes three reductions and a sum."""
    for r in range(len(starts)):
        if lengths[r] < 0 or starts[r] < 0 or starts[r] + lengths[r] > size:
            return r
    return -1


@compiled
def repad_rows(source: np.ndarray, kept: np.ndarray, left: bool, pad_value: int, out: np.ndarray) -> None:
    """``out`` = ``source`` (both padded the same way), with ``pad_value`` at every padded position."""
    rows, width = out.shape
    for r in range(rows):
        at = width - kept[r] if left else 0
        _write_row(out[r], at, source[r, at:at + kept[r]], pad_value)


@compiled
def write_mask(kept: np.ndarray, left: bool, out: np.ndarray) -> None:
    """``out`` = 1 at kept positions and 0 at padding (an attention mask)."""
    rows, width = out.shape
    for r in range(rows):
        _mask_row(out[r], width - kept[r] if left else 0, kept[r])


@compiled
def scale_normalize(images: np.ndarray, scale: np.float32, mean: np.ndarray, std: np.ndarray,
                    out: np.ndarray) -> None:
    """``out[b, c, i] = (float32(images[b, c, i]) * scale - mean[c]) / std[c]`` over ``[batch, channels, pixels]``:
    torchvision's ``to_dtype(scale=True)`` then ``normalize``, the same float32 operations in the same order (so
    equal bit for bit), in one pass instead of four (a cast, a multiply, a subtract, a divide)."""
    batch, channels, pixels = images.shape
    for b in range(batch):
        for c in range(channels):
            shift, spread = mean[c], std[c]
            for i in range(pixels):
                out[b, c, i] = (np.float32(images[b, c, i]) * scale - shift) / spread


TOKEN_DTYPES = (np.int32, np.int64)
"""The dtypes of token values that :func:`warm_token_loops` compiles the loops for (Arrow's list<int32> and
list<int64> columns, int64 tensors)."""
