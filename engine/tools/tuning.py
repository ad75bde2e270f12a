"""Choose ``num_workers`` by measuring: load real batches with each candidate and keep the fastest.

Rules of thumb (75% of the cores, 4 per GPU) guess from the machine; the right number depends on what one row
costs to read and collate, which only the user's dataset and collator can tell. Each candidate gets a fresh
engine loader (``DataLoaderFactory``); worker start-up and the first ``warmup_batches`` are left out of the
timing, because persistent workers pay them once per run, not per batch.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from engine._checks import check_int
from engine.config import DataLoaderConfig
from engine.factory import DataLoaderFactory
from engine.tools.monitor import batch_counts


@dataclass(frozen=True)
class WorkerMeasurement:
    """Throughput of one worker count."""

    num_workers: int
    batches: int
    """Batches timed (after warm-up)."""
    samples: int
    seconds: float
    startup_s: float
    """Time to the first batch (worker start-up and first fetch); not part of the throughput."""

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class WorkerRecommendation:
    """The fastest measured worker count and the table it was chosen from."""

    num_workers: int
    """The candidate with the highest samples/s (the smaller count on a tie)."""
    table: dict[int, WorkerMeasurement]
    """Each candidate's measurement, in the order measured."""
    reason: str

    def __str__(self) -> str:
        rows = [f"  {m.num_workers:>3} workers: {m.samples_per_s:10.1f} samples/s  {m.batches_per_s:8.1f} batches/s  "
                f"(startup {m.startup_s:.2f}s, {m.batches} batches)" for m in self.table.values()]
        return "\n".join([f"num_workers={self.num_workers}: {self.reason}", *rows])


def _from_module(module: Any) -> tuple[Any, Any, DataLoaderConfig | None]:
    """Train data, collator and train config of a data module (its ``datasets['train']`` after setup)."""
    module.setup()
    datasets = getattr(module, "datasets", {}) or {}
    if "train" not in datasets:
        raise ValueError("recommend_num_workers measures the training data, but the data module has none; pass "
                         "train_data=... or give the dataset directly")
    return datasets["train"], getattr(module, "collator", None), getattr(module, "train_config", None)


def measure_workers(dataset: Any, config: DataLoaderConfig, *, max_batches: int, warmup_batches: int
                    ) -> WorkerMeasurement:
    """Time ``max_batches`` batches of a fresh loader built from ``config``, after ``warmup_batches``."""
    loader = DataLoaderFactory().create_dataloader(dataset, config)
    start = time.perf_counter()
    iterator = iter(loader)
    try:
        total = len(loader)
    except TypeError:
        total = None
    # A short epoch must still leave batches to time: warm up on at most all but one of them.
    warmup = max(1, min(warmup_batches, total - 1)) if total is not None and total > 1 else 1
    batches = samples = 0
    try:
        for _ in range(warmup):
            next(iterator, None)
        startup = time.perf_counter() - start
        timed_from = time.perf_counter()
        for batch in iterator:
            batches += 1
            samples += batch_counts(batch)[0]
            if batches >= max_batches:
                break
        seconds = time.perf_counter() - timed_from
    finally:
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
    return WorkerMeasurement(config.num_workers, batches, samples, seconds, startup)


def recommend_num_workers(
    dataset_or_module: Any,
    collate_fn: Any = None,
    candidates: tuple[int, ...] = (0, 1, 2, 4),
    *,
    batch_size: int | None = None,
    max_batches: int = 20,
    warmup_batches: int = 2,
    seed: int = 0,
) -> WorkerRecommendation:
    """Measure loading throughput for each worker count in ``candidates`` and return the fastest.

    Args:
        dataset_or_module: A dataset (anything the engine loads) or a data module, whose training split,
            collator and batch size are used.
        collate_fn: The collator to time (for a module, its own one unless given).
        candidates: Worker counts to try (distinct ints >= 0).
        batch_size: Rows per batch; None takes the module's, else 32.
        max_batches: Batches timed per candidate, after warm-up. More gives steadier numbers.
        warmup_batches: Batches fetched (worker start-up included) before timing starts.
        seed: Seed of the shuffled order used for the measurement.

    Returns:
        A :class:`WorkerRecommendation`: ``num_workers`` is the argmax of samples/s in ``table``.

    Example:
        >>> import torch
        >>> result = recommend_num_workers([torch.ones(4)] * 64, candidates=(0,), batch_size=8, max_batches=2)
        >>> result.num_workers, list(result.table)
        (0, [0])
    """
    if not candidates or any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in candidates):
        raise ValueError(f"candidates should be a non-empty tuple of ints >= 0, but got candidates={candidates!r}")
    if len(set(candidates)) != len(candidates):
        raise ValueError(f"candidates should be distinct, but got candidates={candidates!r}")
    check_int("max_batches", max_batches, minimum=1)
    children = getattr(dataset_or_module, "children", None)
    if children:  # several named datasets share the worker setting: the count the most demanding child needs
        results = {name: recommend_num_workers(child, collate_fn, candidates, batch_size=batch_size,
                                               max_batches=max_batches, warmup_batches=warmup_batches, seed=seed)
                   for name, child in children.items()}
        name, best = max(results.items(), key=lambda item: item[1].num_workers)
        others = ", ".join(f"{other}: {result.num_workers}" for other, result in results.items())
        return WorkerRecommendation(best.num_workers, best.table,
                                    f"the most any named dataset needs ({others}); {name}: {best.reason}")
    dataset, base = dataset_or_module, None
    if callable(getattr(dataset_or_module, "train_dataloader", None)):
        dataset, own_collate, base = _from_module(dataset_or_module)
        collate_fn = collate_fn if collate_fn is not None else own_collate
    size = batch_size if batch_size is not None else (base.batch_size if base is not None else 32)
    table: dict[int, WorkerMeasurement] = {}
    for workers in candidates:
        config = DataLoaderConfig(
            batch_size=size, num_workers=workers, shuffle=True, seed=seed, collate_fn=collate_fn,
            pin_memory=base.pin_memory if base is not None else None,
            prefetch_factor=(base.prefetch_factor if base is not None else None) or 2,
            persistent_workers=False if workers else None,
        )
        table[workers] = measure_workers(dataset, config, max_batches=max_batches, warmup_batches=warmup_batches)
    if not any(m.batches for m in table.values()):
        raise ValueError(f"the data gives too few batches of {size} rows to time after warm-up; pass a smaller "
                         f"batch_size or more rows")
    best = max(table.values(), key=lambda m: (m.samples_per_s, -m.num_workers))
    cores = os.cpu_count() or 1
    reason = (f"highest measured throughput ({best.samples_per_s:.1f} samples/s) of {len(table)} candidates on this "
              f"data and collator")
    if best.num_workers > cores:
        reason += f"; more workers than the {cores} CPU cores seen here"
    return WorkerRecommendation(best.num_workers, table, reason)
