"""The targets of a training, validation or test split, checked at setup where the data hold them as one column.

A supervised task's training, validation and test rows must each carry a finite target. Where the targets are a
column in memory (an Arrow table, or a dict of tensor, array or list columns), one vectorized pass over the split
finds a missing one (a null: pandas' NaN is stored as null in Arrow) or a NaN or infinite float, and setup names
the row. Other data are checked batch by batch by the collators (``require_targets``, :mod:`collators.targets`),
and so is a split with a transform, which may fill or change its targets.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from collators.targets import TARGET_ROLES, missing_target, non_finite_target
from engine.sources.rows import MapSource
from engine.sources.wrappers import HFSource, TorchSource
from task_spec import TaskSpec


def check_split_targets(source: MapSource, spec: TaskSpec | None, role: str, *, transformed: bool = False) -> None:
    """Refuse a train, val or test split of a supervised ``spec`` whose target column holds a null or a non-finite
    float, naming the first such row by its index in the data the user gave; data not held as columns pass unread,
    and so does a split with a transform (``transformed``): what it returns is checked in its batches."""
    if role not in TARGET_ROLES or spec is None or not spec.is_supervised or spec.target_field is None:
        return
    if transformed:
        return
    key = spec.target_field
    found = _first_bad(source, key)
    if found is None:
        return
    position, value = found
    where = f"{role} row {source.dataset_index(position)}"
    if value is None:
        raise missing_target(where, key, f"{key}=None")
    raise non_finite_target(where, key, value)


def _first_bad(source: MapSource, key: str) -> tuple[int, float | None] | None:
    """``(position, value)`` of the split's first target that is null (value None) or a non-finite float."""
    if isinstance(source, HFSource):
        return _first_bad_arrow(source, key)
    dataset = getattr(source, "dataset", None)
    if not isinstance(source, TorchSource) or not isinstance(dataset, torch.utils.data.StackDataset):
        return None
    columns = dataset.datasets
    if not isinstance(columns, dict) or key not in columns:
        return None
    return _first_bad_column(columns[key], source.positions)


def _first_bad_arrow(source: HFSource, key: str) -> tuple[int, float | None] | None:
    import pyarrow as pa
    import pyarrow.compute as pc

    if key not in source.column_names:
        return None
    whole = source.dataset.data.column(key)  # the table behind every split: no null there, none in this one
    floating = pa.types.is_floating(whole.type)
    if not whole.null_count and not floating:
        return None  # nothing to read: a list column of token ids is never gathered here
    column = source.dataset.select_columns([key]).with_format("arrow")[:].column(key)  # the split's rows, in order
    bad = column.is_null()
    if floating:
        bad = pc.or_(bad, pc.fill_null(pc.invert(pc.is_finite(column)), False))
    positions = np.flatnonzero(bad.to_numpy(zero_copy_only=False))
    if not len(positions):
        return None
    position = int(positions[0])
    return position, column[position].as_py()


def _first_bad_column(column: Any, positions: np.ndarray | None) -> tuple[int, float | None] | None:
    """The first null or non-finite target of a tensor, array or list column (rows ``positions`` of it);
    None too when the column is not numbers (strings, ragged lists): the collator checks those."""
    if isinstance(column, torch.Tensor):
        if not column.is_floating_point():
            return None
        values = column.detach().cpu().double().numpy()
    elif isinstance(column, np.ndarray) and column.dtype.kind in "iub":
        return None
    else:
        try:
            values = np.asarray(column, dtype=np.float64)  # None becomes NaN, told apart below
        except (TypeError, ValueError):
            return None
    if positions is not None:
        values = values[positions]
    if values.dtype.kind != "f" or not len(values):
        return None
    finite = np.isfinite(values.reshape(len(values), -1)).all(axis=1)
    if finite.all():
        return None
    position = int(np.flatnonzero(~finite)[0])
    index = position if positions is None else int(positions[position])
    original = column[index]
    if original is None:
        return position, None
    flat = np.asarray(values[position], dtype=np.float64).reshape(-1)
    return position, float(flat[~np.isfinite(flat)][0])
