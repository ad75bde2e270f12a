"""Per-row targets of classification and regression, stacked into one tensor with errors that name the row."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from collators.targets import check_finite


def _first_label_problem(plain: Sequence[Any]) -> tuple[int, str]:
    shape0 = None
    for index, value in enumerate(plain):
        try:
            shape = tuple(torch.as_tensor(value).shape)
        except (TypeError, ValueError, RuntimeError):
            return index, f"{type(value).__name__} {value!r:.60}"
        if shape0 is None:
            shape0 = shape
        elif shape != shape0:
            return index, f"shape {shape} while row 0 has shape {shape0}"
    return 0, "values that could not be stacked"


def collate_targets(values: Sequence[Any], key: str, *, dtype: torch.dtype, rows: Any = None) -> torch.Tensor:
    """Stack per-row targets (numbers, 0-d tensors, numpy scalars, or equal-length lists) into ``dtype``; float
    targets must be finite (``rows``, the batch, names the row at fault)."""
    plain = [value.tolist() if isinstance(value, (torch.Tensor, np.ndarray, np.generic)) else value
             for value in values]
    try:
        stacked = torch.tensor(plain)
    except (TypeError, ValueError, RuntimeError):
        stacked = None
    if stacked is None or stacked.dtype.is_complex:
        index, found = _first_label_problem(plain)
        raise ValueError(
            f"row {index}: {key!r} should be a number (or a list of numbers of the same length in every row), "
            f"but got {found}; check the target column, or name another one with target_field="
        )
    check_finite(stacked, key, rows)
    if dtype == torch.long and stacked.is_floating_point():
        fractional = (stacked != stacked.round()).reshape(len(values), -1).any(dim=1).nonzero()
        if len(fractional):
            index = int(fractional[0])
            raise ValueError(
                f"row {index}: classification labels under {key!r} should be integer class ids, but got "
                f"{values[index]!r:.60}; use task_type='regression' for real-valued targets"
            )
    return stacked.to(dtype)
