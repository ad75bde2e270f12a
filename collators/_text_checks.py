"""Per-batch value checks of a text batch, on the host: what would otherwise be a CUDA device-side assert.

An id at or above the vocabulary size, a negative id, or a class label outside ``[0, num_classes)`` indexes past
an embedding table or a loss's class dimension. On a GPU that surfaces as ``device-side assert triggered``, far
from its cause and fatal to the process. Each check here costs one min and one max over the batch's flat values
(vectorized, no per-token Python); only a failing batch pays for locating the first bad value, its row and its
position.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

VOCAB_FIX = ("ids index the model's embedding table: a negative id is often label padding (-100) that ended up "
             "among the inputs, an id past the table comes from another tokenizer; tokenize with the collator's "
             "tokenizer, or pass the right vocab_size=... (TaskSpec.additional_config['vocab_size'])")
CLASS_FIX = ("class labels are indices into the model's output classes: map them to 0..num_classes-1 in a dataset "
             "transform, pass the right num_classes=... (TaskSpec.additional_config['num_classes']), or, for "
             "prediction, drop the target column (-1 often marks a missing label, as in GLUE test splits)")


def _bounds(values: Any) -> tuple[int, int]:
    if isinstance(values, np.ndarray):
        return int(values.min()), int(values.max())
    low, high = torch.aminmax(values)
    return int(low), int(high)


def _bad_mask(values: Any, high: int | None, ignore: int | None) -> Any:
    bad = values < 0
    if ignore is not None:
        bad &= values != ignore
    if high is not None:
        bad |= values >= high
    return bad


def check_range(values: Any, key: str, *, high: int | None, limit: str = "", ignore: int | None = None,
                lengths: torch.Tensor | None = None, fix: str = VOCAB_FIX) -> None:
    """Raise unless every value of ``key`` is in ``[0, high)`` (``high=None``: only ``>= 0``) or equals ``ignore``.

    Args:
        values: 1-D int tensor or numpy array: one value per row, or the rows' tokens concatenated.
        key: the batch key, named in the error.
        high: exclusive upper bound; ``limit`` says where it comes from (``"len(tokenizer)"``, ...).
        ignore: a value that is always allowed (the label padding, -100).
        lengths: each row's length when ``values`` are concatenated tokens (locates the row and position).
        fix: the advice that ends the error.
    """
    if len(values) == 0:
        return
    low, top = _bounds(values)
    if low >= 0 and (high is None or top < high):
        return
    bad = _bad_mask(values, high, ignore)
    found = np.flatnonzero(bad) if isinstance(bad, np.ndarray) else bad.nonzero().flatten()
    if len(found) == 0:
        return  # only `ignore` was out of range
    position = int(found[0])
    value = int(values[position])
    where = f"row {position}"
    if lengths is not None:
        ends = torch.cumsum(lengths, 0)
        row = int(torch.searchsorted(ends, torch.tensor(position), right=True))
        where = f"row {row}, position {position - (int(ends[row - 1]) if row else 0)}"
    expected = f"in [0, {high})" if high is not None else ">= 0"
    source = f" ({limit}={high})" if high is not None and limit else ""
    allowed = f" or {ignore} (ignored)" if ignore is not None else ""
    raise ValueError(
        f"{where}: {key!r} should hold values {expected}{allowed}{source}, but got {key}={value} "
        f"(batch min {low}, max {top}); {fix}"
    )


def check_padded(padded: torch.Tensor | np.ndarray, layout: Any, key: str, *, high: int | None, limit: str = "",
                 ignore: int | None = None, fix: str = VOCAB_FIX,
                 value_range: tuple[int, int] | None = None) -> None:
    """:func:`check_range` on what reaches the model: the kept (real) elements of the padded ``[batch, length]``
    tensor of a :class:`collators._padding.PaddingLayout`. One min and one max settle the common case (over the
    whole tensor, or ``value_range``: the kept elements' min and max, as the compiled padding pass returns them);
    only a batch whose padding or values fall outside pays for selecting its real elements."""
    values = padded.numpy() if isinstance(padded, torch.Tensor) else padded
    # ufunc reductions: the same min and max as ndarray.min/max, without their Python wrappers
    if value_range is None and values.size:
        value_range = np.minimum.reduce(values, axis=None), np.maximum.reduce(values, axis=None)
    if value_range is None or value_range[0] >= 0 and (high is None or value_range[1] < high):
        return
    check_range(values[layout.mask.numpy()], key, high=high, limit=limit, ignore=ignore, lengths=layout.lengths,
                fix=fix)
