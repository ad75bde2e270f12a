"""Keys a collator does not interpret travel through to the batch under their own names: never dropped."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import default_collate


def collate_extra(values: Sequence[Any]) -> Any:
    """Collate a key the collator does not interpret: a tensor when the values stack, else a list (copied)."""
    first = values[0]
    if isinstance(first, (list, tuple)):
        try:
            stacked = torch.tensor(values)
            if not stacked.dtype.is_complex:
                return stacked
        except (TypeError, ValueError, RuntimeError):
            pass
        return [list(value) if isinstance(value, (list, tuple)) else value for value in values]
    try:
        return default_collate(list(values))
    except (TypeError, RuntimeError, ValueError):
        return [value.clone() if isinstance(value, torch.Tensor) else value for value in values]


def add_extra_keys(batch: dict[str, Any], rows: Sequence[Any], consumed: set[str]) -> dict[str, Any]:
    """Collate every key of dict ``rows`` that is neither in ``consumed`` nor already in ``batch``."""
    if not rows or not isinstance(rows[0], Mapping):
        return batch
    for key in rows[0]:
        if key in consumed or key in batch:
            continue
        values = []
        for index, row in enumerate(rows):
            if key not in row:
                raise ValueError(
                    f"row {index} has no {key!r}, which row 0 has; every row of a batch should carry the same keys"
                )
            values.append(row[key])
        batch[key] = collate_extra(values)
    return batch
