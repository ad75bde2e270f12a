"""Seeded train/val/test split indices, computed once from (data length, seed), with a fingerprint."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.core.rng import derive_seed, generator_from


@dataclass(frozen=True)
class SplitPlan:
    """Disjoint, complete index sets over a dataset of ``num_rows`` rows."""

    num_rows: int
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    fingerprint: str | dict[str, str]
    """Hash of the indices of every split: equal plans have equal fingerprints (a mixture's: one per source)."""


def split_size(split: float | int, num_rows: int, name: str) -> int:
    """Rows taken by a split given as a fraction in [0, 1) or a count."""
    if isinstance(split, bool) or not isinstance(split, (int, float)):
        raise TypeError(f"{name} should be a fraction in [0, 1) or a row count, but got {name}={split!r}")
    if isinstance(split, float):
        if not 0.0 <= split < 1.0:
            raise ValueError(
                f"{name}={split} is out of range: a fraction must be in [0, 1), or pass an int row count"
            )
        size = int(round(split * num_rows))
        if split > 0 and size == 0:
            raise ValueError(
                f"{name}={split} of {num_rows} rows leaves an empty split; use a larger fraction or a count"
            )
        return size
    if split < 0 or split >= num_rows:
        raise ValueError(f"{name}={split} rows is out of range for {num_rows} rows: it must be in [0, {num_rows})")
    return split


def plan_splits(num_rows: int, *, val_split: float | int = 0, test_split: float | int = 0, seed: int = 0,
                labels: np.ndarray | None = None) -> SplitPlan:
    """Shuffle ``range(num_rows)`` with ``seed`` and cut val, then test, off the front; train keeps the rest.

    With ``labels`` (one class per row) the cut is stratified, as ``datasets``' ``train_test_split(
    stratify_by_column=...)``: each split takes from every class its share of the split's rows (the remainders
    to the classes with the largest fractions, then the lowest class), the rows of a class in the seeded shuffle's
    order. Each split's indices are sorted, so evaluation reads rows in storage order.
    """
    n_val = split_size(val_split, num_rows, "val_split")
    n_test = split_size(test_split, num_rows, "test_split")
    if n_val + n_test >= num_rows:
        raise ValueError(
            f"val_split={val_split!r} and test_split={test_split!r} take {n_val + n_test} of {num_rows} rows, "
            f"leaving no training rows; use smaller splits"
        )
    if n_val or n_test:
        order = torch.randperm(num_rows, generator=generator_from(derive_seed(seed, "split"))).numpy()
    else:
        order = np.arange(num_rows)
    if labels is not None and (n_val or n_test):
        val, test, train = _stratified(order, np.asarray(labels), n_val, n_test)
    else:
        val, test, train = np.split(order, [n_val, n_val + n_test])
    train, val, test = (np.sort(part).astype(np.int64) for part in (train, val, test))
    digest = hashlib.blake2b(digest_size=12)
    for part in (train, val, test):
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part.tobytes())
    return SplitPlan(num_rows, train, val, test, digest.hexdigest())


def _stratified(order: np.ndarray, labels: np.ndarray, n_val: int, n_test: int) -> list[np.ndarray]:
    """``[val, test, train]`` of the shuffled ``order``: from each class, its first rows in ``order``."""
    classes = np.unique(labels[order], return_inverse=True)[1]
    counts = np.bincount(classes)
    val_counts = _apportion(counts, n_val)
    test_counts = _apportion(counts - val_counts, n_test)
    rank = np.empty(len(order), dtype=np.int64)  # each row's place among its class's rows, in the shuffled order
    by_class = np.argsort(classes, kind="stable")
    rank[by_class] = np.arange(len(order)) - np.repeat(np.cumsum(counts) - counts, counts)
    in_val = rank < val_counts[classes]
    in_test = ~in_val & (rank < (val_counts + test_counts)[classes])
    return [order[in_val], order[in_test], order[~in_val & ~in_test]]


def _apportion(counts: np.ndarray, total: int) -> np.ndarray:
    """``total`` rows shared among classes of ``counts`` rows in proportion (largest remainders)."""
    if not total:
        return np.zeros_like(counts)
    quotas = counts * total / counts.sum()
    shares = np.floor(quotas).astype(np.int64)
    extra = np.argsort(-(quotas - shares), kind="stable")[: total - int(shares.sum())]
    shares[extra] += 1
    return shares


def class_labels(source: Any, field: str) -> np.ndarray | None:
    """The integer class of every row of ``source`` under ``field``: the source's own labels where it knows them
    without reading rows (:meth:`~engine.sources.protocol.Source.labels`: an Arrow column), else each row fetched
    once; None where a row has no integer class there."""
    known = source.labels(field)
    if known is not None:
        return known
    values = np.empty(len(source), dtype=np.int64)
    for start in range(0, len(source), 1024):
        for offset, row in enumerate(source.__getitems__(list(range(start, min(start + 1024, len(source)))))):
            label = row.get(field) if isinstance(row, dict) else None
            if isinstance(label, torch.Tensor):
                label = label.item() if label.numel() == 1 and not label.is_floating_point() else None
            if isinstance(label, np.integer):
                label = int(label)
            if not isinstance(label, int) or isinstance(label, bool):
                return None
            values[start + offset] = label
    return values


def split_labels(source: Any, spec: Any) -> np.ndarray:
    """The class of every row of ``source`` for a stratified split (``stratify=True``), refused naming the field
    where a row has none."""
    labels = class_labels(source, spec.target_field)
    if labels is None:
        raise ValueError(f"stratify=True splits train_data by the class of each row, so {spec.target_field!r} should "
                         f"hold an integer class in every row, but got a row without one (a missing, float or "
                         f"sequence value); fill or convert that column (class_encode_column for strings), or pass "
                         f"stratify=False")
    return labels


def mixed_plan(plans: Mapping[str, SplitPlan]) -> SplitPlan:
    """The split plans of a mixture's sources ``{name: plan}`` as one, laid end to end in the order given. Its
    fingerprint is each source's, by name, so a checkpoint taken with another ``val_split`` or ``test_split`` is
    refused naming the source, while a source added or left out is the mixture's to accept (``on_change``)."""
    offsets = np.r_[0, np.cumsum([plan.num_rows for plan in plans.values()])].astype(np.int64)
    parts = [np.concatenate([getattr(plan, role) + offset for plan, offset in zip(plans.values(), offsets)])
             if plans else np.zeros(0, dtype=np.int64) for role in ("train", "val", "test")]
    return SplitPlan(int(offsets[-1]), *parts, {name: plan.fingerprint for name, plan in plans.items()})


def split_views(train: Any, plan: SplitPlan, *, val: bool, test: bool) -> dict[str, Any]:
    """The ``train`` source cut by ``plan`` into views (no copies): ``train``, and ``val``/``test`` when asked for."""
    views = {"train": train.view(plan.train) if val or test else train}
    views.update({role: train.view(rows) for role, rows, wanted in (("val", plan.val, val), ("test", plan.test, test))
                  if wanted})
    return views
