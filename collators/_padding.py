"""Padding shared by the collators: rows given whole are concatenated and written with one masked write per
key; rows given as spans of a buffer are written by compiled loops in one pass (:mod:`collators._kernels`).

A :class:`PaddingLayout` records where each row's kept elements land in a ``[batch, length]`` tensor. It is
computed once from the row lengths and reused for every per-token key of a batch (ids, masks, labels), so all
of them are truncated and padded identically.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from collators._kernels import NOT_WRITTEN, pad_spans, repad_rows, write_mask
from collators._layout_index import row_masks, span_index

PADDING_SIDES = ("right", "left")
PADDING_STRATEGIES = ("longest", "max_length")
_NUMPY_SAFE = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float32,
               torch.float64)


def padded_length(longest: int, *, max_length: int | None = None, pad_to_multiple_of: int | None = None,
                  padding: str = "longest", buckets: tuple[int, ...] | None = None) -> int:
    """Length a batch is padded to: the longest row, capped by ``max_length``, then ``max_length`` itself for
    ``padding='max_length'``, else the smallest of ``buckets`` that holds it (static shapes for torch.compile,
    CUDA graphs and XLA), else rounded up to a multiple of ``pad_to_multiple_of``.

    Example:
        >>> padded_length(70, max_length=512, buckets=(128, 256, 512)), padded_length(70, max_length=512,
        ...                                                                            padding="max_length")
        (128, 512)
    """
    length = min(longest, max_length) if max_length is not None else longest
    if padding == "max_length":
        length = max_length  # type: ignore[assignment]
    elif buckets:
        fitting = [bucket for bucket in buckets if bucket >= length]
        if not fitting:
            raise ValueError(f"a batch's longest row has {length} tokens, but the largest of pad_to_buckets={buckets} "
                             f"is {buckets[-1]}; add a bucket of at least {length}, or set max_length (the spec's "
                             f"max_seq_len) to the largest bucket so longer rows are truncated")
        length = fitting[0]
    if pad_to_multiple_of:
        length = -(-length // pad_to_multiple_of) * pad_to_multiple_of
    return length


def check_padding_side(padding_side: str) -> str:
    """Return ``padding_side`` if it is 'right' or 'left', else raise a ValueError that says so."""
    if padding_side not in PADDING_SIDES:
        raise ValueError(f"padding_side should be 'right' or 'left', but got padding_side={padding_side!r}")
    return padding_side


class PaddingLayout:
    """Positions of the kept elements of each row in a padded ``[batch, length]`` tensor.

    Rows longer than ``length`` are truncated at the end (their start is kept), whatever the padding side.

    Args:
        lengths: 1-D int tensor, the length of each row before truncation.
        length: width of the padded tensor.
        padding_side: 'right' puts padding after the row, 'left' before it.

    Example:
        >>> layout = PaddingLayout(torch.tensor([2, 3]), length=3, padding_side="left")
        >>> layout.fill(torch.tensor([1, 2, 3, 4, 5]), pad_value=0)
        tensor([[0, 1, 2],
                [3, 4, 5]])
    """

    def __init__(self, lengths: torch.Tensor | np.ndarray, *, length: int, padding_side: str = "right") -> None:
        check_padding_side(padding_side)
        self.length = int(length)
        self.padding_side = padding_side
        given = lengths.numpy() if isinstance(lengths, torch.Tensor) else np.asarray(lengths)
        self._given = given if given.dtype == np.int64 else given.astype(np.int64)
        self._kept = np.minimum(self._given, self.length)
        self.lengths = torch.from_numpy(self._kept)
        """Kept length of each row."""
        self._left = padding_side == "left"
        self._mask: np.ndarray | None = None
        self._mask_tensor: torch.Tensor | None = None
        self._padding: np.ndarray | None = None

    @property
    def mask(self) -> torch.Tensor:
        """Boolean ``[batch, length]``: True at real (kept) elements, False at padding (made on first use)."""
        if self._mask_tensor is None:
            self._mask_tensor = torch.from_numpy(self._mask_array())
        return self._mask_tensor

    def _mask_array(self) -> np.ndarray:
        if self._mask is None:
            self._mask = row_masks(self._kept, self.length, self.padding_side)
        return self._mask

    @property
    def padding(self) -> np.ndarray:
        """Boolean numpy ``[batch, length]``: True at padding (the negation of :attr:`mask`, computed once)."""
        if self._padding is None:
            self._padding = ~self._mask_array()
        return self._padding

    def repad(self, source: np.ndarray, pad_value: float | int, *, out: np.ndarray) -> np.ndarray:
        """``out`` = ``source`` (arrays of this layout) with every padded position set to ``pad_value``."""
        if _loop_writes(out) and source.dtype == np.int64 and _fits_int64(pad_value):
            repad_rows(source, self._kept, self._left, pad_value, out)
            return out
        np.copyto(out, source, casting="unsafe")
        out[self.padding] = pad_value
        return out

    def write_mask(self, out: torch.Tensor, target: np.ndarray | None = None) -> torch.Tensor:
        """``out`` (a ``[batch, length]`` tensor; ``target``, when given, is it as a numpy array) = this layout's
        mask: 1 (True) at kept elements, 0 at padding."""
        target = out.numpy() if target is None else target
        if _loop_writes(target):
            write_mask(self._kept, self._left, target)
        else:
            np.copyto(target, self._mask_array(), casting="unsafe")
        return out

    def _flat_keep(self) -> np.ndarray | None:
        """Which elements of the concatenated untruncated rows are kept (None: all of them)."""
        given = self._given
        if not len(given) or int(given.max()) <= self.length:
            return None
        starts = np.cumsum(given) - given  # position of every flat element inside its row, then the cut
        return (np.arange(int(given.sum()), dtype=np.int64) - np.repeat(starts, given)) < self.length

    def fill(self, flat: torch.Tensor | np.ndarray, pad_value: float | int, dtype: torch.dtype | None = None,
             *, out: torch.Tensor | None = None) -> torch.Tensor:
        """Scatter the concatenated rows ``flat`` (untruncated, in row order) into a new padded tensor.

        ``flat`` is a 1-D tensor or numpy array (read-only Arrow buffers are fine: it is only read). ``out``, a
        ``[batch, length]`` tensor, is written instead of a new one (and returned).
        """
        if out is not None:
            out.fill_(pad_value)
        else:
            if isinstance(flat, np.ndarray):
                dtype = dtype or torch.from_numpy(np.empty(0, dtype=flat.dtype)).dtype
            out = torch.full((len(self.lengths), self.length), pad_value, dtype=dtype or flat.dtype)
        keep = self._flat_keep()
        if keep is not None:
            flat = flat[keep if isinstance(flat, np.ndarray) else torch.from_numpy(keep)]
        if len(flat) == 0:
            return out
        if isinstance(flat, torch.Tensor) and not (flat.device.type == "cpu" and flat.dtype in _NUMPY_SAFE
                                                   and out.dtype in _NUMPY_SAFE and not flat.requires_grad):
            return out.masked_scatter_(self.mask, flat.to(out.dtype))  # fills True positions in row-major order
        if out.dtype not in _NUMPY_SAFE:
            return out.masked_scatter_(self.mask, torch.from_numpy(np.ascontiguousarray(flat)).to(out.dtype))
        # numpy's boolean-mask assignment fills True positions in row-major order too, about twice as fast.
        out.numpy()[self.mask.numpy()] = flat.numpy() if isinstance(flat, torch.Tensor) else flat
        return out

    def gather(self, values: np.ndarray, starts: np.ndarray, pad_value: float | int, dtype: torch.dtype | None = None,
               *, out: torch.Tensor | None = None, target: np.ndarray | None = None) -> torch.Tensor:
        """Write row ``i``'s kept elements, ``values[starts[i]:]`` (the row's length is this layout's), into a
        padded tensor: the same result as :meth:`fill` on the rows' concatenation, without concatenating them
        first, and without reading what truncation cuts.

        ``values`` is a 1-D numpy array (read-only Arrow buffers and zero-stride arrays are fine); ``out`` as for
        :meth:`fill`; ``target``, when given, is ``out`` as a numpy array (saves converting it). Integer or bool
        values into an int64 ``out`` take one compiled pass (:func:`collators._kernels.pad_spans`); other dtypes
        gather the kept elements, then :meth:`fill`.
        """
        if out is None:
            out = torch.empty((len(self._given), self.length), dtype=dtype or torch.from_numpy(values[:0]).dtype)
        if out.dtype == torch.int64 and values.dtype.kind in "iub" and _fits_int64(pad_value):
            target = out.numpy() if target is None else target
            if _loop_writes(target):
                self._pad_spans(values, starts, pad_value, target, NOT_WRITTEN, NOT_WRITTEN, 0)
                return out
        return self.fill(values[:0] if not len(values) else values[span_index(starts, self._given)[0]],
                         pad_value, dtype, out=out)

    def gather_tokens(self, values: np.ndarray, starts: np.ndarray, pad_value: int, out: np.ndarray, *,
                      mask: np.ndarray | None = None, labels: np.ndarray | None = None,
                      label_pad: int = 0) -> tuple[int, int]:
        """:meth:`gather` of integer or bool ``values`` into ``out`` (a writable int64 ``[batch, length]`` array)
        in one compiled pass, which also writes the attention mask into ``mask`` and causal-LM labels (``out``
        with ``label_pad`` at padding) into ``labels`` when they are given (arrays like ``out``).

        Returns the smallest and largest kept value (``(2**63 - 1, -2**63)`` when none is kept): what a range
        check needs, without a pass of its own.
        """
        extras = [array for array in (mask, labels) if array is not None]
        if values.dtype.kind not in "iub" or not all(_loop_writes(array) and array.shape == (len(self._kept),
                                                     self.length) for array in (out, *extras)):
            raise TypeError(f"gather_tokens needs integer or bool values and writable int64 outputs of shape "
                            f"{(len(self._kept), self.length)}, but got values of {values.dtype} and outputs "
                            f"{[(array.dtype, array.shape) for array in (out, *extras)]}")
        if not (_fits_int64(pad_value) and _fits_int64(label_pad)):
            raise ValueError(f"pad values should be int64 integers, but got pad_value={pad_value!r}, "
                             f"label_pad={label_pad!r}")
        return self._pad_spans(values, starts, pad_value, out, NOT_WRITTEN if mask is None else mask,
                               NOT_WRITTEN if labels is None else labels, label_pad)

    def _pad_spans(self, values: np.ndarray, starts: np.ndarray, pad_value: int, out: np.ndarray, mask: np.ndarray,
                   labels: np.ndarray, label_pad: int) -> tuple[int, int]:
        if len(starts) != len(self._kept):  # the loop reads starts[r] for every row, unchecked
            raise ValueError(f"starts should hold one start per row ({len(self._kept)}), but got {len(starts)}")
        outside, low, high = pad_spans(values, starts, self._kept, self._left, pad_value, out, mask, labels,
                                       label_pad)
        if outside >= 0:
            raise ValueError(f"row {outside}: its kept span starts={int(starts[outside])}, length "
                             f"{int(self._kept[outside])} should lie inside values (length {len(values)})")
        return low, high


def _loop_writes(array: np.ndarray) -> bool:
    """Whether the compiled loops write ``array``: a writable 2-D int64 array."""
    return array.dtype == np.int64 and array.ndim == 2 and array.flags.writeable


def _fits_int64(value: float | int) -> bool:
    """Whether ``value`` is an integer that int64 holds exactly (a pad value the loops write as is)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and -2**63 <= value < 2**63


def pad_sequences(
    sequences: Sequence[torch.Tensor],
    *,
    pad_value: float | int,
    padding_side: str = "right",
    length: int | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad 1-D tensors into a ``[batch, length]`` tensor; return it with the kept length of each row.

    Rows longer than ``length`` are truncated at the end. ``padding_side`` decides where padding goes.
    ``length=None`` pads to the longest row. The result never shares memory with ``sequences``.
    """
    check_padding_side(padding_side)
    lengths = torch.tensor([len(seq) for seq in sequences], dtype=torch.long)
    target = int(lengths.max()) if length is None and len(sequences) else (length or 0)
    dtype = dtype or (sequences[0].dtype if len(sequences) else torch.long)
    lengths = lengths.clamp(max=target)
    if not len(sequences) or target == 0:
        return torch.full((len(sequences), target), pad_value, dtype=dtype), lengths
    # Slicing before the concatenation copies only what is kept (long audio cut to a short window).
    flat = torch.cat([seq[:target] for seq in sequences])
    layout = PaddingLayout(lengths, length=target, padding_side=padding_side)
    return layout.fill(flat, pad_value, dtype), layout.lengths
