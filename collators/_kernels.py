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

Loading the loops (importing numba, then each loop from its disk cache, or compiling it when the cache is empty)
takes about a second in a fresh process, and several when it compiles. A loader worker never loads them: it runs
each loop's numpy twin instead (:class:`KernelLoop`; the same values: integer copies, and float32 operations in
the same order), a handful of numpy calls that cost tens of microseconds more per batch. Loading them in every
worker would cost each one numba's import (about 100 MiB of private memory) and, before the parent forks them,
would hold the first batch back by that second. A worker forked from a process that has loaded them
(:func:`load`, called by :func:`collators.text.warm_token_loops`, or by any loop's first call outside a worker)
inherits them, shared.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from collators.compiled import Loop, compiled

INT64_MAX, INT64_MIN = 2**63 - 1, -2**63
NOT_WRITTEN = np.empty((0, 0), dtype=np.int64)
"""The ``mask`` or ``labels`` of :func:`pad_spans` that it does not write."""


class KernelLoop(Loop):
    """A :class:`~collators.compiled.Loop` of this module: loading one loads them all (:func:`load`)."""

    def __init__(self, function: Callable[..., Any], twin: Callable[..., Any]) -> None:
        super().__init__(function, twin)
        LOOPS.append(self)

    def load(self) -> Any:
        load()
        return self.dispatcher


LOOPS: list[KernelLoop] = []
"""The loops :func:`load` compiles, in the order of this module."""


def load() -> None:
    """Compile every loop (from numba's disk cache when it holds them) for the argument types of :func:`warm`,
    then let the loops use them. The inner loops that others call (:func:`_write_row`, :func:`_mask_row`) are
    registered with numba, so that the compiled loops call them compiled."""
    if all(loop.dispatcher is not None for loop in LOOPS):
        return
    from numba.extending import register_jitable

    for inner in (_write_row, _mask_row):
        register_jitable(inner)
    dispatchers = [compiled(loop.function) for loop in LOOPS]
    warm(*dispatchers)
    for loop, dispatcher in zip(LOOPS, dispatchers):
        loop.dispatcher = dispatcher


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


def _write_row(row: np.ndarray, at: int, kept_values: np.ndarray, pad_value: int) -> None:
    """``row`` = ``kept_values`` from position ``at``, ``pad_value`` elsewhere: three slice writes, which numba
    turns into memset- and memcpy-like loops, rather than one loop that writes and tracks the kept range element by
    element (:func:`pad_spans` finds the range in a loop of its own)."""
    end = at + len(kept_values)
    row[:at] = pad_value
    row[at:end] = kept_values
    row[end:] = pad_value


def _mask_row(row: np.ndarray, at: int, count: int) -> None:
    """A row of an attention mask: 1 at the ``count`` kept positions from ``at``, 0 at the padding."""
    row[:at] = 0
    row[at:at + count] = 1
    row[at + count:] = 0


def first_span_outside(size: int, starts: np.ndarray, lengths: np.ndarray) -> int:
    """The first row whose span ``[starts[r], starts[r] + lengths[r])`` is not inside ``[0, size)`` (a negative
    length counts as outside), or -1: one call where numpy takes three reductions and a sum."""
    for r in range(len(starts)):
        if lengths[r] < 0 or starts[r] < 0 or starts[r] + lengths[r] > size:
            return r
    return -1


def repad_rows(source: np.ndarray, kept: np.ndarray, left: bool, pad_value: int, out: np.ndarray) -> None:
    """``out`` = ``source`` (both padded the same way), with ``pad_value`` at every padded position."""
    rows, width = out.shape
    for r in range(rows):
        at = width - kept[r] if left else 0
        _write_row(out[r], at, source[r, at:at + kept[r]], pad_value)


def write_mask(kept: np.ndarray, left: bool, out: np.ndarray) -> None:
    """``out`` = 1 at kept positions and 0 at padding (an attention mask)."""
    rows, width = out.shape
    for r in range(rows):
        _mask_row(out[r], width - kept[r] if left else 0, kept[r])


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


def _kept_positions(kept: np.ndarray, left: bool, width: int) -> np.ndarray:
    """``[rows, width]`` bools: True at each row's ``kept[r]`` kept positions (its end when ``left``)."""
    positions = np.arange(width)
    return positions >= (width - kept)[:, None] if left else positions < kept[:, None]


def pad_spans_twin(values: np.ndarray, starts: np.ndarray, kept: np.ndarray, left: bool, pad_value: int,
                   out: np.ndarray, mask: np.ndarray, labels: np.ndarray, label_pad: int) -> tuple[int, int, int]:
    """:func:`pad_spans` in numpy: the kept values gathered by one flat index, written by a boolean mask (its True
    positions in row-major order are the rows' kept values in order); the same values, refusals and range."""
    rows, width = out.shape
    used = kept > 0
    outside = np.flatnonzero(used & ((starts < 0) | (starts + kept > len(values))))
    if len(outside):  # with the range of the rows before it, as the loop's first pass leaves it
        read = np.flatnonzero(used[:outside[0]])
        ends = np.concatenate([values[starts[read]], values[starts[read] + kept[read] - 1]]).astype(np.int64)
        return (int(outside[0]), int(ends.min()) if len(ends) else INT64_MAX,
                int(ends.max()) if len(ends) else INT64_MIN)
    total = int(kept.sum())
    index = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(kept) - kept - starts, kept)
    flat = values[index].astype(np.int64)
    keep = _kept_positions(kept, left, width)
    out.fill(pad_value)
    out[keep] = flat
    if rows and mask.shape[0] == rows:  # NOT_WRITTEN has no rows
        mask[...] = keep
    if rows and labels.shape[0] == rows:
        labels.fill(label_pad)
        labels[keep] = flat
    return -1, int(flat.min()) if total else INT64_MAX, int(flat.max()) if total else INT64_MIN


def first_span_outside_twin(size: int, starts: np.ndarray, lengths: np.ndarray) -> int:
    """:func:`first_span_outside` in numpy."""
    outside = np.flatnonzero((lengths < 0) | (starts < 0) | (starts + lengths > size))
    return int(outside[0]) if len(outside) else -1


def repad_rows_twin(source: np.ndarray, kept: np.ndarray, left: bool, pad_value: int, out: np.ndarray) -> None:
    """:func:`repad_rows` in numpy."""
    keep = _kept_positions(kept, left, out.shape[1])
    np.copyto(out, source, casting="unsafe", where=keep)
    out[~keep] = pad_value


def write_mask_twin(kept: np.ndarray, left: bool, out: np.ndarray) -> None:
    """:func:`write_mask` in numpy."""
    out[...] = _kept_positions(kept, left, out.shape[1])


def scale_normalize_twin(images: np.ndarray, scale: np.float32, mean: np.ndarray, std: np.ndarray,
                         out: np.ndarray) -> None:
    """:func:`scale_normalize` in numpy: the same float32 operations, one pass each."""
    np.multiply(images, scale, out=out, dtype=np.float32)
    out -= mean[None, :, None]
    out /= std[None, :, None]


pad_spans, first_span_outside, repad_rows, write_mask, scale_normalize = (
    KernelLoop(pad_spans, pad_spans_twin), KernelLoop(first_span_outside, first_span_outside_twin),
    KernelLoop(repad_rows, repad_rows_twin), KernelLoop(write_mask, write_mask_twin),
    KernelLoop(scale_normalize, scale_normalize_twin))

TOKEN_DTYPES = (np.int32, np.int64)
"""The dtypes of token values that :func:`warm` compiles the loops for (Arrow's list<int32> and list<int64>
columns, int64 tensors)."""


def warm(pad: Any, outside: Any, repad: Any, mask: Any, scale: Any) -> None:
    """Compile the loops given (``pad_spans``, ``first_span_outside``, ``repad_rows``, ``write_mask``,
    ``scale_normalize``, compiled) for the usual argument types: read-only and writable token values of
    :data:`TOKEN_DTYPES`, int64 starts, lengths and output; uint8 images to float32."""
    starts, kept, out = np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros((1, 1), np.int64)
    outside(0, starts, kept)
    mask(kept, False, out)
    repad(out, kept, False, 0, out)
    for dtype in TOKEN_DTYPES:
        for writable in (False, True):
            values = np.zeros(1, dtype)
            values.flags.writeable = writable
            pad(values, starts, kept, False, 0, out, out, out, 0)
    statistics = np.zeros(1, np.float32)
    scale(np.zeros((1, 1, 1), np.uint8), np.float32(1), statistics, statistics + 1, np.zeros((1, 1, 1), np.float32))
