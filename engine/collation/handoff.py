"""How a worker process hands a batch to the parent: ``WorkerCollate``, the collate function of worker processes.

torch sends each tensor of a batch by its own shared-memory block, and with the default ``file_descriptor``
strategy the parent fetches each block's descriptor from the worker in a socket round trip, on the step's path.
Here a small batch crosses as bytes through the queue's pipe (:class:`InlineBatch`) and a large one as one block
(:func:`one_buffer`); either way the parent gets the same tensors: dtypes, shapes, strides and values.
"""

from __future__ import annotations

import math
import warnings
import weakref
from typing import Any

import torch
from torch.utils.data import get_worker_info

from engine.collation.seeded_collate import SeededCollate
from engine.core.compat import new_shared_storage, result_pipe
from engine.core.skipped_rows import WithSkippedRows


class WorkerCollate(SeededCollate):
    """:class:`SeededCollate` for worker processes: a batch of plain tensors (a dict, list or tuple of them)
    crosses to the parent in one buffer, with the same dtypes, shapes, strides and values.

    torch hands each tensor over by its shared-memory block, whose descriptor the parent fetches from the worker in
    a socket round trip (``rebuild_storage_fd``, the default ``file_descriptor`` strategy): one per block, on the
    step's path, each waiting for the worker to be scheduled. A batch of at most :data:`INLINE_BYTES` goes through
    the queue's pipe as bytes instead (:class:`InlineBatch`: no round trip, two copies of a few hundred KB); a
    larger one is copied into one shared block (:func:`one_buffer`: one round trip). In the parent
    (``num_workers=0``, checks that call the collate function) it is :class:`SeededCollate` itself.
    """

    def __call__(self, rows: list[Any]) -> Any:
        if get_worker_info() is None:
            return super().__call__(rows)
        batch = super().__call__(rows)
        inner = batch.batch if type(batch) is WithSkippedRows else batch
        large = _tensor_bytes(inner) > INLINE_BYTES
        handed = batch.with_batch(hand_off(inner)) if type(batch) is WithSkippedRows else hand_off(inner)
        del batch, inner
        if large:  # a small batch leaves little free heap, and a trim costs up to a few ms
            release_free_heap()
        return handed


def release_free_heap() -> None:
    """Give the C heap's free pages back to the OS (glibc's ``malloc_trim(0)``), in a worker after each batch of
    more than :data:`INLINE_BYTES`.

    A batch's decoded images, resized copies and float pixels are allocated and freed by torch and the image
    decoders through the C allocator; glibc keeps freed blocks in the heap for reuse, and with blocks of many sizes
    the heap grows a batch's worth at a time without shrinking (a worker of image-text batches held over 200 MiB of
    free heap after 16 batches). Trimming keeps a worker's private memory at what one batch needs, for a few page
    faults per batch. Where the C library has no ``malloc_trim`` (musl, macOS), its allocator returns memory its
    own way and nothing is done."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


_TRIM: list[Any] = []
"""The C library's ``malloc_trim`` (or None where it has none), looked up once per process."""


def _malloc_trim() -> Any:
    if not _TRIM:
        import ctypes

        try:
            _TRIM.append(getattr(ctypes.CDLL(None), "malloc_trim", None))
        except OSError:  # no C library to load (Windows): nothing to trim
            _TRIM.append(None)
    return _TRIM[0]


INLINE_BYTES = 960 << 10
"""The largest batch (bytes of its tensors) that crosses from a worker as bytes through the queue's pipe: with
the pickle's few hundred bytes, it fits in a pipe of :data:`PIPE_BYTES`."""
PIPE_BYTES = 1 << 20
"""The size asked for the pipe from the workers to the parent (Linux's default ``/proc/sys/fs/pipe-max-size``)."""
_ALIGN = 64
"""Bytes each tensor's start is aligned to in the buffer (a cache line; enough for every dtype)."""


_WIDENED: weakref.WeakSet[Any] = weakref.WeakSet()
"""Iterators whose pipe was widened (or failed to be, with a warning): a persistent pass is not widened twice."""


def widen_result_pipe(iterator: Any) -> None:
    """Let the pipe from ``iterator``'s workers hold a whole inline batch (Linux ``F_SETPIPE_SZ``): a worker then
    writes its batch at once, instead of 64 KiB at a time, each waiting for the parent to read. Where the pipe
    cannot be widened (another system, a lower limit), batches still cross, in smaller pieces, with a warning."""
    pipe = result_pipe(iterator)
    if pipe is None or iterator in _WIDENED:
        return
    _WIDENED.add(iterator)
    try:
        import fcntl  # POSIX only: on Windows the import fails, and batches cross in smaller pieces

        fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, AttributeError, OSError) as error:  # no F_SETPIPE_SZ (not Linux), or above the limit
        warnings.warn(f"the pipe from the loader's workers could not be widened to {PIPE_BYTES} bytes ({error}); "
                      f"batches cross 64 KiB at a time, which costs the training step more", RuntimeWarning,
                      stacklevel=3)


def hand_off(batch: Any) -> Any:
    """What a worker sends for ``batch``: an :class:`InlineBatch` up to :data:`INLINE_BYTES`, else
    :func:`one_buffer`'s views; a batch of anything but plain tensors as it is."""
    tensors = _plain_tensors(batch)
    if tensors is None or _layout(tensors)[1] > INLINE_BYTES:
        return one_buffer(batch)
    return InlineBatch(batch, tensors)


class InlineBatch:
    """A worker's batch as one ``bytearray`` and its layout; unpickled in the parent, it is the batch again (views of
    that bytearray, made by :func:`rebuild_inline`), so nothing downstream sees this class."""

    def __init__(self, batch: Any, tensors: list[torch.Tensor]) -> None:
        offsets, total = _layout(tensors)
        buffer = bytearray(total)
        views = _views(buffer, tensors, offsets)
        for view, tensor in zip(views, tensors):
            view.copy_(tensor)
        keys = list(batch) if type(batch) is dict else None
        layout = [(offset, tensor.dtype, tuple(tensor.shape), tensor.stride()) for offset, tensor in
                  zip(offsets, tensors)]
        self._arguments = (type(batch), keys, buffer, layout)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return rebuild_inline, self._arguments


def rebuild_inline(kind: type, keys: list[Any] | None, buffer: bytearray,
                   layout: list[tuple[int, torch.dtype, tuple[int, ...], tuple[int, ...]]]) -> Any:
    """The batch an :class:`InlineBatch` carried: its tensors as views of ``buffer``, in a ``kind`` container."""
    base = _bytes_tensor(buffer)
    views = [_view(base, offset, dtype, shape, stride) for offset, dtype, shape, stride in layout]
    return dict(zip(keys, views)) if kind is dict else kind(views)


def one_buffer(batch: Any) -> Any:
    """``batch`` with its tensors as views of one shared-memory block, when it is a dict, list or tuple of two or
    more plain, dense, contiguous CPU tensors in more than one block; else ``batch`` unchanged (torch then shares
    each block alone)."""
    tensors = _plain_tensors(batch)
    if tensors is None or len(tensors) < 2:
        return batch
    if len({tensor.untyped_storage().data_ptr() for tensor in tensors}) == 1:
        return batch  # already one block (the text collators' views of one buffer): nothing to gain from a copy
    offsets, total = _layout(tensors)
    base = torch.empty(0, dtype=torch.uint8).set_(new_shared_storage(max(total, 1)))
    views = [_view(base, offset, tensor.dtype, tensor.shape, tensor.stride()).copy_(tensor)
             for offset, tensor in zip(offsets, tensors)]
    return dict(zip(batch, views)) if type(batch) is dict else type(batch)(views)


def _tensor_bytes(batch: Any) -> int:
    """Bytes of the tensors of a dict, list or tuple batch (its top level)."""
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    return sum(value.nbytes for value in values if isinstance(value, torch.Tensor))


def _plain_tensors(batch: Any) -> list[torch.Tensor] | None:
    """The tensors of a dict, list or tuple (exactly those types) of plain, dense, contiguous CPU tensors; else None."""
    if type(batch) is dict:
        tensors = list(batch.values())
    elif type(batch) in (list, tuple):
        tensors = list(batch)
    else:
        return None
    if not tensors or not all(_plain(tensor) for tensor in tensors):
        return None
    return tensors


def _plain(value: Any) -> bool:
    return (type(value) is torch.Tensor and value.device.type == "cpu" and value.layout == torch.strided
            and value.is_contiguous() and not value.requires_grad and not value.is_quantized
            and not value.is_conj() and not value.is_neg())


def _layout(tensors: list[torch.Tensor]) -> tuple[list[int], int]:
    """Each tensor's byte offset in one buffer (aligned to :data:`_ALIGN`), and the buffer's size."""
    offsets, total = [], 0
    for tensor in tensors:
        total = -(-total // _ALIGN) * _ALIGN
        offsets.append(total)
        total += tensor.numel() * tensor.element_size()
    return offsets, total


def _view(base: torch.Tensor, offset: int, dtype: torch.dtype, shape: Any, stride: Any) -> torch.Tensor:
    size = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    return base[offset:offset + size].view(dtype).as_strided(shape, stride)


def _bytes_tensor(buffer: bytearray) -> torch.Tensor:
    """A uint8 tensor over ``buffer`` (no copy); ``torch.frombuffer`` refuses an empty buffer."""
    return torch.frombuffer(buffer, dtype=torch.uint8) if buffer else torch.empty(0, dtype=torch.uint8)


def _views(buffer: bytearray, tensors: list[torch.Tensor], offsets: list[int]) -> list[torch.Tensor]:
    base = _bytes_tensor(buffer)
    return [_view(base, offset, tensor.dtype, tensor.shape, tensor.stride()) for offset, tensor in
            zip(offsets, tensors)]
