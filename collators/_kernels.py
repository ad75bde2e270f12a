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
takes about a second in a fresh process, and several when it compiles. A loader worker does not wait for it: its
first batches run the same loops as Python (the same values: integer copies, and float32 operations in the same
order) while a thread of its own loads them from the disk cache (:func:`loaded`), started once its first batch is
done (:func:`collators.compiled.hold_loading`); a forked worker whose parent had loaded them inherits them (and
shares their memory: the loader loads them before forking workers when numba's disk cache holds them,
:func:`cached`). A worker never compiles them: compiling costs seconds of CPU and tens of MiB of private memory in
every worker, and a short-lived worker on a busy machine is stopped before it finishes, so the cache would stay
incomplete run after run. While the cache lacks them, a worker runs the Python loops, and one process of the lowest
CPU priority compiles them into the cache (:func:`fill_cache_soon`, started by the loader that forks the workers);
the loaders after it load them before forking. Any other process loads them at its first call.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import get_worker_info

from collators.compiled import after_first_batch, compiled

INT64_MAX, INT64_MIN = 2**63 - 1, -2**63
NOT_WRITTEN = np.empty((0, 0), dtype=np.int64)
"""The ``mask`` or ``labels`` of :func:`pad_spans` that it does not write."""


class Loop:
    """One loop of this module: its compiled form where this process has loaded it (:func:`loaded`), else the
    Python function itself (a loader worker's first batches, while a thread loads them)."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function
        self.dispatcher: Any = None
        self.__doc__, self.__name__ = function.__doc__, function.__name__
        LOOPS.append(self)

    def __call__(self, *args: Any) -> Any:
        dispatcher = self.dispatcher
        if dispatcher is None and loaded():
            dispatcher = self.dispatcher
        return (self.function if dispatcher is None else dispatcher)(*args)


LOOPS: list[Loop] = []
"""The loops :func:`load` compiles, in the order of this module."""
_LOADING: dict[int, threading.Thread] = {}
"""``{pid: thread}``: the thread loading the loops in loader worker ``pid``."""
_FAILURES: list[BaseException] = []
"""What that thread raised; :func:`loaded` raises it again in the worker's own thread."""
_PYTHON_ONLY: set[int] = set()
"""Loader workers (pids) that found numba's disk cache without the loops: they run the Python loops."""
_FILLERS: dict[int, subprocess.Popen] = {}
"""``{pid: process}``: the process compiling the loops into the disk cache that process ``pid`` started."""
FILL = "import os; os.nice(19); from collators._kernels import load; load()"
"""What :func:`fill_cache_soon`'s process runs."""


def loaded() -> bool:
    """Whether this process runs the compiled loops. Outside loader workers they are loaded here, on the first
    call. A loader worker that has not inherited them starts loading them from numba's disk cache in a thread of its
    own (once), after its first batch when the loader holds the loading (:func:`collators.compiled.hold_loading`),
    and runs the Python loops meanwhile; a failure of that thread is raised by the next call. A worker whose first
    call finds the cache without them runs the Python loops for its life (it compiles nothing)."""
    if _ready():
        return True
    if get_worker_info() is None:
        load()
        return True
    pid = os.getpid()
    if pid in _PYTHON_ONLY:
        return False
    if pid not in _LOADING and not cached():
        _PYTHON_ONLY.add(pid)
        return False
    if not after_first_batch(load_soon):
        load_soon()
    return False


def fill_cache_soon() -> bool:
    """Start one process, at the lowest CPU priority, that compiles the loops into numba's disk cache, unless the
    cache holds them or this process started one already; returns whether it started. A loader calls it before
    forking workers that would otherwise find no loops to load (:func:`loaded`): the loaders after it load them
    from the cache. The process's messages (numba's warning where it finds no writable cache) go to this one's
    stderr; it ends when the loops are compiled."""
    running = _FILLERS.get(os.getpid())
    if cached() or (running is not None and running.poll() is None):
        return False
    package_root = str(Path(os.path.abspath(__file__)).parents[1])
    path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    _FILLERS[os.getpid()] = subprocess.Popen([sys.executable, "-c", FILL], env={**os.environ, "PYTHONPATH": path},
                                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return True


def _ready() -> bool:
    return all(loop.dispatcher is not None for loop in LOOPS)


def load_soon() -> None:
    """Start :func:`load` in a thread of this process (once); raise what it raised, if it failed. Nothing may fork
    this process before :func:`load` has waited for it: a forked child would inherit numba's locks as the thread
    holds them."""
    if _FAILURES:
        raise RuntimeError("loading the compiled loops (collators._kernels, numba) failed in this process; the "
                           "error above says why") from _FAILURES[0]
    if not _ready() and os.getpid() not in _LOADING:
        _LOADING[os.getpid()] = thread = threading.Thread(target=_load_noting_failure, name="load-loops",
                                                          daemon=True)
        thread.start()


def load() -> None:
    """Compile every loop (from numba's disk cache when it holds them) for the argument types of :func:`warm`,
    then let the loops use them; waits for a loading that :func:`load_soon` started. The inner loops that others
    call (:func:`_write_row`, :func:`_mask_row`) are registered with numba, so that the compiled loops call them
    compiled and the Python ones as Python."""
    thread = _LOADING.get(os.getpid())
    if thread is not None:
        thread.join()
        load_soon()  # raises what the thread raised
    _load_now()


def _load_now() -> None:
    if _ready():
        return
    from numba.extending import register_jitable

    for inner in (_write_row, _mask_row):
        register_jitable(inner)
    dispatchers = [compiled(loop.function) for loop in LOOPS]
    warm(*dispatchers)
    for loop, dispatcher in zip(LOOPS, dispatchers):
        loop.dispatcher = dispatcher


def cached() -> bool:
    """Whether numba's disk cache holds every loop for this Python (its index files, beside this module or under
    ``NUMBA_CACHE_DIR``): loading them then compiles nothing (about half a second, mostly importing numba)."""
    source = Path(os.path.abspath(__file__))
    if os.environ.get("NUMBA_CACHE_DIR"):  # numba's _CacheLocator.get_suitable_cache_subpath
        digest = hashlib.sha1(str(source.parent).encode()).hexdigest()
        folder = Path(os.environ["NUMBA_CACHE_DIR"]) / f"{source.parent.name}_{digest}"
    else:
        folder = source.parent / "__pycache__"
    tag = f"py{sys.version_info.major}{sys.version_info.minor}"
    return all((folder / f"{source.stem}.{loop.function.__qualname__}-{loop.function.__code__.co_firstlineno}."
                         f"{tag}.nbi").exists() for loop in LOOPS)


def _load_noting_failure() -> None:
    try:
        _load_now()
    except BaseException as error:  # noqa: BLE001  raised in the process's own thread by load_soon()
        _FAILURES.append(error)


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


pad_spans, first_span_outside, repad_rows, write_mask, scale_normalize = (
    Loop(pad_spans), Loop(first_span_outside), Loop(repad_rows), Loop(write_mask), Loop(scale_normalize))

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
