"""First-batch validation: check one real batch against the TaskSpec before training spends time on it.

The first batch is built the way the loader would build it (the loader's sampler, dataset fetch and collate
function), from a copy of the sampler and with the global random state restored afterwards, so validating
never advances the loader, its epoch or the global RNG: the training order is the same with or without it.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from engine.core.skipped_rows import WithSkippedRows
from engine.tools._batch_checks import CHECKS, Context
from task_spec import TaskSpec

PASSED, FAILED, SKIPPED = "ok", "failed", "skipped"


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check over the batch."""

    name: str
    """``keys``, ``dtypes``, ``shapes``, ``finite``, ``label_range`` or ``attention_mask``."""
    status: str
    """``ok``, ``failed`` or ``skipped`` (nothing to check against, e.g. no spec)."""
    problems: tuple[tuple[str, str], ...] = ()
    """``(key, what is wrong and the likely fix)`` for each problem found."""

    @property
    def passed(self) -> bool:
        return self.status != FAILED


@dataclass
class ValidationReport:
    """Per-check results for one batch, plus each key's shape and dtype; ``print(report)`` shows a table."""

    checks: list[CheckResult]
    """One result per check, in the order they ran."""
    summary: dict[str, str] = field(default_factory=dict)
    """``key -> "dtype [shape]"`` (or the type name of non-tensor values)."""
    spec_name: str | None = None
    """Name of the TaskSpec checked against, if any."""

    @property
    def passed(self) -> bool:
        """Whether no check failed."""
        return all(check.passed for check in self.checks)

    @property
    def problems(self) -> list[tuple[str, str]]:
        """Every ``(key, message)`` problem, most basic check first."""
        return [problem for check in self.checks for problem in check.problems]

    def __getitem__(self, name: str) -> CheckResult:
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(f"no check named {name!r}; the checks are {[c.name for c in self.checks]}")

    def __str__(self) -> str:
        against = f" against TaskSpec {self.spec_name!r}" if self.spec_name else ""
        lines = [f"first-batch validation{against}: {'passed' if self.passed else 'FAILED'}"]
        lines += [f"  {key:<24} {text}" for key, text in self.summary.items()]
        for check in self.checks:
            lines.append(f"  [{check.status:>7}] {check.name}")
            lines += [f"            {key}: {text}" for key, text in check.problems]
        return "\n".join(lines)


class BatchValidationError(ValueError):
    """A batch broke the spec; ``report`` holds every check, the message names each key, problem and fix."""

    def __init__(self, report: ValidationReport) -> None:
        self.report = report
        details = "\n".join(f"  - {text}" for _, text in report.problems)
        super().__init__(f"the first batch does not match the task:\n{details}")


def _as_mapping(batch: Any) -> dict[str, Any]:
    if isinstance(batch, Mapping):
        return dict(batch)
    if isinstance(batch, (list, tuple)):
        return {f"batch[{i}]": value for i, value in enumerate(batch)}
    return {"batch": batch}


def validate_batch(
    batch: Any, task_spec: TaskSpec | None = None, *, pad_token_id: int | None = None,
    label_pad_token_id: int = -100, raise_on_error: bool = True,
) -> ValidationReport:
    """Check one collated batch: required keys, dtypes, shapes, NaN/Inf, label range and attention masks.

    Args:
        batch: A dict of tensors (lists/tuples are checked as ``batch[i]``; key checks then fail under a spec).
        task_spec: The spec to check against; None runs only the spec-free checks.
        pad_token_id: Pad id for the padding checks; None uses ``task_spec.special_tokens['pad_token_id']``.
        label_pad_token_id: Label of ignored positions, left out of the label range check (as is -100).
        raise_on_error: Raise on a failed check; False returns the report with ``passed == False``.

    Raises:
        BatchValidationError: A check failed (and ``raise_on_error``).
    """
    if task_spec is not None and not isinstance(task_spec, TaskSpec):
        raise TypeError(f"task_spec should be a TaskSpec, but got {type(task_spec).__name__}: {task_spec!r}")
    if pad_token_id is None and task_spec is not None:
        pad_token_id = task_spec.special_tokens.get("pad_token_id")
    ctx = Context(task_spec, pad_token_id, frozenset({-100, label_pad_token_id}))
    entries = _as_mapping(batch)
    tensors = {key: value for key, value in entries.items() if isinstance(value, torch.Tensor)}
    results = []
    for name, check in CHECKS:
        problems = check(entries if name == "keys" else tensors, ctx)
        skipped = task_spec is None and name in ("keys", "label_range")
        status = FAILED if problems else SKIPPED if skipped else PASSED
        results.append(CheckResult(name, status, tuple(problems)))
    summary = {key: f"{value.dtype} {list(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
               for key, value in entries.items()}
    report = ValidationReport(results, summary, task_spec.name if task_spec is not None else None)
    if raise_on_error and not report.passed:
        raise BatchValidationError(report)
    return report


def validate_first_batch(
    loader_or_module: Any, task_spec: TaskSpec | None = None, *, pad_token_id: int | None = None,
    raise_on_error: bool = True,
) -> ValidationReport:
    """Build the loader's first batch without advancing it, and check it with :func:`validate_batch`.

    Args:
        loader_or_module: A ``DataLoader`` (torch or torchdata), or a data module: its ``train_dataloader()``
            is used, and its ``task_spec`` when none is given.
        task_spec: The spec to check against (overrides the module's).
        pad_token_id: Pad id; None takes the collator's ``pad_token_id``, then the module tokenizer's, then the
            spec's.
        raise_on_error: Raise :class:`BatchValidationError` on a failed check (else return the report).

    Returns:
        The :class:`ValidationReport`.

    Example:
        >>> import torch
        >>> from engine import UniversalDataModule
        >>> from task_spec import TaskSpec
        >>> dm = UniversalDataModule([torch.arange(3, 9)] * 8, task_spec=TaskSpec.lm_tiny(), batch_size=4)
        >>> validate_first_batch(dm).passed
        True
    """
    if getattr(loader_or_module, "children", None):  # several named datasets: each child against its own spec
        report = _merged({name: validate_first_batch(child, task_spec, pad_token_id=pad_token_id, raise_on_error=False)
                          for name, child in loader_or_module.children.items()})
        if raise_on_error and not report.passed:
            raise BatchValidationError(report)
        return report
    loader, module = loader_or_module, None
    if not isinstance(loader, DataLoader) and callable(getattr(loader, "train_dataloader", None)):
        module, loader = loader, loader.train_dataloader()
        task_spec = task_spec if task_spec is not None else getattr(module, "task_spec", None)
    if not isinstance(loader, DataLoader):
        raise TypeError(f"validate_first_batch takes a DataLoader or a data module with train_dataloader(), but got "
                        f"{type(loader_or_module).__name__}")
    collate = getattr(loader.collate_fn, "collate_fn", loader.collate_fn)  # the engine wraps it in SeededCollate
    if pad_token_id is None:
        pad_token_id = getattr(collate, "pad_token_id", None)
    if pad_token_id is None and module is not None:
        pad_token_id = getattr(getattr(module, "tokenizer", None), "pad_token_id", None)
    label_pad = getattr(collate, "label_pad_token_id", -100)
    batch = first_batch(loader)
    return validate_batch(batch, task_spec, pad_token_id=pad_token_id, label_pad_token_id=label_pad,
                          raise_on_error=raise_on_error)


def _merged(reports: dict[str, ValidationReport]) -> ValidationReport:
    """One report of several named children's: checks named ``child/check``, keys ``child.key``."""
    checks = [CheckResult(f"{name}/{check.name}", check.status,
                          tuple((f"{name}.{key}", f"{name}: {text}") for key, text in check.problems))
              for name, report in reports.items() for check in report.checks]
    summary = {f"{name}.{key}": value for name, report in reports.items() for key, value in report.summary.items()}
    specs = [f"{name}={report.spec_name}" for name, report in reports.items() if report.spec_name is not None]
    return ValidationReport(checks, summary, ", ".join(specs) or None)


def first_batch(loader: DataLoader) -> Any:
    """The batch ``loader`` would yield first, built in this process from a copy of its sampler.

    The loader, its sampler (epoch, resume position) and the global ``torch``/``random``/``numpy`` RNGs are
    left as they were. Worker-only setup (``worker_init_fn``) does not run. An ``IterableDataset`` is read
    through a fresh ``iter(dataset)``, which for a one-shot stream (a generator) does consume it.
    """
    dataset = loader.dataset
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            if isinstance(dataset, IterableDataset):
                rows = list(islice(iter(dataset), loader.batch_size or 1))
                if not rows:
                    raise ValueError("the loader's IterableDataset yielded no rows; there is no batch to validate")
                return loader.collate_fn(rows if loader.batch_size is not None else rows[0])
            # The memo keeps the dataset itself out of the copy (torch's RandomSampler holds it).
            memo = {id(dataset): dataset}
            sampler = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
            try:
                indices = next(iter(copy.deepcopy(sampler, memo)))
            except StopIteration:
                raise ValueError(f"the loader's sampler yields no batches (dataset of {len(dataset)} rows); there "
                                 f"is no batch to validate") from None
            if loader.batch_sampler is None:
                return loader.collate_fn(dataset[indices])
            getitems = getattr(dataset, "__getitems__", None)
            rows = getitems(indices) if getitems is not None else [dataset[i] for i in indices]
            batch = loader.collate_fn(rows)
            return batch.batch if isinstance(batch, WithSkippedRows) else batch  # rows left out by on_error
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
