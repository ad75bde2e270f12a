"""The fallback collator: ``torch.utils.data.default_collate`` with dict-key checks and errors that say where.

Chosen when no spec is given or nothing is registered for a spec's modality. It delegates every collation to
``default_collate`` (or to ``collate`` with an extended ``collate_fn_map``) and only adds what default_collate
lacks: dict rows must all carry the same keys (default_collate silently drops keys missing from the first
row), and a failure names the row, the key and the fix instead of a bare ``RuntimeError`` from ``torch.stack``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate
from torch.utils.data._utils.collate import collate, default_collate_fn_map

from collators.targets import check_finite, describe_missing, missing_target, needs_targets, row_name
from task_spec import TaskSpec

_RAGGED_FIX = (
    "rows of different lengths need padding: pass a task_spec (e.g. TaskSpec.lm_tiny(), TaskSpec.audio_tiny()) "
    "so the registry chooses a padding collator, or pad/resize the rows in a dataset transform"
)


class DefaultCollator:
    """Collate rows like ``default_collate``, keeping every dict key and explaining failures.

    Bare tensors stack to ``[B, ...]``; tuples (as from ``TensorDataset``) give a list of stacked fields, so
    ``batch[0]`` works as with ``default_collate``; dict rows give a dict with every key; strings stay lists.

    Args:
        collate_fn_map: Extra ``{type: fn(batch, *, collate_fn_map)}`` entries merged over torch's
            ``default_collate_fn_map`` (the documented extension point); the functions must be module-level
            so the collator still pickles.
        target_field: Key of the target in dict rows; a float target must be finite. None: no key is a target.
        require_targets: A batch of the train, val or test split (the engine's batches say which, ``rows.role``) must
            carry ``target_field`` in every dict row; the registry's factory sets it for a supervised spec.

    Raises:
        ValueError: A dict row lacks a key other rows have, tensors under one key/position differ in shape, or a
            training, validation or test row lacks its target, or its float target is NaN or infinite.
        TypeError: Values of a type ``default_collate`` cannot batch (other than strings).

    Example:
        >>> batch = DefaultCollator()([{"x": torch.ones(2), "name": "a"}, {"x": torch.zeros(2), "name": "b"}])
        >>> batch["x"].shape, batch["name"]
        (torch.Size([2, 2]), ['a', 'b'])
    """

    def __init__(self, *, collate_fn_map: Mapping[type | tuple[type, ...], Callable[..., Any]] | None = None,
                 target_field: str | None = None, require_targets: bool = False) -> None:
        if require_targets and target_field is None:
            raise ValueError("require_targets=True needs the key of the target, but got target_field=None; pass "
                             "target_field=... or require_targets=False")
        self.collate_fn_map = dict(collate_fn_map) if collate_fn_map else None
        self._fn_map = {**default_collate_fn_map, **self.collate_fn_map} if self.collate_fn_map else None
        self.target_field, self.require_targets = target_field, bool(require_targets)

    def __call__(self, rows: Sequence[Any], generator: torch.Generator | None = None) -> Any:
        """Collate ``rows``; ``generator`` is accepted for the collator contract and unused (nothing is random)."""
        if len(rows) == 0:
            raise ValueError("DefaultCollator got an empty list of rows; a batch needs at least one row")
        if not all(isinstance(row, Mapping) for row in rows):
            return self._collate(list(rows), path=())
        _check_same_keys(rows)
        target = self.target_field
        if target is not None and needs_targets(rows, self.require_targets):
            labels = [row.get(target, MISSING) for row in rows]
            check_targets_present([MISSING if label is None else label for label in labels], rows, target, True)
        batch = {key: self._collate([row[key] for row in rows], path=(key,)) for key in rows[0]}
        if isinstance(batch.get(target), torch.Tensor):
            check_finite(batch[target], target, rows)
        return batch

    def _collate(self, values: list[Any], *, path: tuple[Any, ...]) -> Any:
        try:
            if self._fn_map is None:
                return default_collate(values)
            return collate(values, collate_fn_map=self._fn_map)
        except (RuntimeError, TypeError, KeyError) as error:
            raise _diagnose(values, path) from error

    def __repr__(self) -> str:
        shown = [f"collate_fn_map={self.collate_fn_map!r}"] if self.collate_fn_map else []
        if self.target_field is not None:
            shown.append(f"target_field={self.target_field!r}, require_targets={self.require_targets}")
        return f"DefaultCollator({', '.join(shown)})"


def create_default_collator(task_spec: TaskSpec | None = None, **kwargs: Any) -> DefaultCollator:
    """Factory for the registry: a :class:`DefaultCollator`; from a supervised spec, its ``target_field`` with
    ``require_targets=True`` (training, validation and test batches must carry their targets)."""
    if task_spec is not None and task_spec.is_supervised and task_spec.target_field is not None:
        kwargs.setdefault("target_field", task_spec.target_field)
        kwargs.setdefault("require_targets", True)
    return DefaultCollator(**kwargs)


MISSING: Any = object()
"""Marks a row without a label in the list given to :func:`collate_labels`."""


def collate_labels(labels: Sequence[Any], *, key: str, num_classes: int | None = None,
                   rows: Any = None) -> torch.Tensor:
    """Stack one scalar label per row: ints (and bools) to an int64 ``[B]`` tensor, floats to float32 ``[B]``.

    Shared by the vision and audio collators. Python numbers, numpy scalars and one-element tensors/arrays
    are accepted; rows without a label are marked :data:`MISSING` (call this only when some row has one).
    With ``num_classes``, int labels must lie in ``[0, num_classes)`` or be -100 (ignored by cross-entropy):
    one min/max per batch. Float labels must be finite (one check per batch). ``rows``, the batch, names a row by
    its split and index (:func:`collators.targets.row_name`).

    Raises:
        ValueError: Some rows lack a label, a label holds more than one value, is NaN or infinite, or lies outside
            the classes.
        TypeError: A label is not a number.
    """
    out = _plain_labels(labels)
    if out is not None:
        return _checked_labels(out, key, num_classes, rows)
    values: list[int | float] = []
    for index, label in enumerate(labels):
        if label is MISSING:
            other = next(i for i, found in enumerate(labels) if found is not MISSING)
            raise ValueError(
                f"{row_name(rows, index)} has no {key!r} but {row_name(rows, other)} has one; give every row a label, "
                f"or none (prediction: the batch then has no {key!r}), or pass target_field=None to ignore labels"
            )
        if isinstance(label, (torch.Tensor, np.ndarray)):
            if (label.size if isinstance(label, np.ndarray) else label.numel()) != 1:
                raise ValueError(
                    f"row {index}: {key!r} should be one class index or value, but got shape {tuple(label.shape)}; "
                    f"collate multi-value targets with the 'default' collator or a custom one"
                )
            label = label.item()
        elif isinstance(label, np.generic):
            label = label.item()
        if not isinstance(label, (int, float)):
            raise TypeError(
                f"row {index}: {key!r} should be an int class index or a float target, but got "
                f"{type(label).__name__}: {label!r}; map labels to numbers in a dataset transform"
            )
        values.append(label)
    dtype = torch.int64 if all(isinstance(value, int) for value in values) else torch.float32
    return _checked_labels(torch.tensor(values, dtype=dtype), key, num_classes, rows)


def _checked_labels(out: torch.Tensor, key: str, num_classes: int | None, rows: Any) -> torch.Tensor:
    if num_classes is not None and out.dtype == torch.int64:
        _check_classes(out, key, num_classes, rows)
    check_finite(out, key, rows)
    return out


def check_targets_present(labels: Sequence[Any], rows: Any, key: str, require_targets: bool) -> None:
    """Refuse a train, val or test batch (``rows.role``) some row of which lacks its label (:data:`MISSING` in
    ``labels``) when ``require_targets`` (a supervised task), naming the first such row."""
    if not needs_targets(rows, require_targets):
        return
    position = next((index for index, label in enumerate(labels) if label is MISSING), None)
    if position is not None:
        raise missing_target(row_name(rows, position), key, describe_missing(rows[position], key))


def _plain_labels(labels: Sequence[Any]) -> torch.Tensor | None:
    """The labels of the common cases in one call, as the per-label path gives them: Python ints (not bools), or
    0-d tensors of one real dtype (a column's values); None for anything else."""
    first = labels[0]
    if type(first) is int:
        return torch.tensor(labels, dtype=torch.int64) if all(type(label) is int for label in labels) else None
    if type(first) is not torch.Tensor or first.ndim != 0 or first.dtype.is_complex or first.dtype == torch.uint64:
        return None  # uint64 values past int64 must raise as in the per-label path, not wrap
    dtype = first.dtype
    if not all(type(label) is torch.Tensor and label.ndim == 0 and label.dtype == dtype for label in labels):
        return None
    return torch.stack(list(labels)).to(torch.float32 if dtype.is_floating_point else torch.int64)


def _check_classes(labels: torch.Tensor, key: str, num_classes: int, rows: Any = None, ignore: int = -100) -> None:
    low, high = (int(value) for value in torch.aminmax(labels))
    if low >= 0 and high < num_classes:
        return
    bad = ((labels < 0) & (labels != ignore)) | (labels >= num_classes)
    if not bad.any():
        return
    index = int(bad.nonzero()[0])
    raise ValueError(
        f"{row_name(rows, index)}: {key!r} should be a class index in [0, {num_classes}) (num_classes={num_classes}) "
        f"or {ignore} (ignored), but got {key}={int(labels[index])}; map labels to 0..{num_classes - 1} in a dataset "
        f"transform, pass the right num_classes=... (TaskSpec.additional_config['num_classes']), or, for "
        f"prediction, drop the labels (-1 often marks a missing label)"
    )


def _check_same_keys(rows: Sequence[Mapping[str, Any]]) -> None:
    first = rows[0]
    for index, row in enumerate(rows[1:], start=1):
        if row.keys() == first.keys():
            continue
        missing = [key for key in first if key not in row]
        if missing:
            raise ValueError(
                f"row {index} is missing key {missing[0]!r} that row 0 has (row {index} keys: {sorted(row)}); "
                f"every row needs the same keys: add it to every row or drop it in a dataset transform"
            )
        extra = next(key for key in row if key not in first)
        raise ValueError(
            f"row {index} has key {extra!r} that row 0 lacks (row 0 keys: {sorted(first)}); "
            f"every row needs the same keys: add it to every row or drop it in a dataset transform"
        )


def _shape(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return tuple(value.shape)
    return None


def _diagnose(values: list[Any], path: tuple[Any, ...]) -> Exception:
    """Find the first row at which ``values`` (one entry per row, all at ``path`` in it) cannot be batched."""
    where = " > ".join(f"key {part!r}" if isinstance(part, str) else f"position {part}" for part in path) or "rows"
    first = values[0]
    if _shape(first) is not None:
        for index, value in enumerate(values):
            if _shape(value) is None:
                return TypeError(
                    f"{where}: row 0 holds a {type(first).__name__} but row {index} holds "
                    f"{type(value).__name__}: {value!r}; give every row the same type"
                )
            if _shape(value) != _shape(first):
                return ValueError(
                    f"{where}: row {index} has shape {_shape(value)} but row 0 has shape {_shape(first)}; {_RAGGED_FIX}"
                )
    elif isinstance(first, Mapping):
        for index, value in enumerate(values):
            if not isinstance(value, Mapping) or value.keys() != first.keys():
                found = sorted(value) if isinstance(value, Mapping) else type(value).__name__
                return ValueError(
                    f"{where}: row {index} holds {found} but row 0 holds keys {sorted(first)}; "
                    f"every row needs the same keys"
                )
        for key in first:
            found = _diagnose([value[key] for value in values], (*path, key))
            if not isinstance(found, _Undiagnosed):
                return found
    elif isinstance(first, Sequence) and not isinstance(first, (str, bytes)):
        for index, value in enumerate(values):
            if not isinstance(value, Sequence) or len(value) != len(first):
                found = f"length {len(value)}" if isinstance(value, Sequence) else type(value).__name__
                return ValueError(f"{where}: row {index} has {found} but row 0 has length {len(first)}; {_RAGGED_FIX}")
        for position in range(len(first)):
            found = _diagnose([value[position] for value in values], (*path, position))
            if not isinstance(found, _Undiagnosed):
                return found
    else:
        for index, value in enumerate(values):
            if type(value) is not type(first) or not isinstance(value, (int, float, bool, complex, str, bytes)):
                return TypeError(
                    f"{where}: row {index} holds {type(value).__name__}: {value!r}, which default_collate cannot "
                    f"batch{f' with row 0 ({type(first).__name__})' if index else ''}; convert it to a number, "
                    f"string or tensor in a dataset transform, or pass collate_fn_map={{{type(value).__name__}: fn}}"
                )
    return _Undiagnosed(f"{where}: default_collate could not batch these values; see the error above")


class _Undiagnosed(TypeError):
    """Raised when no specific row explains the failure; the original error is chained as the cause."""
