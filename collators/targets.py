"""Targets a batch must carry, and how an error names the row at fault.

A batch without targets is a batch for prediction. That is right for prediction data, and silently wrong for the
training, validation and test data of a supervised task: the step's loss or metrics would see no labels. The
engine's batches say which split they serve and where their rows came from (``rows.role``, and ``rows.indices``,
the rows' indices in the data the user gave), so a collator that is told targets are required
(``require_targets``) refuses a training, validation or test batch without them, naming the row as the user knows
it. Rows without those attributes (a collator called on a plain list) are named by their position in the batch,
and may lack targets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

TARGET_ROLES = ("train", "val", "test")
"""The splits whose batches must carry the targets of a supervised task: their loss and metrics need them
(prediction is exempt)."""

NULL_HINT = "a NaN in a pandas or Arrow column is read as None"


def row_name(rows: Any, position: int) -> str:
    """The row at ``position`` of the batch ``rows`` as an error names it: ``'train row 13'`` (its split and its
    index in the data the user gave) when the batch carries them, else ``'row 2'`` (its position in the batch)."""
    indices = getattr(rows, "indices", None)
    if indices is None or position >= len(indices):
        return f"row {position}"
    return f"{getattr(rows, 'role', 'data')} row {int(indices[position])}"


def needs_targets(rows: Any, require_targets: bool) -> bool:
    """Whether the batch ``rows`` must carry targets: ``require_targets`` and it serves a split of
    :data:`TARGET_ROLES`."""
    return require_targets and getattr(rows, "role", None) in TARGET_ROLES


def missing_target(where: str, key: str, found: str) -> ValueError:
    """The error for the training, validation or test row ``where`` names (:func:`row_name`) without its target:
    ``found`` says what it holds instead (``'labels=None'``, or ``"no 'labels' (the row's keys: [...])"``)."""
    if found.endswith("=None"):
        found, fix = f"{found} ({NULL_HINT})", "fill or drop the rows without a target, or pass them as predict_data"
    else:
        fix = (f"a train_transform or eval_transform must return the target too (return {{**row, ...}}), or the "
               f"rows must carry {key!r} (or name their target field with TaskSpec.target_field)")
    return ValueError(f"{where}: {key!r} should be the row's target (every train, val and test "
                      f"row of a supervised task needs one), but got {found}; {fix}")


def describe_missing(row: Any, key: str) -> str:
    """What a row holds where its target should be: ``key=None``, or no ``key`` (with the row's keys)."""
    if isinstance(row, Mapping):
        if key in row:
            return f"{key}=None"
        return f"no {key!r} (the row's keys: {sorted(row)})"
    if isinstance(row, (tuple, list)) and len(row) == 2 and row[1] is None:
        return f"{key}=None"
    return f"no {key!r} (the row is a {type(row).__name__}, not (input, target))"


def check_finite(values: torch.Tensor, key: str, rows: Any) -> None:
    """Raise unless every value of the floating ``values`` (one row per first index) is finite: one check per
    batch, the culprit searched only when it fails."""
    if not values.is_floating_point() or bool(torch.isfinite(values).all()):
        return
    bad = ~torch.isfinite(values.reshape(len(values), -1)).all(dim=1)
    position = int(bad.nonzero()[0])
    row = values[position]
    value = float(row) if row.numel() == 1 else float(row.flatten()[~torch.isfinite(row.flatten())][0])
    raise non_finite_target(row_name(rows, position), key, value)


def non_finite_target(where: str, key: str, value: float) -> ValueError:
    """The error for a target that is NaN or infinite, at the row ``where`` names."""
    shown = "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return ValueError(f"{where}: {key!r} should be a finite number, but got {key}={shown}; a NaN or infinite "
                      f"target makes the loss NaN: fill or drop those rows (in the data, or in a dataset transform)")
